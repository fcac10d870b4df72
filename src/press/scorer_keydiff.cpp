// "keydiff" (docs/ALGORITHMS.md §8.9, kvpress KeyDiffPress): keep distinctive keys. Per stream, the anchor is
// the mean of the L2-normalised keys (after RoPE, as cached); score = -cos(k, anchor).
#include <algorithm>
#include <cmath>

#include "model/model.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

class KeyDiffScorer : public CacheContextScorer {
 public:
  void score_cache(const KvCache& cache, CacheScores& out) override {
    require_full_context(cache, "keydiff");
    size_scores(cache, out);
    const int Hkv = cache.n_head_kv(), D = cache.head_dim();
    parallel_for((int64_t)cache.n_layer() * Hkv, [&](int64_t task, int) {
      const int l = (int)(task / Hkv), h = (int)(task % Hkv);
      if (!judged_layer(cache, l)) return;
      std::vector<float> keys;
      stream_keys(cache, l, h, keys);
      const int64_t n = cache.length(l, h);
      std::vector<double> norm((size_t)n), anchor((size_t)D, 0.0);
      for (int64_t i = 0; i < n; i++) {
        const float* k = keys.data() + (size_t)i * D;
        double s = 0;
        for (int d = 0; d < D; d++) s += (double)k[d] * k[d];
        norm[(size_t)i] = std::sqrt(s);
        const double inv = 1.0 / std::max(norm[(size_t)i], 1e-12);  // F.normalize's eps
        for (int d = 0; d < D; d++) anchor[(size_t)d] += k[d] * inv;
      }
      double an = 0;
      for (double& a : anchor) {
        a /= (double)n;
        an += a * a;
      }
      an = std::sqrt(an);
      std::vector<float>& s = out[(size_t)l][(size_t)h];
      for (int64_t i = 0; i < n; i++) {
        const float* k = keys.data() + (size_t)i * D;
        double dot = 0;
        for (int d = 0; d < D; d++) dot += k[d] * anchor[(size_t)d];
        s[(size_t)i] = (float)(-dot / std::max(norm[(size_t)i] * an, 1e-8));  // cosine_similarity's eps
      }
    });
  }
};

}  // namespace

std::unique_ptr<Scorer> make_keydiff_scorer() { return std::make_unique<KeyDiffScorer>(); }

namespace {
RegisterScorer reg({"keydiff", "KeyDiff: -cosine between each key and the mean normalised key (keeps distinctive keys)",
                    false, [](const PressSpec&, const Model&) { return make_keydiff_scorer(); },
                    {.kvpress_parity = "exact (kvpress KeyDiffPress)"}});
}  // namespace

}  // namespace kvzap
