// The scorer registry and make_press: checks the press options, builds the scorer and wraps it in
// its policy. Scorers register themselves (one static RegisterScorer line in their own file).
#include <algorithm>
#include <cmath>
#include <cstdio>

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

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

std::unique_ptr<Press> make_press(const PressOptions& options, const Model& model) {
  PressOptions opt = options;
  // KVzap without a setting: the threshold calibrated for its surrogate (kvzap.json beside it).
  if (!opt.has_threshold && !opt.has_ratio && (opt.name == "kvzap-linear" || opt.name == "kvzap-mlp")) {
    const std::string dir = kvzap_surrogate_dir(opt, model, opt.name == "kvzap-mlp" ? "mlp" : "linear");
    if (const std::optional<double> t = default_kvzap_threshold(dir)) {
      opt.has_threshold = true;
      opt.threshold = *t;
    }
  }
  const auto& reg = scorer_registry();
  auto find = [&](const std::string& name) {
    return std::find_if(reg.begin(), reg.end(), [&](const ScorerEntry& e) { return e.name == name; });
  };
  auto it = find(opt.name);
  // "adakv_<press>": any registered press under the AdaKV budget (press/scorer_adakv.cpp).
  const std::string ada_prefix = "adakv_";
  bool wrap_adakv = false;
  if (it == reg.end() && opt.name.rfind(ada_prefix, 0) == 0) {
    it = find(opt.name.substr(ada_prefix.size()));
    wrap_adakv = it != reg.end();
  }
  if (it == reg.end())
    throw Error("unknown press '" + opt.name + "' (known presses: " + known_presses() + "; adakv_<press> for AdaKV)");
  const ScorerEntry& entry = *it;
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

  std::unique_ptr<Scorer> scorer = entry.make(opt, model);
  if (entry.supports_threshold && !scorer->per_step())
    throw Error("internal: press '" + opt.name + "' supports a threshold but is not a per-step scorer");
  if (opt.has_threshold) return make_threshold_press(std::move(scorer), opt);
  if (wrap_adakv) {
    const auto* split = dynamic_cast<BudgetSplit*>(scorer.get());
    if (split && split->budget_name() != "adakv")
      throw Error("press '" + entry.name + "' splits its budget itself and cannot be wrapped in AdaKV");
    if (!split) scorer = make_adakv_scorer(std::move(scorer));  // an AdaKV press stays as it is
  }
  return make_ratio_press(std::move(scorer), opt);
}

}  // namespace kvzap
