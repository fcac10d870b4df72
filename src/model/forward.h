// The transformer forward pass over a per-(layer, KV head) cache. One state object owns every scratch
// buffer and reuses it: the attention scratch is sized for max_ctx at construction, the activation
// buffers start at min(max_batch, 64) rows and double (up to max_batch) when a larger step comes, and
// the per-segment and LM-head buffers grow to the largest step seen; so once the largest step has run
// the forward's own buffers are not reallocated. (KV pages come from the cache's PagePool, which
// calls the allocator when its free list is empty.)
#pragma once
#include <cstdint>
#include <vector>

#include "cache/kv_cache.h"
#include "kernels/matmul.h"
#include "kernels/thread_pool.h"
#include "model/attention.h"
#include "model/model.h"

namespace kvzap {

// What a press sees after layer `layer` ran attention for a step of n_tok new tokens.
struct LayerStep {
  int layer = 0;
  int64_t n_tok = 0;
  const int32_t* pos = nullptr;  // [n_tok] positions of the new tokens
  const float* h = nullptr;      // [n_tok][n_embd] post-norm attention input
  const float* q = nullptr;      // [n_tok][n_head][head_dim] after RoPE (not scaled)
  const float* k = nullptr;      // [n_tok][n_head_kv][head_dim] after RoPE (also stored in the cache)
  const float* v = nullptr;      // [n_tok][n_head_kv][head_dim]
  ThreadPool* pool = nullptr;    // the engine's workers (idle while the observer runs)
  // [n_tok][observer's h_readout_dim] the observer's read-out of h, computed next to the norm; null when
  // it asked for none this layer.
  const float* h_readout = nullptr;
};

class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  // Called after the step's attention, before the output projection: the place to evict.
  virtual void after_attention(const LayerStep& step, KvCache& cache) = 0;
  // Optional: a per-token function of h (a linear scorer's prediction) that the forward evaluates right
  // after the attention norm writes each row, while the row is still in L1, instead of the observer
  // reading all of h back from memory after the attention. Width 0 = none. h_readout runs on the
  // forward's worker threads, on blocks of a few rows, so it must be const and thread-safe.
  virtual int h_readout_dim(int layer) const { (void)layer; return 0; }
  // h: [n][n_embd] consecutive rows of one segment, out: [n][h_readout_dim].
  virtual void h_readout(int layer, const float* h, int64_t n, float* out) const { (void)layer, (void)h, (void)n, (void)out; }
};

enum class LogitsMode { None, Last, All };

// What an observer saw of one forward step of one segment, at every layer (engine/context_recording.h
// records them): positions, and per layer the step's h, q, k and v as LayerStep holds them.
struct RecordedStep {
  int64_t n_tok = 0;
  std::vector<int32_t> pos;  // [n_tok]
  struct Layer {
    std::vector<float> h;  // [n_tok][n_embd]
    std::vector<float> q;  // [n_tok][n_head][head_dim]
    std::vector<float> k;  // [n_tok][n_head_kv][head_dim]
    std::vector<float> v;  // [n_tok][n_head_kv][head_dim]
  };
  std::vector<Layer> layers;  // [n_layer]
};

// One sequence's part of a batched step: n new tokens appended to `cache` at positions
// cache->n_past() .. +n, watched by `observer` (may be null).
struct ForwardSegment {
  KvCache* cache = nullptr;
  const int32_t* tokens = nullptr;  // [n]
  int64_t n = 0;
  LayerObserver* observer = nullptr;
  LogitsMode mode = LogitsMode::None;
  float* logits = nullptr;  // Last: [n_vocab]; All: [n][n_vocab]
};

class Forward {
 public:
  Forward(const Model& model, int64_t max_batch, int64_t max_ctx, ThreadPool& pool);

  // Runs tokens at positions cache.n_past() .. +n through the model, appending their K/V to the cache
  // and advancing cache.n_past(). Inputs longer than max_batch run as several steps.
  // logits: LogitsMode::Last -> [n_vocab] for the final token; All -> [n][n_vocab].
  void run(const int32_t* tokens, int64_t n, KvCache& cache, LogitsMode mode, float* logits,
           LayerObserver* observer = nullptr);

  // One batched step: every segment's tokens go through the model together (each weight matrix is read
  // once for all of them); attention and the observer run per segment on its own cache. The segments'
  // caches must be distinct; their tokens sum to at most max_batch(), and each fits max_ctx().
  void step_batch(const ForwardSegment* segs, int n_segs);

  // Replays a recorded step into `cache` under `observer` without computing anything: the same cache
  // operations in the same order as step_batch (per layer: append the step's K/V, set the sequence
  // length, the observer with the recorded tensors and its h read-out, the sliding-window frees), so
  // an observer that evicts nothing before the step ends leaves cache and itself exactly as the step
  // that was recorded would have. The step must continue the cache (its first position = n_past()).
  void replay_step(const RecordedStep& step, KvCache& cache, LayerObserver* observer);

  int64_t max_batch() const { return max_batch_; }
  int64_t max_ctx() const { return max_ctx_; }
  const Model& model() const { return model_; }
  ThreadPool& pool() { return pool_; }
  MatmulScratch& matmul_scratch() { return mm_scratch_; }

  // RoPE tables, shared with scorers that recompute queries: [max_ctx][head_dim/2] rows of the global
  // layers' table, or of layer `layer`'s (sliding-window layers may have their own base).
  const float* rope_cos(int32_t pos, int layer = -1) const {
    return rope_tables_[layer < 0 ? 0 : layer_rope_[(size_t)layer]].cos.data() + (size_t)pos * (cfg_.head_dim / 2);
  }
  const float* rope_sin(int32_t pos, int layer = -1) const {
    return rope_tables_[layer < 0 ? 0 : layer_rope_[(size_t)layer]].sin.data() + (size_t)pos * (cfg_.head_dim / 2);
  }

 private:
  // Grows the activation buffers to hold n tokens (only when a larger step than ever before comes).
  void ensure_batch(int64_t n);
  // step_batch's pieces, in order. check_step validates the segments (throws before anything runs) and
  // returns the step's rows; lay_out_rows sizes the buffers and fills seg_row0_ and pos_; plan_attention
  // builds att_tasks_ (the same for every layer); embed_rows writes x_; per layer, attention_block
  // (norm, Q/K/V, RoPE, the K/V append, attention, observers, window frees, output projection) then
  // ffn_block; write_logits runs the LM head for the segments that want logits.
  int64_t check_step(const ForwardSegment* segs, int n_segs);
  void lay_out_rows(const ForwardSegment* segs, int n_segs, int64_t n);
  void plan_attention(const ForwardSegment* segs, int n_segs);
  void embed_rows(const ForwardSegment* segs, int n_segs, int64_t n);
  void attention_block(int layer, const ForwardSegment* segs, int n_segs, int64_t n);
  void ffn_block(int layer, int64_t n);
  void write_logits(const ForwardSegment* segs, int n_segs);
  void attention(int layer, const ForwardSegment* segs, int n_segs);
  // Attention work items of the current step, rebuilt once per step: (segment, KV head, query-head
  // range, query block).
  struct AttentionTask {
    int32_t seg, hk, g0, g1;
    int64_t t0, t1;  // rows of the segment
  };
  // One task's block: gathers its query rows (scaled, f16-rounded for an f16 cache), visible counts and
  // window starts into q [rows][D], visible, first; returns the block (its out is null).
  AttentionBlock gather_task(int layer, const ForwardSegment* segs, const AttentionTask& tk, float* q,
                                    int64_t* visible, int64_t* first) const;
  // Copies a task's output rows [rows][D] into attn_.
  void scatter_task(const AttentionTask& tk, const float* out);
  // Decode steps with fewer attention tasks than the threads can balance (one sequence: as many tasks
  // as KV heads) spread each task's pages and chunks over the threads instead (attend_* pieces).
  void attention_split(int layer, const ForwardSegment* segs);

  const Model& model_;
  const ModelConfig& cfg_;
  ThreadPool& pool_;
  int64_t max_batch_, max_ctx_;
  int64_t batch_capacity_ = 0;  // tokens the activation buffers currently hold
  MatmulScratch mm_scratch_;
  // Activations, [B][...] with B = batch_capacity_ (<= max_batch):
  std::vector<float> x_;      // [B][n_embd] residual stream
  std::vector<float> xn_;     // [B][n_embd] normed input (= h for the attention block)
  std::vector<float> q_;      // [B][n_head][D]
  std::vector<float> k_;      // [B][n_head_kv][D]
  std::vector<float> v_;      // [B][n_head_kv][D]
  std::vector<float> attn_;   // [B][n_head][D]
  std::vector<float> proj_;   // [B][n_embd]
  std::vector<float> gate_;   // [B][n_ff]
  std::vector<float> up_;     // [B][n_ff]
  std::vector<int32_t> pos_;  // [B] position of each row
  std::vector<int64_t> seg_row0_;       // [n_segs] first row of each segment in the step
  std::vector<int> readout_dim_;        // [n_segs] width of the segment's observer read-out (0 = none)
  std::vector<int64_t> readout_at_;     // [n_segs] where the segment's read-outs start in readout_
  std::vector<float> readout_;          // [sum of n * readout_dim] the observers' read-outs of h
  std::vector<AttentionTask> att_tasks_;
  std::vector<float> logits_rows_;      // [n_last][n_vocab] LM-head output of Last segments
  std::vector<int32_t> last_rows_;      // [n_last] rows whose logits are wanted
  struct RopeTable {
    float base, freq_scale;
    std::vector<float> cos, sin;
  };
  std::vector<RopeTable> rope_tables_;  // [0]: the global layers' (cfg.rope_base), then any other
  std::vector<int> layer_rope_;         // [n_layer] index into rope_tables_
  std::vector<int32_t> windows_;        // [n_layer] sliding windows (0 = global); empty if none
  std::vector<std::vector<int64_t>> att_first_;       // [rows] first visible entry (sliding window)
  // Attention scratch per thread: scores [rows][max_ctx], one K/V page in f32 [page][D].
  int64_t att_rows_;
  std::vector<std::vector<float>> att_scores_;
  std::vector<std::vector<float>> att_kv_;
  std::vector<std::vector<float>> att_q_, att_out_;  // [rows][D] gathered queries / outputs
  std::vector<std::vector<int64_t>> att_visible_;     // [rows]
  std::vector<std::vector<float>> att_partial_;       // [rows][D] one chunk's weighted values
  // Split attention (attention_split), sized at construction for kMaxSplitTasksPerThread x threads tasks
  // of n_group rows: whether this step runs it, then per task its gathered block and buffers.
  bool att_split_step_ = false;
  int64_t split_max_chunks_ = 0;
  std::vector<float> split_q_;                         // [task][G][D]
  std::vector<int64_t> split_visible_, split_first_;   // [task][G]
  std::vector<float> split_scores_;                    // [task][G][max_ctx]
  std::vector<float> split_partials_;                  // [task][max chunks][G][D]
  std::vector<float> split_out_;                       // [task][G][D]
  std::vector<AttentionBlock> split_blocks_;           // [task]
  std::vector<AttentionExtent> split_extents_;         // [task]
};

}  // namespace kvzap
