// "prefill_decoding_<a>+<b>" (kvpress PrefillDecodingPress(prefilling_press, decoding_press); docs/ALGORITHMS.md
// §8.35): press <a> (any press make_press builds for a context, with the spec's ratio or threshold) judges the
// context; press <b>, a decoding_<press> or compression_ratio_decoding_<press>, judges the question and the
// generated tokens. kvpress's hook sends a prefilling step to the first and every later step to the second.
//
// The decoding press scores each entry once, when its token goes through a layer, so it watches the context
// too (it records; it evicts nothing there) and, on its next step, realigns its streams on what <a> kept. The
// kept set after the context is then <a>'s alone, and each later compression is <b>'s over what <a> kept.
//
// Name: <a> ends at the last '+' followed by a decoding name, so <a> may itself hold a '+' (kvzip+,
// composed_snapkv+knorm with the spec's ratios).
#include "kvzap/error.h"
#include "model/model.h"
#include "press/policy.h"
#include "press/prefill_decoding.h"

namespace kvzap {
namespace {

class PrefillDecodingPress : public Press {
 public:
  PrefillDecodingPress(std::string name, std::unique_ptr<Press> prefill, std::unique_ptr<Press> decoding)
      : name_(std::move(name)), prefill_(std::move(prefill)), decoding_(std::move(decoding)) {}

  std::string name() const override {
    return name_ + " (prefill: " + prefill_->name() + "; decoding: " + decoding_->name() + ")";
  }
  void begin_context(ContextRunner& runner) override {
    in_context_ = true;
    decoding_->keep_scores(keep_scores_);
    prefill_->begin_context(runner);
    decoding_->begin_context(runner);
  }
  // The prefill press evicts; the decoding press starts counting its steps (its streams realign on its next one).
  void end_context(ContextView& ctx) override {
    prefill_->end_context(ctx);
    decoding_->end_context(ctx);
    in_context_ = false;
    show_scores();
  }
  bool prunes_decoding() const override { return true; }
  int64_t context_eviction_interval() const override { return in_context_ ? prefill_->context_eviction_interval() : 0; }

  void after_attention(const LayerStep& step, KvCache& cache) override {
    decoding_->keep_scores(keep_scores_);
    // The read-out goes to the press that asked for it (h_readout_dim); the other finds none and reads h.
    const Reader r = reader(step.layer);
    LayerStep plain = step;
    plain.h_readout = nullptr;
    // The decoding press records the step's scores before the prefill press may evict any of its entries.
    decoding_->after_attention(r == Reader::Decoding ? step : plain, cache);
    if (in_context_) prefill_->after_attention(r == Reader::Prefill ? step : plain, cache);
    if (step.layer == cache.n_layer() - 1) show_scores();
  }

  // Offered only when exactly one side asks: two read-outs side by side would need a scratch row per thread
  // here, and a scorer given none computes the same values from h.
  int h_readout_dim(int layer) const override {
    switch (reader(layer)) {
      case Reader::Prefill: return prefill_->h_readout_dim(layer);
      case Reader::Decoding: return decoding_->h_readout_dim(layer);
      default: return 0;
    }
  }
  void h_readout(int layer, const float* h, int64_t n, float* out) const override {
    if (reader(layer) == Reader::Prefill) prefill_->h_readout(layer, h, n, out);
    else decoding_->h_readout(layer, h, n, out);
  }

  std::unique_ptr<Press> clone() const override {
    auto copy = std::make_unique<PrefillDecodingPress>(name_, prefill_->clone(), decoding_->clone());
    copy->in_context_ = in_context_;
    copy->copy_score_log(*this);
    return copy;
  }

 private:
  // The score log shown (Press::score_log) is the decoding press's: every entry's score, the context's included
  // (those its compressions judge by). Copied once a step has gone through every layer, only when kept.
  void show_scores() {
    if (keep_scores_) copy_score_log(*decoding_);
  }

  enum class Reader { None, Prefill, Decoding };
  Reader reader(int layer) const {
    const bool a = in_context_ && prefill_->h_readout_dim(layer) > 0, b = decoding_->h_readout_dim(layer) > 0;
    return a == b ? Reader::None : a ? Reader::Prefill : Reader::Decoding;
  }

  std::string name_;
  std::unique_ptr<Press> prefill_, decoding_;
  bool in_context_ = false;
};

std::string with_name(const std::string& name, const std::string& side, const Error& e) {
  return "press '" + name + "': its " + side + " press: " + e.what();
}

}  // namespace

std::unique_ptr<Press> make_prefill_decoding_press(const PressSpec& spec, const Model& model) {
  const std::string& name = spec.name;
  const std::string rest = name.substr(std::string(kPrefillDecodingPrefix).size());
  const auto [a, b] = prefill_decoding_parts(name);
  if (rest.find('+') == std::string::npos)
    throw Error("press '" + name + "' names two presses: prefill_decoding_<prefill press>+<decoding press>, e.g. "
                "prefill_decoding_snapkv+decoding_knorm");
  if (b.empty())
    throw Error("press '" + name + "': '" + rest.substr(rest.rfind('+') + 1) + "' is not a decoding press (after the "
                "'+' comes decoding_<press> or compression_ratio_decoding_<press>, e.g. prefill_decoding_snapkv+decoding_knorm)");
  if (a.empty())
    throw Error("press '" + name + "': the prefill press before '+" + b + "' is missing (e.g. prefill_decoding_snapkv+" + b + ")");
  if (!decoding_inner(a).empty() || a.rfind(kPrefillDecodingPrefix, 0) == 0)
    throw Error("press '" + name + "': the prefill press '" + a + "' is a decoding press; kvpress's prefilling_press "
                "judges the context (e.g. snapkv, knorm with a ratio, kvzap-mlp)");
  if (spec.decoding)
    throw Error("press '" + name + "' prunes while decoding by its decoding press '" + b + "': leave `decoding` unset");
  // The ratio, threshold and prefill options are the prefill press's; each side gets the parameters it declares.
  auto own_params = [&](const std::string& side) {
    std::map<std::string, double> out;
    for (const PressParam& p : press_traits(side).params)
      if (auto it = spec.params.find(p.name); it != spec.params.end()) out[p.name] = it->second;
    return out;
  };
  PressSpec sa = spec;
  sa.name = a;
  sa.params = own_params(a);
  PressSpec sb;
  sb.name = b;
  sb.sliding_layers = spec.sliding_layers;
  sb.surrogate_dir = spec.surrogate_dir;
  sb.seed = spec.seed;
  sb.params = own_params(b);
  std::unique_ptr<Press> prefill, decoding;
  try {
    prefill = make_press(sa, model);
  } catch (const Error& e) {
    throw Error(with_name(name, "prefill", e));
  }
  try {
    decoding = make_press(sb, model);
  } catch (const Error& e) {
    throw Error(with_name(name, "decoding", e));
  }
  return std::make_unique<PrefillDecodingPress>(name, std::move(prefill), std::move(decoding));
}

}  // namespace kvzap
