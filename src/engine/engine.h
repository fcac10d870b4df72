// The many-sequence engine. One Engine holds the model, one persistent thread pool, the forward state
// and one shared KV page pool with a byte budget; many Sequences live in it, each with its own
// per-(layer, KV head) streams, press (and the press's state), sampler, UTF-8 stream and stop strings.
//
// A forward step runs a set of Segments — one decode token for each of many sequences and/or prefill
// chunks of others — through the model once: every weight matrix is read once per step for all of the
// segments' tokens, attention runs per (sequence, KV head, query block) over that sequence's own kept
// entries, and each sequence's press sees its own slice of the step.
//
// Threading: an Engine and its Sequences are driven from one thread (the owner: the CLI's main thread or
// the server's scheduler loop). Nothing here locks; read-only accounting (pool().bytes_in_use() etc.) may
// be copied out by the owner for other threads.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "cache/page_pool.h"
#include "engine/sampler.h"
#include "engine/stop_matcher.h"
#include "model/forward.h"
#include "press/press.h"
#include "tokenizer/tokenizer.h"

namespace kvzap {

class Sequence;
class ContextRecording;

struct EngineOptions {
  int n_threads = 0;            // 0 = physical cores
  int64_t n_ctx = 0;            // per-sequence context limit; 0 = min(model's training context, 8192)
  int64_t n_batch = 0;          // most tokens in one forward step (all segments together); 0 = n_ctx
  int64_t kv_budget_bytes = 0;  // shared KV page budget; 0 = default_kv_budget()
  KvType kv_type = KvType::F16; // element type of every sequence's cached K/V (F32: 2x bytes per token)
};

// The memory the system reports available (MemAvailable), in bytes; 0 when it cannot be read.
int64_t memory_available_bytes();
// The default KV budget: half of the memory the system reports available (MemAvailable) once the model
// is mapped, so KV pages never push the machine into swap; at least 64 MiB.
int64_t default_kv_budget(const Model& model);
// "512MiB", "2G", "1.5GiB", "1000000" (bytes). Throws kvzap::Error on anything else.
int64_t parse_byte_size(const std::string& text);

enum class SegmentStatus {
  Ok,               // ran
  OutOfKvMemory,    // not run: its new KV pages do not fit the pool's budget (nothing changed for it)
};

struct Segment {
  Sequence* seq = nullptr;
  const int32_t* tokens = nullptr;  // [n]
  int64_t n = 0;
  // Last: seq->logits() holds the distribution after the segment's last token. All: all_logits
  // receives [n][n_vocab]. None: no LM head for this segment (a prefill chunk that is not the last).
  LogitsMode logits = LogitsMode::Last;
  float* all_logits = nullptr;
  SegmentStatus status = SegmentStatus::Ok;  // out
};

// What a generation step produced for one sequence (Sequence::sample_next).
struct TokenEvent {
  int32_t id = -1;          // the sampled token; feed it in the next step unless finished
  std::string text;         // UTF-8-complete text released by this token (may be empty)
  bool finished = false;    // true: do not feed `id`; finish_reason says why
  std::string finish_reason;  // "eos" | "stop" | "length" | "context"
};

struct GenerationOptions {
  int max_new_tokens = 256;
  SamplerOptions sampling;
  std::vector<std::string> stop;  // stop strings (not included in the output)
  bool stop_at_eog = true;
};

class Engine : public ContextRunner {
 public:
  Engine(const Model& model, const EngineOptions& opt);
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Model& model() const { return model_; }
  int64_t n_ctx() const override { return n_ctx_; }
  int64_t n_batch() const { return n_batch_; }
  int n_threads() const;
  ThreadPool& threads() override { return *threads_; }
  Forward& forward() { return *forward_; }
  PagePool& pages() { return *pages_; }
  const PagePool& pages() const { return *pages_; }
  KvType kv_type() const { return kv_type_; }
  // KV bytes one token takes in every stream of a sequence (all layers and KV heads, keys and values;
  // page rounding aside): twice as many with F32 as with F16.
  int64_t kv_bytes_per_token() const;
  // Tokens of one unpruned sequence the whole budget holds (0 when unlimited).
  int64_t kv_budget_tokens() const;

  // A new, empty sequence whose streams take pages from this engine's pool.
  std::unique_ptr<Sequence> new_sequence();

  // One batched forward step. Segments must belong to distinct sequences of this engine, sum to at most
  // n_batch() tokens, and fit each sequence's context (throws kvzap::Error otherwise: a caller bug or bad
  // input, checked before anything runs). Segments are admitted in order; one whose KV pages would
  // exceed the budget is skipped with status OutOfKvMemory, and later ones may still run. A context
  // segment of a sequence whose press frees entries while prefilling is cut at the press's next eviction
  // boundary (Sequence::context_step_limit): s.n comes back smaller, no logits are computed for it, and
  // the caller feeds the rest in later steps.
  void step(std::span<Segment> segments);

  // Feeds n tokens of one sequence in n_batch chunks, or smaller where step() cuts them (LogitsMode as in Segment). Throws
  // KvBudgetExceeded when the pool cannot hold them (the tokens fed before stay fed).
  void feed(Sequence& seq, const int32_t* tokens, int64_t n, LogitsMode mode = LogitsMode::Last,
            float* all_logits = nullptr);

  // Shared-prefill evaluation (engine/context_recording.h). prefill_recorded: feeds a context into `seq`
  // (empty, no press) and records every layer step and the final logits into `rec`. replay: puts the
  // recorded context into `seq` (empty, after begin_context(), so its press watches) as feeding it would;
  // throws KvBudgetExceeded when its pages do not fit the budget (nothing replayed past that step).
  void prefill_recorded(Sequence& seq, const std::vector<int32_t>& ids, ContextRecording& rec);
  void replay(Sequence& seq, const ContextRecording& rec);

  // ContextRunner: scratch forward passes for context scorers (KVzip's repeat pass).
  int64_t max_step_tokens() const override { return n_batch_; }
  void run_on_scratch_fork(const KvCache& cache, const int32_t* tokens, int64_t n, LayerObserver& obs) override;

 private:
  const Model& model_;
  int64_t n_ctx_, n_batch_;
  KvType kv_type_;
  std::unique_ptr<ThreadPool> threads_;
  std::unique_ptr<PagePool> pages_;
  std::unique_ptr<Forward> forward_;
  std::vector<ForwardSegment> fwd_segments_;  // scratch for step()
};

class Sequence {
 public:
  ~Sequence();
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  Engine& engine() { return engine_; }
  KvCache& cache() { return cache_; }
  const KvCache& cache() const { return cache_; }
  int64_t n_past() const { return cache_.n_past(); }
  // Distribution after the last token of the last segment run with LogitsMode::Last: [n_vocab].
  const float* logits() const { return logits_.data(); }
  float* mutable_logits() { return logits_.data(); }

  // The press of this sequence (owned), or one the caller keeps alive (attach_press); null = none.
  void set_press(std::unique_ptr<Press> press);
  // A press for a sequence whose context is already in (a restored cache file): it judges only what
  // comes next, and only if it prunes while decoding.
  void set_press_after_context(std::unique_ptr<Press> press);
  void attach_press(Press* press);
  Press* press() { return press_; }
  // Any observer for the next steps, replacing what the context protocol chose (null = none).
  void set_observer(LayerObserver* obs) { observer_ = obs; }

  // Context protocol, told explicitly to the press: begin_context before prefilling a context into this
  // (empty) sequence, end_context once the whole context is in (ratio presses evict here; context
  // scorers may ask the engine for scratch forks). After end_context the press keeps watching only if it
  // prunes while decoding. `question` goes to query-aware scorers only.
  void begin_context();
  void end_context(const std::vector<int32_t>& context_ids, const std::string& question = "");
  bool in_context() const { return in_context_; }
  // Most tokens the next step may take for this sequence without crossing an eviction boundary of its
  // press inside a context (Press::context_eviction_interval); 0 = no limit.
  int64_t context_step_limit() const;
  // The observer for the next step (the press while it watches, else null).
  LayerObserver* observer() { return observer_; }

  // Copy-on-write fork: shares every KV page (reference counts), copies the press state (a fork of a
  // decoding press judges its own tokens independently) and the logits. Generation state is not copied.
  std::unique_ptr<Sequence> fork() const;

  // Forgets every position >= pos (a question and its answer); logits() is stale until the next step.
  void rewind(int64_t pos);
  // Empties the sequence (pages go back to the pool) and forgets the press's state.
  void reset();

  // Generation: start_generation resets the sampler (seeded), UTF-8 stream and stop-string state;
  // sample_next samples from logits() and applies end-of-generation, stop strings, the token limit and
  // the context limit. Text held back (a possible stop-string prefix, incomplete UTF-8) is released by
  // later events or by the finishing one.
  void start_generation(const GenerationOptions& opt);
  TokenEvent sample_next();
  int n_generated() const { return n_generated_; }
  const std::vector<int32_t>& generated() const { return generated_; }

 private:
  friend class Engine;
  explicit Sequence(Engine& engine);

  Engine& engine_;
  KvCache cache_;
  std::vector<float> logits_;  // [n_vocab]
  std::unique_ptr<Press> owned_press_;
  Press* press_ = nullptr;
  LayerObserver* observer_ = nullptr;
  bool in_context_ = false;
  // Generation state.
  GenerationOptions gen_;
  std::unique_ptr<Sampler> sampler_;
  StopMatcher stops_;
  int n_generated_ = 0;
  std::vector<int32_t> generated_;
};

}  // namespace kvzap
