#include "engine/context_recording.h"

#include "kvzap/error.h"

namespace kvzap {

ContextRecording::ContextRecording(const ModelConfig& cfg)
    : E_(cfg.n_embd),
      Dq_((int64_t)cfg.n_head * cfg.head_dim),
      Dkv_((int64_t)cfg.n_head_kv * cfg.head_dim),
      n_layer_(cfg.n_layer) {}

void ContextRecording::clear() {
  for (RecordedStep& s : steps_) spare_.push_back(std::move(s));
  steps_.clear();
  logits_.clear();
}

void ContextRecording::after_attention(const LayerStep& step, KvCache& cache) {
  (void)cache;
  const int64_t n = step.n_tok;
  if (step.layer == 0) {
    RecordedStep s;
    if (!spare_.empty()) {
      s = std::move(spare_.back());
      spare_.pop_back();
    }
    s.n_tok = n;
    s.pos.assign(step.pos, step.pos + n);
    s.layers.resize((size_t)n_layer_);
    steps_.push_back(std::move(s));
  }
  if (steps_.empty() || steps_.back().n_tok != n || step.layer < 0 || step.layer >= n_layer_)
    throw Error("internal: a context recording saw a step out of order");
  RecordedStep::Layer& L = steps_.back().layers[(size_t)step.layer];
  L.h.assign(step.h, step.h + n * E_);
  L.q.assign(step.q, step.q + n * Dq_);
  L.k.assign(step.k, step.k + n * Dkv_);
  L.v.assign(step.v, step.v + n * Dkv_);
}

int64_t ContextRecording::n_tokens() const {
  int64_t n = 0;
  for (const RecordedStep& s : steps_) n += s.n_tok;
  return n;
}

int64_t ContextRecording::bytes() const {
  int64_t b = 0;
  for (const RecordedStep& s : steps_)
    for (const RecordedStep::Layer& L : s.layers)
      b += (int64_t)(L.h.size() + L.q.size() + L.k.size() + L.v.size()) * (int64_t)sizeof(float);
  return b;
}

int64_t ContextRecording::bytes_for(const ModelConfig& cfg, int64_t n_tokens) {
  const int64_t per_layer = (int64_t)cfg.n_embd + ((int64_t)cfg.n_head + 2 * (int64_t)cfg.n_head_kv) * cfg.head_dim;
  return n_tokens * cfg.n_layer * per_layer * (int64_t)sizeof(float);
}

}  // namespace kvzap
