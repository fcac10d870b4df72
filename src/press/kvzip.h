// KVzip / KVzip+ context scorers (the oracles KVzap learns from), and the calibrated default
// threshold of a shipped KVzap surrogate.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/model.h"
#include "press/kvzip_math.h"
#include "press/press.h"

namespace kvzap {

class KvzipScorer : public Scorer {
 public:
  KvzipScorer(const Model& model, bool plus);
  bool per_step() const override { return false; }
  // out[layer][head][slot] for the full context; template prefix and sinks get +inf.
  void score_context(ContextView& ctx, CacheScores& out) override;

  // Debug dump for offline checks (tests/python/check_kvzip_numpy.py): while scoring the first chunk,
  // layer `layer` writes into `dir` float32 .npy files of what it used — q.npy [n_in][n_head][D]
  // (repeat input, after RoPE), keys.npy / values.npy [n_head_kv][n_keys][D] (the reduced key set:
  // sinks | chunk | repeat input, as stored in the cache), h.npy [n_in][n_embd], wo.npy
  // [n_embd][n_head*D] (dequantised), scores.npy [n_head_kv][chunk] (the chunk's scores before any
  // protection) — and meta.json (sizes, chunk range, KVzip+ or not). dir must exist.
  void set_dump(int layer, const std::string& dir) {
    dump_layer_ = layer;
    dump_dir_ = dir;
  }
  // Entries [0, protected_prefix()) of the last scored context were protected (+inf), not scored.
  int64_t protected_prefix() const { return protected_; }

 private:
  struct ChunkObserver : LayerObserver {
    ChunkObserver(KvzipScorer& s, CacheScores& o, int64_t c0_, int64_t c1_, int64_t n_ctx_, int64_t n_in_)
        : sc(s), out(o), c0(c0_), c1(c1_), n_ctx(n_ctx_), n_in(n_in_) {}
    void after_attention(const LayerStep& st, KvCache& cache) override;
    KvzipScorer& sc;
    CacheScores& out;
    int64_t c0, c1, n_ctx, n_in;
    bool dump = false;
    ThreadPool* pool_ptr = nullptr;
  };
  std::vector<int32_t> repeat_prompt(const std::vector<int32_t>& prev_tail, bool first) const;
  void write_dump(const LayerStep& st, int64_t ns, int64_t m, int64_t n_in, int64_t c0, int64_t c1,
                  const std::vector<std::vector<float>>& keys, const std::vector<std::vector<float>>& values,
                  const std::vector<std::vector<float>>& scores) const;

  const Model& model_;
  bool plus_;
  std::unique_ptr<OutputNorms> norms_;  // KVzip+ only, built on first use
  ColumnMaxWorkspace ws_;
  int dump_layer_ = -1;
  std::string dump_dir_;
  int64_t protected_ = 0;
};


}  // namespace kvzap
