// ComposedPress (kvpress; docs/ALGORITHMS.md §8, issue 38): presses applied one after the other, each
// compressing what the previous kept, each with its own ratio (PressSpec::ratios, one per stage). Named
// "composed_<a>+<b>[+...]" (the registry's name family, registry.cpp). Every stage is a ratio press of its
// own; once the context is prefilled they judge it in order, and each stage's evictions free pages before
// the next one scores, so the kept count is the product kvpress states: int(int(T (1 - r_a)) (1 - r_b)).
//
// Which presses may be later stages: kvpress hands a later stage the earlier stage's kept keys in
// torch.topk's order (best first), not in position order, so only a press whose score of a key does not
// depend on where the key sits among the others means the same thing there (KnormPress; SnapKV's window
// or StreamingLLM's sink would be read off the wrong keys). kvzap takes those: the per-step scorers,
// whose scores it records while the context is prefilled and reads back for the entries still kept.
#include "kvzap/error.h"
#include "model/model.h"
#include "press/policy.h"

namespace kvzap {
namespace {

class ComposedPress : public Press {
 public:
  ComposedPress(std::string name, std::vector<std::unique_ptr<Press>> stages)
      : name_(std::move(name)), stages_(std::move(stages)) {}

  std::string name() const override {
    std::string s;
    for (const auto& st : stages_) s += (s.empty() ? "" : " then ") + st->name();
    return name_ + " (" + s + ")";
  }
  void begin_context(ContextRunner& runner) override {
    for (auto& st : stages_) st->begin_context(runner);
  }
  // In order: each stage scores (or reads back its recorded scores for) the entries the previous ones kept.
  void end_context(ContextView& ctx) override {
    for (auto& st : stages_) st->end_context(ctx);
  }
  bool prunes_decoding() const override { return false; }
  void after_attention(const LayerStep& step, KvCache& cache) override {
    for (auto& st : stages_) st->after_attention(step, cache);
  }
  std::unique_ptr<Press> clone() const override {
    std::vector<std::unique_ptr<Press>> copies;
    for (const auto& st : stages_) copies.push_back(st->clone());
    auto copy = std::make_unique<ComposedPress>(name_, std::move(copies));
    copy->copy_score_log(*this);
    return copy;
  }

 private:
  std::string name_;
  std::vector<std::unique_ptr<Press>> stages_;
};

}  // namespace

std::unique_ptr<Press> make_composed_press(const PressSpec& spec, const std::vector<std::string>& stage_names,
                                           const Model& model) {
  const std::string& name = spec.name;
  if (stage_names.size() < 2)
    throw Error("press '" + name + "' composes at least two presses: composed_<a>+<b>[+...]");
  if (spec.has_threshold || spec.has_ratio)
    throw Error("press '" + name + "' takes one ratio per stage (ratios / --press-ratios), not a " +
                (spec.has_threshold ? "threshold" : "single ratio"));
  if (spec.ratios.size() != stage_names.size())
    throw Error("press '" + name + "' needs one ratio per stage: " + std::to_string(stage_names.size()) + " presses, " +
                std::to_string(spec.ratios.size()) + " ratio" + (spec.ratios.size() == 1 ? "" : "s") + " given");
  check_ratio_list(spec.ratios, "ratios");
  if (spec.decoding) throw Error("press '" + name + "' compresses the context only: it cannot prune while decoding");
  if (spec.prefill_evict_every > 0)
    throw Error("press '" + name + "' judges the whole context once it is complete: prefill_evict_every does not apply");
  std::vector<std::unique_ptr<Press>> stages;
  for (size_t i = 0; i < stage_names.size(); i++) {
    const std::string& s = stage_names[i];
    const ScorerEntry* e = nullptr;
    for (const ScorerEntry& r : scorer_registry())
      if (r.name == s) e = &r;
    if (!e) throw Error("press '" + name + "': stage " + std::to_string(i) + " '" + s + "' is not a registered press");
    // kvpress refuses AdaKVPress and KVzipPress in a ComposedPress; a stage's ratio is a ScorerPress's.
    if (e->traits.own_budget || e->traits.kvpress_ratio_scope != "head")
      throw Error("press '" + name + "': stage '" + s + "' does not take a per-head ratio (kvpress's ComposedPress "
                  "composes ScorerPresses; AdaKV and KVzip are refused there)");
    PressSpec st;
    st.name = s;
    st.has_ratio = true;
    st.ratio = spec.ratios[i];
    st.ratio_scope = "head";
    st.sliding_layers = spec.sliding_layers;
    st.seed = spec.seed;
    st.surrogate_dir = spec.surrogate_dir;
    // The spec's parameters go to every stage that declares them.
    for (const auto& [k, v] : spec.params)
      for (const PressParam& p : e->traits.params)
        if (p.name == k) st.params[k] = v;
    const Model* m = &model;
    ScorerFactory make_scorer = [make = e->make, st, m]() { return make(st, *m); };
    std::unique_ptr<Scorer> probe = make_scorer();
    if (dynamic_cast<const BudgetSplit*>(probe.get()))
      throw Error("press '" + name + "': stage '" + s + "' splits its budget itself, which a composed stage cannot");
    if (i > 0 && !probe->per_step())
      throw Error("press '" + name + "': stage '" + s + "' scores the context as a whole (its window or positions), "
                  "which kvpress's later stages see reordered; a later stage must score each entry alone (e.g. knorm)");
    stages.push_back(make_ratio_press(make_scorer, st));
  }
  return std::make_unique<ComposedPress>(name, std::move(stages));
}

}  // namespace kvzap
