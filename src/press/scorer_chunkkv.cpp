// "chunkkv" (docs/ALGORITHMS.md §8.12, kvpress ChunkKVPress(SnapKVPress(), chunk_length=20)): SnapKV scores
// summed over the heads of a layer and averaged per chunk of chunk_length (20) slots (the remainder is one more
// chunk); the layer keeps its max(1, int(n_chunks * (1 - ratio))) best chunks whole, the same slots
// in every head. The ratio scope does not apply. The window's +inf scores are replaced by the layer's
// largest finite score + 1 first, as kvpress pads them.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kvzap/error.h"
#include "model/model.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

class ChunkKvScorer : public SnapKvScorer, public BudgetSplit {
 public:
  ChunkKvScorer(const ModelConfig& c, int64_t chunk) : SnapKvScorer(c), chunk_(chunk) {}
  std::string budget_name() const override { return "chunks of " + std::to_string(chunk_); }

  void mark_evictions(const KvCache& cache, const CacheScores& scores, double ratio, EvictionMask& drop) override {
    const int H = cache.n_head_kv();
    for (int l = 0; l < cache.n_layer(); l++) {
      if (!judged_layer(cache, l)) continue;
      const int64_t T = cache.length(l, 0);
      for (int h = 1; h < H; h++)
        if (cache.length(l, h) != T) throw Error("internal: chunkkv needs every head of a layer to hold the same slots");
      if (T < chunk_) {  // no whole chunk: the inner SnapKV press alone, same count per head
        for (int h = 0; h < H; h++)
          mark_lowest_in_stream(scores[(size_t)l][(size_t)h], T - (int64_t)((double)T * (1.0 - ratio)),
                                drop[(size_t)l * H + h]);
        continue;
      }
      float top = -std::numeric_limits<float>::infinity();
      for (int h = 0; h < H; h++)
        for (float v : scores[(size_t)l][(size_t)h])
          if (std::isfinite(v)) top = std::max(top, v);
      std::vector<double> sum((size_t)T, 0.0);  // over heads
      for (int h = 0; h < H; h++)
        for (int64_t i = 0; i < T; i++) {
          const float v = scores[(size_t)l][(size_t)h][(size_t)i];
          sum[(size_t)i] += v == std::numeric_limits<float>::infinity() ? (double)top + 1 : (double)v;
        }
      const int64_t n_chunks = (T + chunk_ - 1) / chunk_;
      std::vector<double> chunk((size_t)n_chunks, 0.0);
      for (int64_t c = 0; c < n_chunks; c++) {
        const int64_t c0 = c * chunk_, c1 = std::min(T, c0 + chunk_);
        for (int64_t i = c0; i < c1; i++) chunk[(size_t)c] += sum[(size_t)i];
        chunk[(size_t)c] /= (double)(c1 - c0);
      }
      const int64_t kept = std::max<int64_t>(1, (int64_t)((double)n_chunks * (1.0 - ratio)));
      std::vector<int64_t> order((size_t)n_chunks);
      std::iota(order.begin(), order.end(), 0);
      // Lowest chunks first; NaN counts as lowest; ties: the earlier chunk goes first.
      auto key = [&](int64_t c) { return std::isnan(chunk[(size_t)c]) ? -INFINITY : chunk[(size_t)c]; };
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key(a) < key(b); });
      for (int64_t r = 0; r < n_chunks - kept; r++) {
        const int64_t c0 = order[(size_t)r] * chunk_, c1 = std::min(T, c0 + chunk_);
        for (int h = 0; h < H; h++)
          for (int64_t i = c0; i < c1; i++) drop[(size_t)l * H + h][(size_t)i] = 1;
      }
    }
  }

 private:
  int64_t chunk_;  // slots per chunk (kvpress chunk_length)
};

}  // namespace

std::unique_ptr<Scorer> make_chunkkv_scorer(const ModelConfig& c, int64_t chunk_length) {
  return std::make_unique<ChunkKvScorer>(c, chunk_length);
}

namespace {
RegisterScorer reg({"chunkkv",
                    "ChunkKV(SnapKV): keeps whole 20-token chunks by their mean SnapKV score, same for all heads "
                    "(ratio scope does not apply)",
                    false, [](const PressSpec& o, const Model& m) { return make_chunkkv_scorer(m.config(), (int64_t)press_param(o, "chunk_length")); },
                    {.min_context_tokens = kSnapKvWindow,
                     .params = {{"chunk_length", 20, 1, 1 << 20, true, "slots per chunk, kept or evicted whole"}},
                     .kvpress_parity = "exact (kvpress ChunkKVPress(SnapKVPress))"}});
}  // namespace

}  // namespace kvzap
