// "streaming_llm" (docs/ALGORITHMS.md §8.3, kvpress StreamingLLMPress): keep the first n_sink (4) tokens
// (attention sinks) and the most recent ones. As a context scorer: sinks score +inf, every other entry its position,
// so the lowest scores are the oldest non-sink tokens. With scope "head" every stream keeps its 4 sinks
// and its most recent tokens; "global" and "layer" give the same result up to rounding, since every stream
// holds the same positions.
#include <limits>

#include "press/press.h"

namespace kvzap {
namespace {

class StreamingScorer : public Scorer {
 public:
  explicit StreamingScorer(int32_t n_sink) : n_sink_(n_sink) {}
  bool per_step() const override { return false; }
  bool scores_sliding_layers() const override { return true; }  // it reads positions, not slots
  void score_context(ContextView& ctx, CacheScores& out) override {
    const KvCache& cache = ctx.cache;
    out.assign((size_t)cache.n_layer(), std::vector<std::vector<float>>((size_t)cache.n_head_kv()));
    for (int l = 0; l < cache.n_layer(); l++)
      for (int h = 0; h < cache.n_head_kv(); h++) {
        std::vector<float>& s = out[(size_t)l][(size_t)h];
        s.resize((size_t)cache.length(l, h));
        for (int64_t i = 0; i < cache.length(l, h); i++) {
          const int32_t p = cache.position_at(l, h, i);
          s[(size_t)i] = p < n_sink_ ? std::numeric_limits<float>::infinity() : (float)p;
        }
      }
  }

 private:
  int32_t n_sink_;
};

RegisterScorer reg({"streaming_llm", "keeps the first 4 tokens (attention sinks) and the most recent ones", false,
                    [](const PressSpec& o, const Model&) { return std::make_unique<StreamingScorer>((int32_t)press_param(o, "n_sink")); },
                    {.params = {{"n_sink", 4, 0, 1 << 20, true, "the first tokens always kept (attention sinks)"}},
                     .kvpress_parity = "exact (kvpress StreamingLLMPress)"}});

}  // namespace
}  // namespace kvzap
