// KVzip / KVzip+ context scorers (the oracles KVzap learns from).
#pragma once
#include <vector>

#include "model/model.h"
#include "press/press.h"

namespace kvzap {

class KvzipScorer : public Scorer {
 public:
  KvzipScorer(const Model& model, bool plus);
  bool per_step() const override { return false; }
  // out[layer][head][slot] for the full context; template prefix and sinks get +inf.
  void score_context(ContextView& ctx, CacheScores& out) override;

 private:
  struct ChunkObserver : LayerObserver {
    ChunkObserver(KvzipScorer& s, CacheScores& o, int64_t c0_, int64_t c1_, int64_t n_ctx_, int64_t n_in_)
        : sc(s), out(o), c0(c0_), c1(c1_), n_ctx(n_ctx_), n_in(n_in_) {}
    void after_attention(const LayerStep& st, KvCache& cache) override;
    KvzipScorer& sc;
    CacheScores& out;
    int64_t c0, c1, n_ctx, n_in;
    ThreadPool* pool_ptr = nullptr;
  };
  void prepare_output_norms();
  std::vector<int32_t> repeat_prompt(const std::vector<int32_t>& prev_tail, bool first) const;

  const Model& model_;
  bool plus_;
  std::vector<std::vector<double>> gram_;  // [layer][n_head][D][D]
};

}  // namespace kvzap
