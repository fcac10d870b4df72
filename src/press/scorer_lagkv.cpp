// "lagkv" (docs/ALGORITHMS.md §8.10, kvpress LagKVPress): attention-free. After 4 sink slots the stream is
// cut into partitions of 128; each partition's keys (and values) are min-max normalised per channel by the
// next partition, the per-token std over channels (Bessel) is softmaxed over the partition, and key and
// value scores are averaged. The score is the token's rank within its partition / 128, or with cross_scoring
// the averaged softmax itself.
// Sinks and the last full partition plus the remainder score 1. A context shorter than 4 + 2*128 keeps
// kvpress's fallback: sinks 1, then (slot - 4) / (T - 4), i.e. keep the most recent.
// Deviation: a channel constant over a reference partition normalises to 0 instead of NaN.
// n_sink (4), lag_size (128) and cross_scoring (false) are press parameters (kvpress LagKVPress arguments).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/model.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

// Softmax over the partition [p0, p0 + lag) of the per-token std of x normalised by partition p0 + lag.
void partition_scores(const std::vector<float>& x, int D, int64_t p0, int64_t lag, std::vector<double>& out) {
  std::vector<double> lo((size_t)D, INFINITY), hi((size_t)D, -INFINITY);
  for (int64_t t = p0 + lag; t < p0 + 2 * lag; t++)
    for (int d = 0; d < D; d++) {
      lo[(size_t)d] = std::min(lo[(size_t)d], (double)x[(size_t)(t * D + d)]);
      hi[(size_t)d] = std::max(hi[(size_t)d], (double)x[(size_t)(t * D + d)]);
    }
  out.resize((size_t)lag);
  std::vector<double> z((size_t)D);
  for (int64_t t = 0; t < lag; t++) {
    double mean = 0;
    for (int d = 0; d < D; d++) {
      // A channel constant over the reference partition would divide by 0 (NaN in kvpress): it counts as 0.
      const double range = hi[(size_t)d] - lo[(size_t)d];
      z[(size_t)d] = range > 0 ? ((double)x[(size_t)((p0 + t) * D + d)] - lo[(size_t)d]) / range : 0.0;
      mean += z[(size_t)d];
    }
    mean /= D;
    double var = 0;
    for (int d = 0; d < D; d++) var += (z[(size_t)d] - mean) * (z[(size_t)d] - mean);
    out[(size_t)t] = std::sqrt(var / (D - 1));
  }
  double mx = -INFINITY, sum = 0;
  for (double v : out) mx = std::max(mx, v);
  for (double& v : out) sum += (v = std::exp(v - mx));
  for (double& v : out) v /= sum;
}

class LagKvScorer : public CacheContextScorer {
 public:
  LagKvScorer(int64_t n_sink, int64_t lag_size, bool cross) : n_sink_(n_sink), lag_(lag_size), cross_(cross) {}
  void score_cache(const KvCache& cache, CacheScores& out) override {
    const int64_t T = require_full_context(cache, "lagkv");
    size_scores(cache, out);
    const int Hkv = cache.n_head_kv(), D = cache.head_dim();
    parallel_for((int64_t)cache.n_layer() * Hkv, [&](int64_t task, int) {
      const int l = (int)(task / Hkv), h = (int)(task % Hkv);
      if (!judged_layer(cache, l)) return;
      std::vector<float>& s = out[(size_t)l][(size_t)h];
      std::fill(s.begin(), s.end(), 1.0f);
      if (T < n_sink_ + 2 * lag_) {
        for (int64_t i = n_sink_; i < T; i++) s[(size_t)i] = (float)(i - n_sink_) / (float)(T - n_sink_);
        return;
      }
      std::vector<float> keys, values;
      stream_keys(cache, l, h, keys);
      stream_values(cache, l, h, values);
      const int64_t n_part = (T - n_sink_) / lag_;  // the last full one is only a reference
      std::vector<double> ks, vs, sc((size_t)lag_);
      std::vector<int64_t> order((size_t)lag_);
      for (int64_t p = 0; p + 1 < n_part; p++) {
        const int64_t p0 = n_sink_ + p * lag_;
        partition_scores(keys, D, p0, lag_, ks);
        partition_scores(values, D, p0, lag_, vs);
        for (int64_t t = 0; t < lag_; t++) sc[(size_t)t] = (ks[(size_t)t] + vs[(size_t)t]) / 2;
        if (cross_) {
          for (int64_t t = 0; t < lag_; t++) s[(size_t)(p0 + t)] = (float)sc[(size_t)t];
          continue;
        }
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return sc[(size_t)a] < sc[(size_t)b]; });
        for (int64_t r = 0; r < lag_; r++) s[(size_t)(p0 + order[(size_t)r])] = (float)r / (float)lag_;
      }
    });
  }

 private:
  int64_t n_sink_;  // kvpress n_sink: always kept
  int64_t lag_;    // kvpress lag_size: the partition length
  bool cross_;     // kvpress cross_scoring: scores, not ranks
};

}  // namespace

std::unique_ptr<Scorer> make_lagkv_scorer(int64_t n_sink, int64_t lag_size, bool cross_scoring) {
  return std::make_unique<LagKvScorer>(n_sink, lag_size, cross_scoring);
}

namespace {
RegisterScorer reg({"lagkv",
                    "LagKV: per-token spread of keys and values normalised by the next 128-token partition, "
                    "ranked within the partition; sinks and the last partition kept",
                    false,
                    [](const PressSpec& o, const Model&) {
                      return make_lagkv_scorer((int64_t)press_param(o, "n_sink"), (int64_t)press_param(o, "lag_size"),
                                               press_param(o, "cross_scoring") != 0);
                    },
                    {.params = {{"n_sink", 4, 0, 1 << 20, true, "the first tokens always kept"},
                                {"lag_size", 128, 1, 1 << 20, true, "the partition length; the last full partition is kept"},
                                {"cross_scoring", 0, 0, 1, true, "1: scores compare across partitions (softmax, not rank)"}},
                     .kvpress_parity = "match up to ties: rank scores tie across partitions (kvpress LagKVPress)"}});
}  // namespace

}  // namespace kvzap
