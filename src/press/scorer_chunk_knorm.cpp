// "chunk_knorm" (docs/ALGORITHMS.md §8.27, kvpress ChunkPress(KnormPress(), chunk_length=1024)): score =
// -||k|| (§8.2) on the keys as the cache holds them, with the budget taken chunk by chunk: the context is cut
// into chunks of chunk_length slots (the remainder is one more chunk) and each (layer, KV head) keeps
// max(1, int(n (1 - ratio))) of the n entries of every chunk, the lowest-norm keys (the ratio scope does not
// apply).
#include <algorithm>
#include <cmath>

#include "kvzap/error.h"
#include "model/model.h"
#include "press/baseline_math.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

class ChunkKnormScorer : public CacheContextScorer, public ChunkBudget {
 public:
  explicit ChunkKnormScorer(int64_t chunk) : ChunkBudget(chunk) {
    if (chunk < 1) throw Error("chunk_knorm's chunk_length must be >= 1, got " + std::to_string(chunk));
  }

  void score_cache(const KvCache& cache, CacheScores& out) override {
    require_full_context(cache, "chunk_knorm");
    size_scores(cache, out);
    const int Hkv = cache.n_head_kv(), D = cache.head_dim();
    parallel_for((int64_t)cache.n_layer() * Hkv, [&](int64_t task, int) {
      const int l = (int)(task / Hkv), h = (int)(task % Hkv);
      if (!judged_layer(cache, l)) return;
      std::vector<float> keys;
      stream_keys(cache, l, h, keys);
      std::vector<float>& s = out[(size_t)l][(size_t)h];
      for (size_t i = 0; i < s.size(); i++) {
        double sq = 0;
        for (int d = 0; d < D; d++) sq += (double)keys[i * D + d] * keys[i * D + d];
        s[i] = -(float)std::sqrt(sq);
      }
    });
  }

};

}  // namespace

// For the unit test (tests/unit/press/test_baseline_presses.cpp), which has no Model.
std::unique_ptr<Scorer> make_chunk_knorm_scorer(int64_t chunk_length) { return std::make_unique<ChunkKnormScorer>(chunk_length); }

namespace {
RegisterScorer reg({"chunk_knorm",
                    "ChunkPress(Knorm): the lowest-norm keys of each 1024-token chunk, each chunk keeping its share "
                    "(the ratio scope does not apply)",
                    false,
                    [](const PressSpec& o, const Model&) {
                      return make_chunk_knorm_scorer((int64_t)press_param(o, "chunk_length"));
                    },
                    {.params = {{"chunk_length", 1024, 1, 1 << 20, true, "slots per chunk, each compressed alone"}},
                     .kvpress_parity = "match up to ties: equal key norms of repeated tokens (kvpress ChunkPress(KnormPress))"}});
}  // namespace

}  // namespace kvzap
