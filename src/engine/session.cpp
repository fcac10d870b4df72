#include "engine/session.h"

#include <algorithm>
#include <chrono>

namespace kvzap {

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Session::Session(const Model& model, const SessionOptions& opt) : model_(model) {
  const ModelConfig& c = model.config();
  n_ctx_ = opt.n_ctx > 0 ? opt.n_ctx : std::min<int64_t>(c.n_ctx_train, 8192);
  if (n_ctx_ > (int64_t)c.n_ctx_train * 4) throw Error("context size " + std::to_string(n_ctx_) + " is far beyond the model's training context");
  const int64_t n_batch = opt.n_batch > 0 ? std::min(opt.n_batch, n_ctx_) : n_ctx_;
  pool_ = std::make_unique<ThreadPool>(opt.n_threads > 0 ? opt.n_threads : ThreadPool::default_threads());
  cache_ = std::make_unique<KvCache>(c.n_layer, c.n_head_kv, c.head_dim);
  forward_ = std::make_unique<Forward>(model, n_batch, n_ctx_, *pool_);
  logits_.resize(c.n_vocab);
}

Session::~Session() = default;

void Session::reset() { cache_->clear(); }

void Session::prefill_context(const std::vector<int32_t>& ids, Press* press, const std::string& question) {
  reset();
  if ((int64_t)ids.size() > n_ctx_)
    throw Error("context of " + std::to_string(ids.size()) + " tokens does not fit the context size of " +
                std::to_string(n_ctx_) + " tokens");
  if (!press) {
    observer_ = nullptr;
    feed(ids);
    return;
  }
  press->begin_context(*this);
  observer_ = press;
  feed(ids);
  ContextView view{*this, ids, question};
  press->end_context(view);
  observer_ = press->prunes_decoding() ? press : nullptr;
  cache_->release_pool();
}

void Session::feed(const std::vector<int32_t>& ids) {
  forward_->run(ids.data(), (int64_t)ids.size(), *cache_, LogitsMode::Last, logits_.data(), observer_);
}

GenerateResult Session::generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                                 const std::function<bool(const std::string&)>& on_text) {
  GenerateResult r;
  r.n_prompt = (int64_t)prompt.size();
  if (cache_->n_past() + (int64_t)prompt.size() > n_ctx_)
    throw Error("prompt of " + std::to_string(prompt.size()) + " tokens does not fit the context of " +
                std::to_string(n_ctx_) + " tokens (" + std::to_string(cache_->n_past()) + " already used)");
  const Tokenizer& tok = model_.tokenizer();
  double t0 = now_seconds();
  if (!prompt.empty()) feed(prompt);
  r.prefill_seconds = now_seconds() - t0;

  Sampler sampler(opt.sampling, model_.config().n_vocab);
  Utf8Stream utf8;
  size_t max_stop = 0;
  for (const std::string& s : opt.stop) max_stop = std::max(max_stop, s.size());
  std::string pending;  // decoded text not yet handed out (may be the start of a stop string)
  bool stopped_by_callback = false;
  auto emit = [&](const std::string& s) {
    if (s.empty() || stopped_by_callback) return;
    if (on_text && !on_text(s)) stopped_by_callback = true;
  };

  t0 = now_seconds();
  r.stop_reason = "length";
  for (int i = 0; i < opt.max_new_tokens; i++) {
    const int32_t id = sampler.sample(logits_.data());
    if (opt.stop_at_eog && tok.is_eog(id)) {
      r.stop_reason = "eos";
      break;
    }
    r.tokens.push_back(id);
    pending += utf8.push(tok.token_bytes(id, /*skip_special=*/false));
    bool hit_stop = false;
    for (const std::string& s : opt.stop) {
      const size_t at = pending.find(s);
      if (!s.empty() && at != std::string::npos) {
        pending.resize(at);
        hit_stop = true;
      }
    }
    if (hit_stop) {
      r.text += pending;
      emit(pending);
      pending.clear();
      r.stop_reason = "stop";
      break;
    }
    // Hold back only what could still become a stop string.
    const size_t hold = std::min(pending.size(), max_stop > 0 ? max_stop - 1 : 0);
    std::string out = pending.substr(0, pending.size() - hold);
    // Never split a UTF-8 sequence when holding back.
    while (!out.empty() && (out.size() < pending.size()) && ((unsigned char)pending[out.size()] & 0xC0) == 0x80) out.pop_back();
    pending.erase(0, out.size());
    r.text += out;
    emit(out);
    if (stopped_by_callback) {
      r.stop_reason = "stop";
      break;
    }
    if (cache_->n_past() + 1 > n_ctx_) {
      r.stop_reason = "context";
      break;
    }
    forward_->run(&id, 1, *cache_, LogitsMode::Last, logits_.data(), observer_);
    if (opt.on_token) opt.on_token(i + 1);
  }
  pending += utf8.flush();
  r.text += pending;
  emit(pending);
  r.decode_seconds = now_seconds() - t0;
  return r;
}

}  // namespace kvzap
