// "knorm" (docs/ALGORITHMS.md §8.2, kvpress KnormPress): score = -||k||, so low-norm keys are kept. The
// norm is taken on the step's keys after RoPE, exactly what the cache stores (before its f16 rounding).
#include <cmath>

#include "press/press.h"

namespace kvzap {
namespace {

class KnormScorer : public Scorer {
 public:
  bool per_step() const override { return true; }
  void score_step(const LayerStep& step, const KvCache& cache, float* out) override {
    const int H = cache.n_head_kv(), D = cache.head_dim();
    for (int64_t t = 0; t < step.n_tok; t++)
      for (int h = 0; h < H; h++) {
        const float* k = step.k + ((size_t)t * H + h) * D;  // [n_tok][H][D]
        double sq = 0;
        for (int d = 0; d < D; d++) sq += (double)k[d] * k[d];
        out[(size_t)h * step.n_tok + t] = -(float)std::sqrt(sq);
      }
  }
};

RegisterScorer reg({"knorm", "negative L2 norm of each key (keeps low-norm keys)", true,
                    [](const PressSpec&, const Model&) { return std::make_unique<KnormScorer>(); },
                    {.kvpress_parity = "match up to ties: equal key norms of repeated tokens (kvpress KnormPress)"}});

}  // namespace
}  // namespace kvzap
