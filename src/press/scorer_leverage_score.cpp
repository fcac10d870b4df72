// "leverage_score" (docs/ALGORITHMS.md §8.19, kvpress LeverageScorePress, arXiv 2507.08143): the
// query-agnostic half of Compactor (press/scorer_compactor.cpp) on its own. Per (layer, KV head): the
// pre-RoPE keys (cached keys with RoPE undone) of the whole context, centred over the sequence, through
// a right Gaussian sketch to 48 dims; score_i = x_i^T (X^T X + jitter I)^-1 x_i by Cholesky
// (sketched_leverage), clamped at 0; then z-scored over the layer (all its KV heads together, as kvpress
// takes mean and std over the layer's whole score tensor). No entry is protected.
//
// Difference from kvpress: the sketch is drawn from PressSpec::seed (gaussian_sketch) instead of torch's
// unseeded generator, so kept sets agree with kvpress only as far as two sketches agree.
#include <algorithm>
#include <vector>

#include "model/model.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

class LeverageScoreScorer : public CacheContextScorer {
 public:
  LeverageScoreScorer(const ModelConfig& c, uint64_t seed, int sketch) : rope_(c), seed_(seed), sketch_(sketch) {}

  void score_cache(const KvCache& cache, CacheScores& out) override {
    const int64_t T = require_full_context(cache, "leverage_score");
    size_scores(cache, out);
    const int L = cache.n_layer(), Hkv = cache.n_head_kv(), D = cache.head_dim();
    rope_.reserve(T);  // before the parallel part: unrotate only reads the tables
    parallel_for((int64_t)L * Hkv, [&](int64_t task, int) {
      const int l = (int)(task / Hkv), h = (int)(task % Hkv);
      if (!judged_layer(cache, l)) return;
      std::vector<float> keys;  // [T][D], slot = position (the context is whole)
      stream_keys(cache, l, h, keys);
      for (int64_t i = 0; i < T; i++) rope_.unrotate(keys.data() + (size_t)i * D, (int32_t)i, l);
      const std::vector<double> phi = gaussian_sketch(seed_, l, h, D, sketch_);  // [D][48]
      sketched_leverage(keys.data(), T, D, phi.data(), sketch_, out[(size_t)l][(size_t)h].data());
    });
    // z-score over the layer: the streams of one layer are contiguous only per head, so gather them.
    std::vector<float> layer;  // [Hkv][T]
    for (int l = 0; l < L; l++) {
      if (!judged_layer(cache, l)) continue;
      layer.resize((size_t)Hkv * T);
      for (int h = 0; h < Hkv; h++) std::copy(out[(size_t)l][(size_t)h].begin(), out[(size_t)l][(size_t)h].end(), layer.begin() + (size_t)h * T);
      zscore_inplace(layer.data(), (int64_t)layer.size());
      for (int h = 0; h < Hkv; h++)
        std::copy(layer.begin() + (size_t)h * T, layer.begin() + (size_t)(h + 1) * T, out[(size_t)l][(size_t)h].begin());
    }
  }

 private:
  RopeTable rope_;
  uint64_t seed_;
  int sketch_;  // kvpress sketch_dimension
};

}  // namespace

// For the unit test (tests/unit/press/test_baseline_presses.cpp), which has no Model.
std::unique_ptr<Scorer> make_leverage_score_scorer(const ModelConfig& c, uint64_t seed, int sketch_dimension) {
  return std::make_unique<LeverageScoreScorer>(c, seed, sketch_dimension);
}

namespace {
RegisterScorer reg({"leverage_score",
                    "LeverageScore: sketched leverage of the pre-RoPE keys (centred, Gaussian sketch to 48 dims), "
                    "z-scored over the layer (keeps geometric outliers)",
                    false, [](const PressSpec& o, const Model& m) {
                      return make_leverage_score_scorer(m.config(), o.seed, (int)press_param(o, "sketch_dimension"));
                    },
                    {.params = {{"sketch_dimension", 48, 1, 1024, true, "the Gaussian sketch's width"}},
                     .kvpress_parity = "cannot match exactly: kvpress draws its Gaussian sketch unseeded (Jaccard 0.998 where "
                                       "head_dim <= 48, the differences in ties)"}});
}  // namespace

}  // namespace kvzap
