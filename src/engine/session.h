// One conversation on its own engine: the CLI's view of the many-sequence engine (engine/engine.h)
// when only one sequence runs. Owns an Engine (thread pool, forward state, page pool) and one Sequence.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace kvzap {

struct SessionOptions {
  int n_threads = 0;      // 0 = physical cores
  int64_t n_ctx = 0;      // 0 = min(model's training context, 8192)
  int64_t n_batch = 0;    // tokens per forward step; 0 = n_ctx (a whole prompt is one step)
  int64_t kv_budget_bytes = -1;  // KV page budget; -1 = unlimited (one sequence), 0 = the engine default
  KvType kv_type = KvType::F16;  // cached K/V element type (F32: exact K/V, 2x the bytes per token)
};

struct GenerateOptions {
  int max_new_tokens = 256;
  SamplerOptions sampling;
  std::vector<std::string> stop;  // stop strings (not included in the output)
  bool stop_at_eog = true;
  // Called after each generated token has been fed (cache state includes it): step = 1, 2, ...
  std::function<void(int step)> on_token;
};

struct GenerateResult {
  std::string text;
  std::vector<int32_t> tokens;  // generated ids (end-of-generation token excluded)
  std::string stop_reason;      // "eos" | "stop" | "length" | "context"
  int64_t n_prompt = 0;
  double prefill_seconds = 0, decode_seconds = 0;
};

class Session {
 public:
  Session(const Model& model, const SessionOptions& opt);
  ~Session();

  const Model& model() const { return engine_->model(); }
  Engine& engine() { return *engine_; }
  Sequence& sequence() { return *seq_; }
  KvCache& cache() { return seq_->cache(); }
  Forward& forward() { return engine_->forward(); }
  int64_t n_ctx() const { return engine_->n_ctx(); }
  int n_threads() const { return engine_->n_threads(); }

  // The observer (a press) sees every layer step of prefill and decode until changed.
  void set_observer(LayerObserver* obs) { seq_->set_observer(obs); }
  void reset() { seq_->reset(); }
  // Forgets every position >= pos (e.g. a question and its answer); logits() is stale until the next feed.
  void rewind(int64_t pos) { seq_->rewind(pos); }

  // kvpress pipeline: clears the cache, prefills a context under `press` (which evicts during or right
  // after it), then keeps the press watching later tokens only if it prunes while decoding.
  // `question` is handed to query-aware scorers only. The caller keeps `press` alive.
  void prefill_context(const std::vector<int32_t>& ids, Press* press, const std::string& question = "");

  // Feeds tokens; afterwards logits() holds the distribution after the last one.
  void feed(const std::vector<int32_t>& ids);
  const float* logits() const { return seq_->logits(); }

  // Prefills `prompt` (unless empty) and generates; on_text receives UTF-8-complete text pieces as
  // they are produced and returns false to stop.
  GenerateResult generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                          const std::function<bool(const std::string&)>& on_text = nullptr);

  // The same loop on any sequence of an engine (a fork, in the pipeline).
  static GenerateResult generate_on(Sequence& seq, const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                                    const std::function<bool(const std::string&)>& on_text = nullptr);

 private:
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Sequence> seq_;
};

}  // namespace kvzap
