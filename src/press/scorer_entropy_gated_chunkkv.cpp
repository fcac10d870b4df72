// "entropy_gated_chunkkv" (docs/ALGORITHMS.md §8.23, kvpress EntropyGatedChunkKVPress(SnapKVPress()),
// chunks of 10, 4 tokens from a spiky chunk): ChunkKV whose chunks are gated by the entropy of their scores.
// Per layer, s = SnapKV scores summed over the heads (the window's +inf replaced by the layer's largest
// finite score + 1, as kvpress pads it) and a budget of n = max(1, int(T (1 - ratio))) slots, the same in
// every head:
//   * per chunk of 10 (the remainder is one more chunk): its score, the mean of s; its entropy, that of s
//     shifted to be non-negative and normalised to sum 1 (+1e-8), over log(chunk size), clamped to [0, 1]
//     (a one-slot chunk: 0);
//   * chunks in decreasing score take min(size, budget left) slots whole, except a chunk with score >= the
//     median score and entropy < the median entropy (lower medians, as torch.median), which takes only its
//     4 best slots;
//   * budget still left goes to the best remaining slots.
// It chooses its own kept sets (the ratio scope does not apply). chunk_length (10) and
// low_entropy_chunk_length (4) are press parameters (kvpress's arguments).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kvzap/error.h"
#include "model/model.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

constexpr double kEps = 1e-8;

// The lower median (torch.median): element (n - 1) / 2 of the sorted values.
double lower_median(std::vector<double> x) {
  const size_t k = (x.size() - 1) / 2;
  std::nth_element(x.begin(), x.begin() + (ptrdiff_t)k, x.end());
  return x[k];
}

// The best n of slots [c0, c1) of s, into keep; ties: the earlier slot.
void keep_best(const std::vector<double>& s, int64_t c0, int64_t c1, int64_t n, std::vector<uint8_t>& keep) {
  std::vector<int64_t> idx((size_t)(c1 - c0));
  std::iota(idx.begin(), idx.end(), c0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return s[(size_t)a] > s[(size_t)b]; });
  for (int64_t r = 0; r < n; r++) keep[(size_t)idx[(size_t)r]] = 1;
}

class EntropyGatedChunkKvScorer : public SnapKvScorer, public BudgetSplit {
 public:
  EntropyGatedChunkKvScorer(const ModelConfig& c, int64_t chunk_length, int64_t low_entropy_chunk_length)
      : SnapKvScorer(c), chunk_(chunk_length), spiky_kept_(low_entropy_chunk_length) {
    if (!(chunk_length > low_entropy_chunk_length && low_entropy_chunk_length >= 1))
      throw Error("entropy_gated_chunkkv needs chunk_length > low_entropy_chunk_length >= 1, got chunk_length " +
                  std::to_string(chunk_length) + " and low_entropy_chunk_length " + std::to_string(low_entropy_chunk_length));
  }
  std::string budget_name() const override { return "entropy-gated chunks of " + std::to_string(chunk_); }

  void mark_evictions(const KvCache& cache, const CacheScores& scores, double ratio, EvictionMask& drop) override {
    const int H = cache.n_head_kv();
    if (!(ratio > 0)) return;
    for (int l = 0; l < cache.n_layer(); l++) {
      if (!judged_layer(cache, l)) continue;
      const int64_t T = cache.length(l, 0);
      for (int h = 1; h < H; h++)
        if (cache.length(l, h) != T) throw Error("internal: entropy_gated_chunkkv needs every head of a layer to hold the same slots");
      if (T <= 0) continue;
      float top = -std::numeric_limits<float>::infinity();
      for (int h = 0; h < H; h++)
        for (float v : scores[(size_t)l][(size_t)h])
          if (std::isfinite(v)) top = std::max(top, v);
      std::vector<double> s((size_t)T, 0.0);  // [T] summed over heads
      for (int h = 0; h < H; h++)
        for (int64_t i = 0; i < T; i++) {
          const float v = scores[(size_t)l][(size_t)h][(size_t)i];
          s[(size_t)i] += v == std::numeric_limits<float>::infinity() ? (double)top + 1 : (double)v;
        }
      const int64_t n_chunks = (T + chunk_ - 1) / chunk_;
      std::vector<double> mean((size_t)n_chunks), entropy((size_t)n_chunks);
      for (int64_t c = 0; c < n_chunks; c++) {
        const int64_t c0 = c * chunk_, c1 = std::min(T, c0 + chunk_), m = c1 - c0;
        double sum = 0, lo = 0;  // lo = min(0, min s): the shift that makes the chunk non-negative
        for (int64_t i = c0; i < c1; i++) sum += s[(size_t)i], lo = std::min(lo, s[(size_t)i]);
        mean[(size_t)c] = sum / (double)m;
        if (m == 1) {
          entropy[(size_t)c] = 0;
          continue;
        }
        const double total = sum - lo * (double)m + kEps;
        double e = 0;
        for (int64_t i = c0; i < c1; i++) {
          const double p = (s[(size_t)i] - lo) / total;
          e -= p * std::log(p + kEps);
        }
        entropy[(size_t)c] = std::clamp(e / std::log((double)m), 0.0, 1.0);
      }
      const double score_median = lower_median(mean), entropy_median = lower_median(entropy);
      std::vector<int64_t> order((size_t)n_chunks);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return mean[(size_t)a] > mean[(size_t)b]; });
      int64_t budget = std::max<int64_t>(1, (int64_t)((double)T * (1.0 - ratio)));
      std::vector<uint8_t> keep((size_t)T, 0);
      for (int64_t c : order) {
        if (budget <= 0) break;
        const int64_t c0 = c * chunk_, c1 = std::min(T, c0 + chunk_);
        int64_t n = std::min(c1 - c0, budget);
        if (mean[(size_t)c] >= score_median && entropy[(size_t)c] < entropy_median) n = std::min(n, spiky_kept_);
        keep_best(s, c0, c1, n, keep);
        budget -= n;
      }
      if (budget > 0) {  // top up with the best slots left
        std::vector<int64_t> left;
        for (int64_t i = 0; i < T; i++)
          if (!keep[(size_t)i]) left.push_back(i);
        std::stable_sort(left.begin(), left.end(), [&](int64_t a, int64_t b) { return s[(size_t)a] > s[(size_t)b]; });
        for (int64_t r = 0; r < std::min<int64_t>(budget, (int64_t)left.size()); r++) keep[(size_t)left[(size_t)r]] = 1;
      }
      for (int h = 0; h < H; h++)
        for (int64_t i = 0; i < T; i++) drop[(size_t)l * H + h][(size_t)i] = keep[(size_t)i] ? 0 : 1;
    }
  }

 private:
  int64_t chunk_;      // kvpress chunk_length
  int64_t spiky_kept_;  // kvpress low_entropy_chunk_length
};

}  // namespace

// For the unit test (tests/unit/press/test_baseline_presses.cpp), which has no Model.
std::unique_ptr<Scorer> make_entropy_gated_chunkkv_scorer(const ModelConfig& c, int64_t chunk_length,
                                                          int64_t low_entropy_chunk_length) {
  return std::make_unique<EntropyGatedChunkKvScorer>(c, chunk_length, low_entropy_chunk_length);
}

namespace {
RegisterScorer reg({"entropy_gated_chunkkv",
                    "EntropyGatedChunkKV(SnapKV): ChunkKV with chunks of 10, a high-score low-entropy chunk keeps only "
                    "its 4 best slots and the budget left goes to the best slots (ratio scope does not apply)",
                    false,
                    [](const PressSpec& o, const Model& m) {
                      return make_entropy_gated_chunkkv_scorer(m.config(), (int64_t)press_param(o, "chunk_length"),
                                                               (int64_t)press_param(o, "low_entropy_chunk_length"));
                    },
                    {.min_context_tokens = kSnapKvWindow,
                     .params = {{"chunk_length", 10, 2, 1 << 20, true, "slots per chunk"},
                                {"low_entropy_chunk_length", 4, 1, 1 << 20, true,
                                 "the slots a high-score low-entropy chunk keeps (below chunk_length)"}},
                     .kvpress_parity = "match up to ties (kvpress EntropyGatedChunkKVPress(SnapKVPress): which of equally "
                                       "scored slots stay is torch.topk's choice)"}});
}  // namespace

}  // namespace kvzap
