// "cur" (docs/ALGORITHMS.md §8.11, kvpress CURPress, CurDKV): approximate leverage from norms. Per stream,
// k2 = ||k||^2 and v2 = ||v||^2, each normalised to sum 1 within aligned windows of 16 slots (the last
// window zero-padded); score = k2 * v2 normalised to sum 1 over the stream; the first 4 slots = 1.0.
// Defaults of kvpress: kv_product, local approximation on, no random projection.
#include <algorithm>
#include <cmath>

#include "model/model.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

constexpr int kLocalWindow = 16;
constexpr int kSinks = 4;

void normalise_windows(std::vector<double>& x) {
  for (size_t w0 = 0; w0 < x.size(); w0 += kLocalWindow) {
    const size_t w1 = std::min(x.size(), w0 + kLocalWindow);
    double s = 0;
    for (size_t i = w0; i < w1; i++) s += x[i];
    if (s > 0)  // an all-zero window stays 0 (kvpress would give NaN)
      for (size_t i = w0; i < w1; i++) x[i] /= s;
  }
}

class CurScorer : public CacheContextScorer {
 public:
  void score_cache(const KvCache& cache, CacheScores& out) override {
    require_full_context(cache, "cur");
    size_scores(cache, out);
    const int Hkv = cache.n_head_kv(), D = cache.head_dim();
    parallel_for((int64_t)cache.n_layer() * Hkv, [&](int64_t task, int) {
      const int l = (int)(task / Hkv), h = (int)(task % Hkv);
      if (!judged_layer(cache, l)) return;
      std::vector<float> keys, values;
      stream_keys(cache, l, h, keys);
      stream_values(cache, l, h, values);
      const int64_t n = cache.length(l, h);
      std::vector<double> k2((size_t)n, 0.0), v2((size_t)n, 0.0);
      for (int64_t i = 0; i < n; i++)
        for (int d = 0; d < D; d++) {
          k2[(size_t)i] += (double)keys[(size_t)(i * D + d)] * keys[(size_t)(i * D + d)];
          v2[(size_t)i] += (double)values[(size_t)(i * D + d)] * values[(size_t)(i * D + d)];
        }
      normalise_windows(k2);
      normalise_windows(v2);
      double total = 0;
      for (int64_t i = 0; i < n; i++) total += k2[(size_t)i] * v2[(size_t)i];
      std::vector<float>& s = out[(size_t)l][(size_t)h];
      if (!(total > 0)) total = 1;
      for (int64_t i = 0; i < n; i++) s[(size_t)i] = i < kSinks ? 1.0f : (float)(k2[(size_t)i] * v2[(size_t)i] / total);
    });
  }
};

}  // namespace

std::unique_ptr<Scorer> make_cur_scorer() { return std::make_unique<CurScorer>(); }

namespace {
RegisterScorer reg({"cur", "CurDKV: ||k||^2 x ||v||^2, each normalised within windows of 16; first 4 tokens kept", false,
                    [](const PressSpec&, const Model&) { return make_cur_scorer(); },
                    {.kvpress_parity = "exact (kvpress CURPress)"}});
}  // namespace

}  // namespace kvzap
