// AdaKV (docs/ALGORITHMS.md §7, §8.14, kvpress AdaKVPress) around any press: per layer the heads share one
// budget and the lowest scores go wherever they are, but each head keeps at least 20% of its uniform
// share (RatioScope::AdaKv, press/policy.h). Registered as "adakv_snapkv" and "adakv_compactor"
// (kvpress leaderboard names); make_press also accepts "adakv_<press>" for any registered press, and
// --ratio-scope adakv does the same for a plain press name.
#include "kvzap/error.h"
#include "model/model.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

class AdaKvScorer : public WrappedBudgetScorer {
 public:
  AdaKvScorer(std::unique_ptr<Scorer> inner, double alpha)
      : WrappedBudgetScorer(std::move(inner)), alpha_(alpha) {}

  std::string budget_name() const override { return "adakv"; }
  void mark_evictions(const KvCache& cache, const CacheScores& scores, double ratio, EvictionMask& drop) override {
    mark_lowest(cache, scores, ratio, RatioScope::AdaKv, drop, false, alpha_);
  }

 private:
  double alpha_;  // kvpress alpha_safeguard
};

}  // namespace

std::unique_ptr<Scorer> make_adakv_scorer(std::unique_ptr<Scorer> inner, double alpha_safeguard) {
  if (dynamic_cast<BudgetSplit*>(inner.get())) throw Error("AdaKV cannot wrap a press that splits its budget itself");
  if (!(alpha_safeguard >= 0 && alpha_safeguard <= 1))
    throw Error("AdaKV's alpha_safeguard must be in [0, 1], got " + std::to_string(alpha_safeguard));
  return std::make_unique<AdaKvScorer>(std::move(inner), alpha_safeguard);
}

PressParam adakv_alpha_safeguard_param() {
  return {"alpha_safeguard", kAdaKvSafeguard, 0, 1, false, "the share of its uniform budget each head keeps at least"};
}

namespace {
std::vector<PressParam> with_alpha_safeguard(std::vector<PressParam> params) {
  params.push_back(adakv_alpha_safeguard_param());
  return params;
}

RegisterScorer reg_snapkv({"adakv_snapkv",
                           "AdaKV(SnapKV): per-layer budget shared by the heads, each keeps >= 20% of its share "
                           "(also adakv_<any press>, or --ratio-scope adakv)",
                           false,
                           [](const PressSpec& o, const Model& m) {
                             return make_adakv_scorer(std::make_unique<SnapKvScorer>(m.config(), (int)press_param(o, "window_size"),
                                                                                     (int)press_param(o, "kernel_size")),
                                                      press_param(o, "alpha_safeguard"));
                           },
                           {.min_context_tokens = kSnapKvWindow,
                            .min_context_param = "window_size",
                            .params = {{"window_size", kSnapKvWindow, 1, 4096, true, "the last queries that vote"},
                                       {"kernel_size", 5, 1, 63, true, "the pooling width of the votes, odd"},
                                       adakv_alpha_safeguard_param()},
                            .kvpress_parity = "exact (kvpress AdaKVPress(SnapKVPress))"}});
RegisterScorer reg_compactor({"adakv_compactor", "AdaKV(Compactor), the kvpress leaderboard's Compactor entry", false,
                              [](const PressSpec& o, const Model& m) {
                                return make_adakv_scorer(make_compactor_scorer(m.config(), compactor_blending(o), o.seed,
                                                                               compactor_options(o)),
                                                         press_param(o, "alpha_safeguard"));
                              },
                              {.params = with_alpha_safeguard(compactor_params()),
                               .kvpress_parity = "cannot match exactly: kvpress draws its Gaussian sketch unseeded (Jaccard ~0.9)"}});
}  // namespace

}  // namespace kvzap
