// "pyramidkv" (docs/ALGORITHMS.md §8.5, kvpress PyramidKVPress): SnapKV scores, but lower layers keep more
// entries than higher ones. Layer l keeps the same count per head, pyramid_layer_budget() over the judged
// layers; the ratio scope does not apply.
#include <cmath>

#include "model/model.h"
#include "press/baselines.h"

namespace kvzap {

int64_t pyramid_layer_budget(int64_t T, double ratio, int layer, int n_layer, int window, int beta) {
  // Python's round() rounds halves to even, as nearbyint does in the default rounding mode.
  const double fallback = std::nearbyint((double)T * (1.0 - ratio));
  const double cap = (double)window + (double)T * (1.0 - ratio);
  double min_num = (cap - window) / beta;
  double max_num = (cap - window) * 2 - min_num;
  if (max_num >= (double)(T - window)) {
    max_num = (double)(T - window);
    min_num = (cap - window) * 2 - max_num;
  }
  if (!((double)T >= max_num && max_num >= min_num && min_num >= window) || n_layer < 2) return (int64_t)fallback;
  const double steps = (max_num - min_num) / (n_layer - 1);
  return (int64_t)std::nearbyint(max_num - layer * steps);
}

namespace {

class PyramidKvScorer : public SnapKvScorer, public BudgetSplit {
 public:
  PyramidKvScorer(const ModelConfig& c, int window, int kernel, int beta) : SnapKvScorer(c, window, kernel), beta_(beta) {}
  std::string budget_name() const override { return "pyramid"; }
  void mark_evictions(const KvCache& cache, const CacheScores& scores, double ratio, EvictionMask& drop) override {
    // The pyramid spans the judged (global) layers only: on a model with sliding-window layers (which a
    // context scorer leaves alone) the budgets still average to the ratio over the layers it prunes.
    const int H = cache.n_head_kv();
    int n_judged = 0;
    for (int l = 0; l < cache.n_layer(); l++) n_judged += judged_layer(cache, l);
    for (int l = 0, rank = 0; l < cache.n_layer(); l++) {
      if (!judged_layer(cache, l)) continue;
      for (int h = 0; h < H; h++) {
        const int64_t T = cache.length(l, h);
        const int64_t keep = pyramid_layer_budget(T, ratio, rank, n_judged, window_, beta_);
        mark_lowest_in_stream(scores[(size_t)l][(size_t)h], T - keep, drop[(size_t)l * H + h]);
      }
      rank++;
    }
  }

 private:
  int beta_;
};

}  // namespace

std::unique_ptr<Scorer> make_pyramidkv_scorer(const ModelConfig& c, int window, int kernel, int beta) {
  return std::make_unique<PyramidKvScorer>(c, window, kernel, beta);
}

namespace {
RegisterScorer reg({"pyramidkv",
                    "PyramidKV: SnapKV scores with per-layer budgets decreasing linearly with depth (beta 20), "
                    "same count per head (its own budget: the ratio scope does not apply)",
                    false,
                    [](const PressSpec& o, const Model& m) {
                      return make_pyramidkv_scorer(m.config(), (int)press_param(o, "window_size"),
                                                   (int)press_param(o, "kernel_size"), (int)press_param(o, "beta"));
                    },
                    {.min_context_tokens = kSnapKvWindow,
                     .min_context_param = "window_size",
                     .params = {{"window_size", kSnapKvWindow, 1, 4096, true, "SnapKV's voting queries"},
                                {"kernel_size", 5, 1, 63, true, "SnapKV's pooling width, odd"},
                                {"beta", 20, 1, 1000, true, "the pyramid's steepness: the top layer keeps 1/beta of the share"}},
                     .kvpress_parity = "exact (kvpress PyramidKVPress)"}});
}  // namespace

}  // namespace kvzap
