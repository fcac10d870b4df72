// PerLayerCompressionPress (kvpress; docs/ALGORITHMS.md §8.31) around a press: the press's scores,
// but layer l keeps kvpress_n_kept(ratios[l], T) entries of each head, as kvpress's ScorerPress does when
// PerLayerCompressionPress sets its compression_ratio to ratios[l] for that layer's hook. Unlike kvpress
// (whose layers just hold tensors of different lengths), the evicted pages are freed. Not registered
// itself: make_press builds it for the name family "per_layer_<press>" (registry.cpp).
#include "kvzap/error.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

class PerLayerScorer : public WrappedBudgetScorer {
 public:
  PerLayerScorer(std::unique_ptr<Scorer> inner, std::vector<double> ratios)
      : WrappedBudgetScorer(std::move(inner)), ratios_(std::move(ratios)) {}

  int h_readout_dim(int layer) const override { return inner_->h_readout_dim(layer); }
  void h_readout(int layer, const float* h, int64_t n, float* out) const override { inner_->h_readout(layer, h, n, out); }

  std::string budget_name() const override { return "per-layer ratios"; }
  // `ratio` (their mean, kvpress's compression_ratio property) is only shown: each layer takes its own.
  void mark_evictions(const KvCache& cache, const CacheScores& scores, double ratio, EvictionMask& drop) override {
    (void)ratio;
    const int L = cache.n_layer(), H = cache.n_head_kv();
    if ((int)ratios_.size() != L)
      throw Error("internal: " + std::to_string(ratios_.size()) + " per-layer ratios for a cache of " + std::to_string(L) + " layers");
    for (int l = 0; l < L; l++) {
      // kvpress's ScorerPress leaves a layer of ratio 0 as it is.
      if (!(ratios_[(size_t)l] > 0)) continue;
      for (int h = 0; h < H; h++) {
        const std::vector<float>& s = scores[(size_t)l][(size_t)h];
        const int64_t T = (int64_t)s.size();
        mark_lowest_in_stream(s, T - kvpress_n_kept(ratios_[(size_t)l], T), drop[(size_t)l * H + h]);
      }
    }
  }

 private:
  std::vector<double> ratios_;  // [n_layer]
};

}  // namespace

std::unique_ptr<Scorer> make_per_layer_scorer(std::unique_ptr<Scorer> inner, std::vector<double> ratios) {
  // kvpress asserts a ScorerPress: one that splits its budget itself (PyramidKV, ChunkKV, AdaKV) has no
  // single per-head ratio to replace.
  if (dynamic_cast<BudgetSplit*>(inner.get()))
    throw Error("per-layer ratios cannot wrap a press that splits its budget itself");
  check_ratio_list(ratios, "ratios");
  return std::make_unique<PerLayerScorer>(std::move(inner), std::move(ratios));
}

}  // namespace kvzap
