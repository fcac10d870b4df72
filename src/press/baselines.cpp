// Shared plumbing of the kvpress baseline scorers (press/baselines.h).
#include "press/baselines.h"

#include <algorithm>
#include <limits>
#include <string>

#include "kernels/thread_pool.h"
#include "kvzap/error.h"

namespace kvzap {

void CacheContextScorer::score_context(ContextView& ctx, CacheScores& out) { score_cache(ctx.cache, out); }

void CacheContextScorer::parallel_for(int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (pool_ && pool_->size() > 1) {
    pool_->parallel_for(n, fn);
    return;
  }
  for (int64_t i = 0; i < n; i++) fn(i, 0);
}

int CacheContextScorer::n_threads() const { return pool_ ? pool_->size() : 1; }

WrappedContextScorer::WrappedContextScorer(std::unique_ptr<Scorer> inner, const char* what)
    : inner_(std::move(inner)), cache_inner_(dynamic_cast<CacheScorer*>(inner_.get())) {
  if (!cache_inner_ || inner_->per_step()) throw Error(std::string("internal: ") + what + " wraps a whole-context scorer");
}

int64_t require_full_context(const KvCache& cache, const char* press) {
  const int64_t T = cache.n_past();
  for (int l = 0; l < cache.n_layer(); l++)
    for (int h = 0; h < cache.n_head_kv() && judged_layer(cache, l); h++)
      if (cache.length(l, h) != T)
        throw Error(std::string(press) + " scores a whole context: every KV stream must hold all " + std::to_string(T) +
                    " context tokens (layer " + std::to_string(l) + ", head " + std::to_string(h) + " holds " +
                    std::to_string(cache.length(l, h)) + ")");
  return T;
}

void size_scores(const KvCache& cache, CacheScores& out) {
  out.assign((size_t)cache.n_layer(), std::vector<std::vector<float>>((size_t)cache.n_head_kv()));
  for (int l = 0; l < cache.n_layer(); l++)
    for (int h = 0; h < cache.n_head_kv(); h++)
      out[(size_t)l][(size_t)h].assign((size_t)cache.length(l, h),
                                       judged_layer(cache, l) ? 0.0f : std::numeric_limits<float>::infinity());
}

void ChunkBudget::mark_evictions(const KvCache& cache, const CacheScores& scores, double ratio, EvictionMask& drop) {
  if (!(ratio > 0)) return;
  const int H = cache.n_head_kv();
  std::vector<float> cs;
  std::vector<uint8_t> cd;
  for (int l = 0; l < cache.n_layer(); l++) {
    if (!judged_layer(cache, l)) continue;
    for (int h = 0; h < H; h++) {
      const std::vector<float>& s = scores[(size_t)l][(size_t)h];
      std::vector<uint8_t>& d = drop[(size_t)l * H + h];
      const int64_t T = (int64_t)s.size();
      for (int64_t c0 = 0; c0 < T; c0 += chunk_) {
        const int64_t n = std::min(chunk_, T - c0);
        if (n <= keep_whole_up_to_) continue;
        const int64_t kept = std::max<int64_t>(1, (int64_t)((double)n * (1.0 - ratio)));
        cs.assign(s.begin() + c0, s.begin() + c0 + n);
        cd.assign((size_t)n, 0);
        mark_lowest_in_stream(cs, n - kept, cd);
        for (int64_t i = 0; i < n; i++)
          if (cd[(size_t)i]) d[(size_t)(c0 + i)] = 1;
      }
    }
  }
}

}  // namespace kvzap
