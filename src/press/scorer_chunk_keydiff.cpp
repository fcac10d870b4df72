// "chunk_keydiff" (docs/ALGORITHMS.md §8.25, kvpress ChunkPress(KeyDiffPress(), chunk_length=1024)): the
// context is cut into chunks of chunk_length slots (the remainder is one more chunk) and KeyDiff (§8.9) runs
// on each chunk alone: the anchor is the mean of the chunk's L2-normalised keys, score = -cos(k, anchor).
// Each (layer, KV head) keeps max(1, int(n (1 - ratio))) of the n entries of every chunk (the ratio scope
// does not apply).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "kvzap/error.h"
#include "model/model.h"
#include "press/baseline_math.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

class ChunkKeyDiffScorer : public CacheContextScorer, public ChunkBudget {
 public:
  explicit ChunkKeyDiffScorer(int64_t chunk) : ChunkBudget(chunk) {
    if (chunk < 1) throw Error("chunk_keydiff's chunk_length must be >= 1, got " + std::to_string(chunk));
  }

  void score_cache(const KvCache& cache, CacheScores& out) override {
    require_full_context(cache, "chunk_keydiff");
    size_scores(cache, out);
    const int Hkv = cache.n_head_kv(), D = cache.head_dim();
    parallel_for((int64_t)cache.n_layer() * Hkv, [&](int64_t task, int) {
      const int l = (int)(task / Hkv), h = (int)(task % Hkv);
      if (!judged_layer(cache, l)) return;
      std::vector<float> keys;
      stream_keys(cache, l, h, keys);
      const int64_t T = cache.length(l, h);
      std::vector<double> scores;
      std::vector<float>& s = out[(size_t)l][(size_t)h];
      for (int64_t c0 = 0; c0 < T; c0 += chunk_) {
        const int64_t n = std::min(chunk_, T - c0);
        scores.resize((size_t)n);
        keydiff_scores(keys.data() + (size_t)c0 * D, D, nullptr, (size_t)n, scores.data());
        for (int64_t i = 0; i < n; i++) s[(size_t)(c0 + i)] = (float)scores[(size_t)i];
      }
    });
  }

};

}  // namespace

// For the unit test (tests/unit/press/test_baseline_presses.cpp), which has no Model.
std::unique_ptr<Scorer> make_chunk_keydiff_scorer(int64_t chunk_length) {
  return std::make_unique<ChunkKeyDiffScorer>(chunk_length);
}

namespace {
RegisterScorer reg({"chunk_keydiff",
                    "ChunkPress(KeyDiff): KeyDiff on each 1024-token chunk alone (anchor = the chunk's mean "
                    "normalised key), each chunk keeping its share (the ratio scope does not apply)",
                    false,
                    [](const PressSpec& o, const Model&) {
                      return make_chunk_keydiff_scorer((int64_t)press_param(o, "chunk_length"));
                    },
                    {.params = {{"chunk_length", 1024, 1, 1 << 20, true, "slots per chunk, each compressed alone"}},
                     .kvpress_parity = "exact (kvpress ChunkPress(KeyDiffPress))"}});
}  // namespace

}  // namespace kvzap
