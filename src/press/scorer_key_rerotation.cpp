// "key_rerotation_<press>" (kvpress KeyRerotationPress(press); docs/ALGORITHMS.md §8.36): the press compresses
// the context under its ratio as it would alone, then every kept key is rotated as if its token sat at its
// rank among the kept entries of its (layer, head) instead of its original position, so each head's kept keys
// have contiguous positions 0..n_kept-1 (SinkCache and FINCH do this). Queries keep their own positions: a
// question at position T (the full context's length) sees the kept keys at distances T - rank, as in kvpress's
// pipeline, whose position ids continue after the full context.
//
// RoPE rotations compose, so the stored key, rotated for position p, goes to rank i by one rotation of i - p
// (always <= 0: kept slots keep their order), which is undoing the rotation of p - i. Only the key changes; the
// cache's position of the entry stays the token's own, which the causal masks and later presses read. Only
// global-attention layers are re-rotated: a sliding-window layer's entries are positioned by its window.
#include <algorithm>

#include "kvzap/error.h"
#include "model/model.h"
#include "press/baseline_math.h"
#include "press/press.h"

namespace kvzap {
namespace {

class KeyRerotationPress : public Press {
 public:
  KeyRerotationPress(std::unique_ptr<Press> inner, const ModelConfig& cfg)
      : inner_(std::move(inner)), rope_(cfg), key_(cfg.head_dim) {}
  KeyRerotationPress(const KeyRerotationPress& o)
      : Press(o), inner_(o.inner_->clone()), rope_(o.rope_), key_(o.key_) {}

  std::string name() const override { return "key_rerotation (" + inner_->name() + ")"; }
  void begin_context(ContextRunner& runner) override {
    inner_->keep_scores(keep_scores_);
    inner_->begin_context(runner);
  }
  void after_attention(const LayerStep& step, KvCache& cache) override { inner_->after_attention(step, cache); }
  int h_readout_dim(int layer) const override { return inner_->h_readout_dim(layer); }
  void h_readout(int layer, const float* h, int64_t n, float* out) const override { inner_->h_readout(layer, h, n, out); }
  bool prunes_decoding() const override { return false; }
  std::unique_ptr<Press> clone() const override { return std::make_unique<KeyRerotationPress>(*this); }

  void end_context(ContextView& ctx) override {
    inner_->end_context(ctx);
    if (keep_scores_) copy_score_log(*inner_);  // the scores it judged by (Sequence.press_scores)
    KvCache& cache = ctx.cache;
    for (int l = 0; l < cache.n_layer(); l++) {
      if (!judged_layer(cache, l)) continue;
      for (int h = 0; h < cache.n_head_kv(); h++) {
        const int64_t len = cache.length(l, h);
        if (len > 0) rope_.reserve(cache.position_at(l, h, len - 1) + 1);
        for (int64_t i = 0; i < len; i++) {
          const int32_t p = cache.position_at(l, h, i);
          if (p == i) continue;  // nothing evicted before it: already at its rank
          cache.key_row(l, h, i, key_.data());
          rope_.unrotate(key_.data(), p - (int32_t)i, l);
          cache.set_key_row(l, h, i, key_.data());
        }
      }
    }
  }

 private:
  std::unique_ptr<Press> inner_;
  RopeTable rope_;
  std::vector<float> key_;  // [head_dim] one key being re-rotated
};

}  // namespace

std::unique_ptr<Press> make_key_rerotation_press(const PressSpec& spec, const std::string& inner_name, const Model& model) {
  if (press_traits(inner_name).own_budget)
    throw Error("press '" + inner_name + "' sets its own budget: key_rerotation_" + inner_name + " needs a press that takes a ratio");
  if (spec.has_threshold)
    throw Error("press '" + spec.name + "' takes a ratio (kvpress KeyRerotationPress wraps a ScorerPress's "
                "compression_ratio), not a threshold");
  if (!spec.has_ratio) throw Error("press '" + spec.name + "' needs a ratio");
  if (spec.decoding) throw Error("press '" + spec.name + "' compresses the context only: it cannot prune while decoding");
  PressSpec inner = spec;
  inner.name = inner_name;
  std::unique_ptr<Press> press = make_press(inner, model);
  if (press->prunes_decoding()) throw Error("internal: key_rerotation's inner press prunes while decoding");
  return std::make_unique<KeyRerotationPress>(std::move(press), model.config());
}

}  // namespace kvzap
