// The scorer registry and make_press: checks the press options, builds the scorer and wraps it in
// its policy. Scorers register themselves (one static RegisterScorer line in their own file).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>

#include "kvzap/error.h"
#include "press/baselines.h"
#include "press/kvzip.h"
#include "press/policy.h"

namespace kvzap {

std::vector<ScorerEntry>& scorer_registry() {
  static std::vector<ScorerEntry> registry;
  return registry;
}

namespace {

std::string known_presses() {
  std::vector<std::string> names;
  for (const ScorerEntry& e : scorer_registry()) names.push_back(e.name);
  std::sort(names.begin(), names.end());
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// What docs/PARITY.md measured for dms_<press> (tests/python/check_kvpress_parity.py): the threshold is
// exact wherever the press's scores are (no ties to break, unlike a ratio).
std::string dms_parity(const ScorerEntry& e) {
  if (e.traits.own_budget) return "";
  for (const char* measured : {"knorm", "keydiff", "snapkv", "tova"})
    if (e.name == measured) return "exact (kvpress DMSPress(" + e.name + "))";
  return "not compared: as the press's own scores (kvpress DMSPress; docs/PARITY.md)";
}

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

bool is_dms_name(const std::string& name) {
  if (name.rfind(kDmsPrefix, 0) != 0) return false;
  const auto& reg = scorer_registry();
  return std::none_of(reg.begin(), reg.end(), [&](const ScorerEntry& e) { return e.name == name; });
}

const ScorerEntry* find_press_entry(const std::string& name) {
  const auto& reg = scorer_registry();
  auto find = [&](const std::string& n) -> const ScorerEntry* {
    auto it = std::find_if(reg.begin(), reg.end(), [&](const ScorerEntry& e) { return e.name == n; });
    return it == reg.end() ? nullptr : &*it;
  };
  if (const ScorerEntry* e = find(name)) return e;
  if (is_dms_name(name)) return find(name.substr(std::string(kDmsPrefix).size()));
  const std::string ada_prefix = "adakv_";
  if (name.rfind(ada_prefix, 0) == 0) return find(name.substr(ada_prefix.size()));
  return nullptr;
}

const PressTraits& press_traits(const std::string& name) {
  static const PressTraits defaults;
  const ScorerEntry* e = find_press_entry(name);
  if (!e) return defaults;
  if (e->name == name) return e->traits;
  static std::mutex mu;
  static std::map<std::string, PressTraits> wrapped;  // node-based: references stay valid
  std::lock_guard<std::mutex> lock(mu);
  if (is_dms_name(name)) {
    // "dms_<press>": the press's parameters, run by threshold (kvpress DMSPress takes no ratio); a context
    // scorer is judged once its context is prefilled.
    auto [it, fresh] = wrapped.try_emplace(name, e->traits);
    if (fresh) {
      it->second.threshold_by_default = true;
      it->second.threshold_on_context = !e->supports_threshold;
      it->second.kvpress_parity = dms_parity(*e);
    }
    return it->second;
  }
  // "adakv_<press>" wrapping a registered press: its traits and AdaKV's alpha_safeguard, unless the
  // press is an AdaKV press already (it declares the parameter itself).
  for (const PressParam& p : e->traits.params)
    if (p.name == "alpha_safeguard") return e->traits;
  auto [it, fresh] = wrapped.try_emplace(e->name, e->traits);
  if (fresh) it->second.params.push_back(adakv_alpha_safeguard_param());
  return it->second;
}

double press_param(const PressSpec& spec, const std::string& name) {
  if (auto it = spec.params.find(name); it != spec.params.end()) return it->second;
  for (const PressParam& p : press_traits(spec.name).params)
    if (p.name == name) return p.default_value;
  throw Error("internal: press '" + spec.name + "' declares no parameter '" + name + "'");
}

int64_t press_min_context(const PressSpec& spec) {
  const PressTraits& t = press_traits(spec.name);
  return t.min_context_param.empty() ? t.min_context_tokens : (int64_t)press_param(spec, t.min_context_param);
}

namespace {

// "dms_<press>" (kvpress DMSPress(press, threshold, sliding_window_size, decoding)): the press's raw scores
// against a threshold, the most recent `window` tokens protected. A per-token scorer runs under the threshold
// policy as it is (it is DMSPress, decoding included); a context scorer is judged once its context is
// prefilled (kvpress scores the one-pass prefill), by the ratio policy's protocol with a threshold split.
std::unique_ptr<Press> make_dms_press(const ScorerEntry& entry, PressSpec opt, const Model& model) {
  if (entry.traits.own_budget)
    throw Error("press '" + entry.name + "' sets its own budget and cannot be wrapped in DMS (" + opt.name + ")");
  if (opt.has_ratio)
    throw Error("press '" + opt.name + "' evicts by threshold (kvpress DMSPress) and takes no ratio: give it a threshold");
  if (!opt.has_threshold && entry.traits.default_threshold) {
    if (const std::optional<double> t = entry.traits.default_threshold(opt, model)) {
      opt.has_threshold = true;
      opt.threshold = *t;
    }
  }
  if (!opt.has_threshold)
    throw Error("press '" + opt.name + "' needs a threshold (kvpress DMSPress(press, threshold=...)): entries of the "
                "press scoring below it are evicted");
  if (std::isnan(opt.threshold)) throw Error("the threshold must be a number");
  if (opt.window < 0) throw Error("the window must be >= 0, got " + std::to_string(opt.window));
  if (entry.supports_threshold) {
    std::unique_ptr<Scorer> scorer = entry.make(opt, model);
    if (!scorer->per_step()) throw Error("internal: press '" + entry.name + "' supports a threshold but is not a per-step scorer");
    return make_threshold_press(std::move(scorer), opt);
  }
  if (opt.decoding)
    throw Error("press '" + opt.name + "' scores the whole context at once: it cannot prune while decoding (decoding "
                "needs a per-token press, e.g. dms_knorm)");
  if (opt.prefill_evict_every > 0)
    throw Error("press '" + opt.name + "' judges the whole context once it is complete: prefill_evict_every does not apply");
  const Model* m = &model;
  ScorerFactory make_scorer = [make = entry.make, opt, m]() {
    return make_dms_context_scorer(make(opt, *m), opt.threshold, opt.window, opt.sink_tokens);
  };
  return make_ratio_press(make_scorer, opt);
}

}  // namespace

std::unique_ptr<Press> make_press(const PressSpec& options, const Model& model) {
  PressSpec opt = options;
  // "adakv_<press>": any registered press under the AdaKV budget (press/scorer_adakv.cpp).
  const ScorerEntry* found = find_press_entry(opt.name);
  if (!found) {
    if (const KvpressGap* gap = find_kvpress_gap(opt.name))
      throw Error("press '" + opt.name + "': kvpress's " + gap->kvpress_class + " is not in kvzap: " + gap->reason);
    throw Error("unknown press '" + opt.name + "' (known presses: " + known_presses() + "; adakv_<press> for AdaKV, dms_<press> for DMS)");
  }
  const ScorerEntry& entry = *found;
  if (is_dms_name(opt.name)) return make_dms_press(entry, opt, model);
  const bool wrap_adakv = entry.name != opt.name;
  // No setting given: the press's default threshold, if the registry gives it one (KVzap: calibrated).
  if (!opt.has_threshold && !opt.has_ratio && entry.traits.default_threshold && !wrap_adakv) {
    if (const std::optional<double> t = entry.traits.default_threshold(opt, model)) {
      opt.has_threshold = true;
      opt.threshold = *t;
    }
  }
  if (entry.traits.own_budget) {
    // It chooses what to evict itself (e.g. SimLayerKV's lazy layers): a ratio or threshold would mean nothing.
    if (wrap_adakv) throw Error("press '" + entry.name + "' sets its own budget and cannot be wrapped in AdaKV");
    if (opt.has_ratio || opt.has_threshold)
      throw Error("press '" + opt.name + "' sets its own budget (see `kvzap presses`) and takes no " +
                  (opt.has_ratio ? "ratio" : "threshold") + ": leave it out");
    if (opt.decoding) throw Error("press '" + opt.name + "' compresses the context only: it cannot prune while decoding");
    if (opt.prefill_evict_every > 0)
      throw Error("press '" + opt.name + "' judges the whole context once it is complete: prefill_evict_every does not apply");
    parse_ratio_scope(opt.ratio_scope);
    std::unique_ptr<Scorer> probe = entry.make(opt, model);
    const auto* split = dynamic_cast<const BudgetSplit*>(probe.get());
    if (!split || split->uses_ratio() || probe->per_step())
      throw Error("internal: press '" + opt.name + "' declares its own budget but its scorer does not choose it");
    const Model* m = &model;
    return make_ratio_press([make = entry.make, opt, m]() { return make(opt, *m); }, opt);
  }
  if (wrap_adakv && opt.has_threshold)
    throw Error("press '" + opt.name + "' is an AdaKV ratio budget and cannot use a threshold; give it a ratio");

  if (opt.has_threshold == opt.has_ratio)
    throw Error("press '" + opt.name + "' needs exactly one of a threshold or a ratio");
  if (opt.has_threshold) {
    if (!entry.supports_threshold)
      throw Error("press '" + opt.name + "' scores the whole context at once and cannot use a threshold; give it a ratio");
    if (std::isnan(opt.threshold)) throw Error("the threshold must be a number");
    if (opt.window < 0) throw Error("the window must be >= 0, got " + std::to_string(opt.window));
  } else {
    if (!(opt.ratio >= 0 && opt.ratio < 1)) throw Error("the ratio must be in [0, 1), got " + number(opt.ratio));
    parse_ratio_scope(opt.ratio_scope);
    // Decoding-time pruning is the threshold policy's; a ratio press only compresses the context.
    if (opt.decoding) throw Error("pruning while decoding needs a threshold press, not a ratio");
    if (opt.prefill_evict_every > 0)
      throw Error("evicting while prefilling needs a threshold press: with a ratio, press '" + opt.name +
                  "' judges the whole context once it is complete");
  }

  if (opt.has_threshold) {
    std::unique_ptr<Scorer> scorer = entry.make(opt, model);
    if (!scorer->per_step()) throw Error("internal: press '" + opt.name + "' supports a threshold but is not a per-step scorer");
    return make_threshold_press(std::move(scorer), opt);
  }
  // The ratio policy keeps the recipe, so that a copy of the press (a fork) gets a fresh scorer.
  const Model* m = &model;
  ScorerFactory make_scorer = [make = entry.make, opt, m, wrap_adakv, name = entry.name]() {
    std::unique_ptr<Scorer> scorer = make(opt, *m);
    if (wrap_adakv) {
      const auto* split = dynamic_cast<BudgetSplit*>(scorer.get());
      if (split && split->budget_name() != "adakv")
        throw Error("press '" + name + "' splits its budget itself and cannot be wrapped in AdaKV");
      // An AdaKV press stays as it is (it read alpha_safeguard itself).
      if (!split) scorer = make_adakv_scorer(std::move(scorer), press_param(opt, "alpha_safeguard"));
    }
    return scorer;
  };
  return make_ratio_press(make_scorer, opt);
}

}  // namespace kvzap
