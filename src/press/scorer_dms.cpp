// DMS (docs/ALGORITHMS.md §8.30, kvpress DMSPress) around a press that scores the whole context (SnapKV, TOVA,
// ...): kvpress scores the prefill in one pass, so the context is judged once it is complete. Entries scoring
// below the threshold are evicted for real (kvpress only masks them), except the last `window` positions of
// the context. Per-token scorers under dms_<press> need no wrapper: the threshold policy (threshold.cpp) is
// DMSPress already. make_press (registry.cpp) picks one or the other.
#include <algorithm>
#include <cstdio>

#include "kvzap/error.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

class DmsContextScorer : public WrappedBudgetScorer {
 public:
  DmsContextScorer(std::unique_ptr<Scorer> inner, double threshold, int window, int sink_tokens)
      : WrappedBudgetScorer(std::move(inner)), threshold_(threshold), window_(window), sink_tokens_(sink_tokens) {}

  bool per_step() const override { return false; }
  std::string budget_name() const override {
    char buf[96];
    std::snprintf(buf, sizeof buf, "threshold %g, window %d%s", threshold_, window_, sink_tokens_ > 0 ? ", sinks" : "");
    return buf;
  }
  bool uses_ratio() const override { return false; }
  void mark_evictions(const KvCache& cache, const CacheScores& scores, double, EvictionMask& drop) override {
    const int H = cache.n_head_kv();
    for (int l = 0; l < cache.n_layer(); l++) {
      // The context just prefilled is positions 0..end-1; its last `window` are protected (kvpress judges
      // only the scores that left the sliding window).
      int64_t end = 0;
      for (int h = 0; h < H; h++)
        if (const int64_t len = cache.length(l, h); len > 0) end = std::max<int64_t>(end, cache.position_at(l, h, len - 1) + 1);
      const int64_t limit = end - window_;
      for (int h = 0; h < H; h++) {
        const std::vector<float>& s = scores[(size_t)l][(size_t)h];
        std::vector<uint8_t>& d = drop[(size_t)l * H + h];
        for (int64_t i = 0; i < cache.length(l, h); i++) {
          const int32_t p = cache.position_at(l, h, i);
          if (p >= limit) break;  // a stream is sorted by position
          if (p >= sink_tokens_ && s[(size_t)i] < threshold_) d[(size_t)i] = 1;  // strict, as kvpress; NaN kept
        }
      }
    }
  }

 private:
  double threshold_;
  int window_;
  int sink_tokens_;
};

}  // namespace

std::unique_ptr<Scorer> make_dms_context_scorer(std::unique_ptr<Scorer> inner, double threshold, int window,
                                                int sink_tokens) {
  if (inner->per_step()) throw Error("internal: a per-token scorer runs dms_ under the threshold policy");
  if (dynamic_cast<BudgetSplit*>(inner.get()))
    throw Error("DMS cannot wrap a press that splits its budget itself (it needs the press's raw scores)");
  if (window < 0) throw Error("the window must be >= 0, got " + std::to_string(window));
  if (sink_tokens < 0) throw Error("the sink token count must be >= 0, got " + std::to_string(sink_tokens));
  return std::make_unique<DmsContextScorer>(std::move(inner), threshold, window, sink_tokens);
}

}  // namespace kvzap
