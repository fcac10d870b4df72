// From a parsed request to a Job: chat template, tokenizing, the context-length check, the press
// (server default overridden by the request's kv_compression, validated by make_press) and the
// prefix-cache key. Runs on HTTP threads: it only reads the model.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "model/model.h"
#include "server/job.h"
#include "server/lru.h"
#include "server/request.h"

namespace kvzap::server {

struct ServerDefaults {
  bool has_press = false;
  PressSpec press;               // the server's --press settings
  // Threshold presses judge a prompt every this many positions while prefilling it (serve
  // --prefill-evict-every), so a request holds about its pruned size, not its whole prompt; a request's
  // kv_compression.prefill_evict_every overrides it. Ratio presses judge whole contexts (0 for them).
  int prefill_evict_every = 0;
  RequestLimits limits;
  double request_timeout_s = 600;   // per-request time limit
};

// Makes presses, cloning a prototype per settings string. The prototypes are a bounded LRU (clients choose
// the settings, so the set is unbounded); surrogate weights are shared per folder (press/scorer_kvzap.cpp),
// so a new threshold costs a press, not a copy of the weights. Thread-safe.
class PressFactory {
 public:
  static constexpr size_t kDefaultPrototypes = 32;
  explicit PressFactory(const Model& model, size_t max_prototypes = kDefaultPrototypes)
      : model_(model), prototypes_(max_prototypes), seen_(kRememberedKeys) {}
  static constexpr size_t kRememberedKeys = 256;
  // Throws ApiError 400 with make_press's message for unknown presses or bad settings. `repeated` (when
  // given) says whether `key` was among the last kRememberedKeys distinct settings asked for.
  std::unique_ptr<Press> make(const PressSpec& o, const std::string& key, bool* repeated = nullptr);
  size_t n_prototypes() {
    std::lock_guard<std::mutex> lock(mu_);
    return prototypes_.size();
  }

 private:
  const Model& model_;
  std::mutex mu_;
  LruCache<std::string, std::unique_ptr<Press>> prototypes_;
  LruCache<std::string, char> seen_;  // settings keys recently asked for (the prefix cache's doorkeeper)
};

// The effective press for a request: none, the server default, or the request's kv_compression on top.
// Returns false for "no press". Throws ApiError on inconsistent settings.
bool resolve_press(const std::optional<KvCompressionSpec>& spec, const ServerDefaults& d, PressSpec& out);
// Throws ApiError 400 when the press cannot work on this prompt: SnapKV's 64-token window, KVzip's
// repeat pass that must fit the context (n_ctx). Such failures inside a batch step would be 500s that
// end every request of the step.
void check_prompt_fits_press(const PressSpec& o, int64_t n_prompt, int64_t n_ctx);
// A canonical text of the settings, for prefix reuse ("none" without a press).
std::string press_settings_key(bool has_press, const PressSpec& o);

// The prompt's token ids, as `kvzap generate` builds them: chat -> the model's template (parsing
// special tokens); completion text -> raw text with BOS per the model; completion ids -> as given.
std::vector<int32_t> prompt_tokens(const CompletionRequest& r, const Tokenizer& tok);

std::unique_ptr<Job> prepare_job(const CompletionRequest& r, const Model& model, int64_t n_ctx, const ServerDefaults& d,
                                 PressFactory& presses, int tenant, const std::string& id);

}  // namespace kvzap::server
