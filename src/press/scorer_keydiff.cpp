// "keydiff" (docs/ALGORITHMS.md §8.9, kvpress KeyDiffPress): keep distinctive keys. Per stream, the anchor is
// the mean of the L2-normalised keys (after RoPE, as cached); score = -cos(k, anchor).
#include <algorithm>
#include <cmath>

#include "model/model.h"
#include "press/baseline_math.h"
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
      std::vector<double> scores((size_t)n);
      keydiff_scores(keys.data(), D, nullptr, (size_t)n, scores.data());
      std::vector<float>& s = out[(size_t)l][(size_t)h];
      for (int64_t i = 0; i < n; i++) s[(size_t)i] = (float)scores[(size_t)i];
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
