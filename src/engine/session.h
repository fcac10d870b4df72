// A conversation with one model: its KV cache, forward state, sampler and (optional) press.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "engine/sampler.h"
#include "model/forward.h"
#include "press/press.h"

namespace kvzap {

struct SessionOptions {
  int n_threads = 0;      // 0 = physical cores
  int64_t n_ctx = 0;      // 0 = min(model's training context, 8192)
  int64_t n_batch = 0;    // tokens per forward step; 0 = n_ctx (a whole prompt is one step)
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

  const Model& model() const { return model_; }
  KvCache& cache() { return *cache_; }
  Forward& forward() { return *forward_; }
  int64_t n_ctx() const { return n_ctx_; }
  int n_threads() const { return pool_->size(); }

  // The observer (a press) sees every layer step of prefill and decode until changed.
  void set_observer(LayerObserver* obs) { observer_ = obs; }
  void reset();
  // Forgets every position >= pos (e.g. a question and its answer); logits() is stale until the next feed.
  void rewind(int64_t pos) { cache_->truncate((int32_t)pos); }

  // kvpress pipeline: clears the cache, prefills a context under `press` (which evicts during or right
  // after it), then keeps the press watching later tokens only if it prunes while decoding.
  // `question` is handed to query-aware scorers only.
  void prefill_context(const std::vector<int32_t>& ids, Press* press, const std::string& question = "");

  // Feeds tokens; afterwards logits() holds the distribution after the last one.
  void feed(const std::vector<int32_t>& ids);
  const float* logits() const { return logits_.data(); }

  // Prefills `prompt` (unless empty) and generates; on_text receives UTF-8-complete text pieces as
  // they are produced and returns false to stop.
  GenerateResult generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                          const std::function<bool(const std::string&)>& on_text = nullptr);

 private:
  const Model& model_;
  int64_t n_ctx_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<Forward> forward_;
  std::vector<float> logits_;  // [n_vocab]
  LayerObserver* observer_ = nullptr;
};

}  // namespace kvzap
