// "cur" (docs/ALGORITHMS.md §8.11, kvpress CURPress, CurDKV): approximate leverage from norms. Per stream,
// k2 = ||k||^2 and v2 = ||v||^2, each normalised to sum 1 within aligned windows of 16 slots (the last
// window zero-padded); score = k2 * v2 (leverage_type kv_product; or k2,
// v2, (k2 + v2) / 2) normalised to sum 1 over the stream; the first 4 slots = 1.0. Defaults of kvpress:
// kv_product, local approximation on, no random projection. use_random_leverage=1 first projects keys and values
// through a Gaussian G [D][20] / sqrt(20), one per layer shared by its heads, as kvpress does; kvpress draws G
// unseeded from torch, kvzap from PressSpec::seed (gaussian_sketch), so that choice is reproducible here and
// matches kvpress only in distribution. num_sinks, leverage_type, use_random_leverage, use_local_approximation
// and local_window_size are press parameters.
#include <algorithm>
#include <cmath>

#include "model/model.h"
#include "press/baseline_math.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

void normalise_windows(std::vector<double>& x, size_t window) {
  for (size_t w0 = 0; w0 < x.size(); w0 += window) {
    const size_t w1 = std::min(x.size(), w0 + window);
    double s = 0;
    for (size_t i = w0; i < w1; i++) s += x[i];
    if (s > 0)  // an all-zero window stays 0 (kvpress would give NaN)
      for (size_t i = w0; i < w1; i++) x[i] /= s;
  }
}

class CurScorer : public CacheContextScorer {
 public:
  CurScorer(int64_t num_sinks, int64_t local_window, bool local, CurLeverage leverage, bool random, uint64_t seed)
      : n_sink_(num_sinks), window_(local_window), local_(local), leverage_(leverage), random_(random), seed_(seed) {}
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
      if (random_) {
        // ||x G||^2 for G [D][r], the layer's (head 0's sketch: kvpress draws one G per layer call).
        const std::vector<double> G = gaussian_sketch(seed_, l, 0, D, kRandomDim);
        for (int64_t i = 0; i < n; i++)
          for (int j = 0; j < kRandomDim; j++) {
            double kp = 0, vp = 0;
            for (int d = 0; d < D; d++) {
              kp += (double)keys[(size_t)(i * D + d)] * G[(size_t)(d * kRandomDim + j)];
              vp += (double)values[(size_t)(i * D + d)] * G[(size_t)(d * kRandomDim + j)];
            }
            k2[(size_t)i] += kp * kp, v2[(size_t)i] += vp * vp;
          }
      } else {
        for (int64_t i = 0; i < n; i++)
          for (int d = 0; d < D; d++) {
            k2[(size_t)i] += (double)keys[(size_t)(i * D + d)] * keys[(size_t)(i * D + d)];
            v2[(size_t)i] += (double)values[(size_t)(i * D + d)] * values[(size_t)(i * D + d)];
          }
      }
      if (local_) {
        normalise_windows(k2, (size_t)window_);
        normalise_windows(v2, (size_t)window_);
      }
      std::vector<double>& lev = k2;  // [n] the leverage, in place of k2
      for (int64_t i = 0; i < n; i++) {
        const double k = k2[(size_t)i], v = v2[(size_t)i];
        lev[(size_t)i] = leverage_ == CurLeverage::key     ? k
                         : leverage_ == CurLeverage::value ? v
                         : leverage_ == CurLeverage::kv_avg ? (k + v) / 2
                                                            : k * v;
      }
      double total = 0;
      for (int64_t i = 0; i < n; i++) total += lev[(size_t)i];
      std::vector<float>& s = out[(size_t)l][(size_t)h];
      if (!(total > 0)) total = 1;
      for (int64_t i = 0; i < n; i++) s[(size_t)i] = i < n_sink_ ? 1.0f : (float)(lev[(size_t)i] / total);
    });
  }

 private:
  int64_t n_sink_;   // kvpress num_sinks: the first slots score 1
  int64_t window_;  // kvpress local_window_size
  bool local_;      // kvpress use_local_approximation
  CurLeverage leverage_;  // kvpress leverage_type
  bool random_;           // kvpress use_random_leverage
  uint64_t seed_;         // G's seed (PressSpec::seed)
  static constexpr int kRandomDim = 20;  // kvpress's r
};

}  // namespace

std::unique_ptr<Scorer> make_cur_scorer(int64_t num_sinks, int64_t local_window_size, bool use_local_approximation,
                                        CurLeverage leverage, bool use_random_leverage, uint64_t seed) {
  return std::make_unique<CurScorer>(num_sinks, local_window_size, use_local_approximation, leverage,
                                     use_random_leverage, seed);
}

namespace {
RegisterScorer reg({"cur", "CurDKV: ||k||^2 x ||v||^2, each normalised within windows of 16; first 4 tokens kept", false,
                    [](const PressSpec& o, const Model&) {
                      return make_cur_scorer((int64_t)press_param(o, "num_sinks"), (int64_t)press_param(o, "local_window_size"),
                                             press_param(o, "use_local_approximation") != 0,
                                             (CurLeverage)(int)press_param(o, "leverage_type"),
                                             press_param(o, "use_random_leverage") != 0, o.seed);
                    },
                    {.params = {{"num_sinks", 4, 0, 1 << 20, true, "the first tokens always kept"},
                                {"leverage_type", 3, 0, 3, true, "the score: key, value, kv_avg (their mean) or kv_product",
                                 {"key", "value", "kv_avg", "kv_product"}},
                                {"use_random_leverage", 0, 0, 1, true,
                                 "1: norms of keys and values projected by a seeded Gaussian [head_dim][20] per layer"},
                                {"use_local_approximation", 1, 0, 1, true, "1: norms normalised within local windows, 0: not"},
                                {"local_window_size", 16, 1, 1 << 20, true, "the local windows' length"}},
                     .kvpress_parity = "exact (kvpress CURPress)"}});
}  // namespace

}  // namespace kvzap
