// "decoding_<press>" (kvpress DecodingPress(base_press, compression_interval, target_size); docs/ALGORITHMS.md
// §8.33): nothing is evicted while the context is prefilled; after it, every `compression_interval` steps of
// a layer (the question's step, then one per generated token) that layer's cache is cut to `target_size`
// entries per head, the base press's best-scored ones, and the rest is freed for real. kvpress sets its base
// press's compression_ratio to the value that leaves int(T (1 - ratio)) = target_size of T entries; keeping
// the target_size best is that selection, without searching for the ratio. A step of target_size tokens or
// more also compresses (kvpress does, for any q_len >= target_size).
//
// "compression_ratio_decoding_<press>" (kvpress CompressionRatioDecodingPress(base_press,
// target_compression_ratio, compression_interval)) is the same press whose target, at each step, is
// max(1, int(P (1 - target_compression_ratio))) for P = the step's last position + 1 (every token seen so far).
//
// The base press must score token by token (knorm, kvzap-linear, ...): each entry's score is taken once, when
// its token goes through the layer (context included), and kept beside the stream until the entry is evicted.
// kvpress rescores the whole cache at each compression, which for these presses gives the same scores (a
// function of the token's own key or hidden state). Presses that score the whole context (SnapKV, KeyDiff,
// ...) would need kvpress's buffer of recent hidden states (hidden_states_buffer_size): not done, refused.
#include <algorithm>
#include <cstdio>
#include <limits>

#include "kvzap/error.h"
#include "model/model.h"
#include "press/policy.h"

namespace kvzap {
namespace {

class DecodingPress : public Press {
 public:
  // target_ratio < 0: a fixed target of `target` entries; else the target follows the tokens seen.
  DecodingPress(std::shared_ptr<Scorer> scorer, const PressSpec& opt, int64_t interval, int64_t target,
                double target_ratio)
      : scorer_(std::move(scorer)), name_(opt.name), interval_(interval), target_(target), target_ratio_(target_ratio),
        sliding_layers_(opt.sliding_layers) {
    if (!scorer_ || !scorer_->per_step()) throw Error("internal: decoding_<press> needs a per-token scorer");
    if (interval_ < 1) throw Error("compression_interval must be >= 1, got " + std::to_string(interval_));
    if (target_ratio_ < 0 && target_ < 1) throw Error("target_size must be >= 1, got " + std::to_string(target_));
    if (!(target_ratio_ < 1)) throw Error("target_compression_ratio must be in [0, 1), got " + std::to_string(target_ratio_));
  }

  std::string name() const override {
    char buf[200];
    if (target_ratio_ >= 0)
      std::snprintf(buf, sizeof buf, "%s (every %lld decoding steps to ratio %g of the tokens seen)", name_.c_str(),
                    (long long)interval_, target_ratio_);
    else
      std::snprintf(buf, sizeof buf, "%s (every %lld decoding steps to %lld tokens)", name_.c_str(),
                    (long long)interval_, (long long)target_);
    return buf;
  }
  void begin_context(ContextRunner&) override {
    streams_.clear();
    steps_.clear();
    score_log_.clear();
    scorer_->reset();
    in_context_ = true;
  }
  // The context is left whole (kvpress's pipeline prefills it without the press); counting starts here.
  void end_context(ContextView&) override {
    in_context_ = false;
    std::fill(steps_.begin(), steps_.end(), 0);
  }
  bool prunes_decoding() const override { return true; }
  // The scores and step counters are copied; the scorer is stateless between steps (shared).
  std::unique_ptr<Press> clone() const override { return std::make_unique<DecodingPress>(*this); }
  int h_readout_dim(int layer) const override { return scorer_->h_readout_dim(layer); }
  void h_readout(int layer, const float* h, int64_t n, float* out) const override { scorer_->h_readout(layer, h, n, out); }

  void after_attention(const LayerStep& step, KvCache& cache) override {
    if (step.n_tok <= 0) return;
    if (!sliding_layers_ && cache.layer_window(step.layer) > 0) return;  // its window already bounds it
    const int L = cache.n_layer(), H = cache.n_head_kv();
    if (streams_.size() != (size_t)L * H) {
      streams_.assign((size_t)L * H, Stream{});
      steps_.assign((size_t)L, 0);
    }
    const int64_t n = step.n_tok;
    if (step_scores_.size() < (size_t)(H * n)) step_scores_.resize((size_t)(H * n));
    scorer_->score_step(step, cache, step_scores_.data());  // [H][n]
    ScoreLog* log = scores_to_keep(cache);
    for (int h = 0; h < H; h++) {
      Stream& s = streams_[(size_t)step.layer * H + h];
      const float* sc = step_scores_.data() + (size_t)h * n;
      s.pos.insert(s.pos.end(), step.pos, step.pos + n);
      s.score.insert(s.score.end(), sc, sc + n);
      if (log)
        for (int64_t t = 0; t < n; t++) log->put(step.layer, h, step.pos[t], sc[t]);
      // Something else removed entries since the last step (a rewind, a sliding window, a prefix restored
      // before the press was attached): realign on the cache's positions.
      if ((int64_t)s.pos.size() != cache.length(step.layer, h)) realign(s, cache, step.layer, h);
    }
    if (in_context_) return;
    // kvpress CompressionRatioDecodingPress: max(1, int(seen (1 - ratio))), seen = the highest position + 1.
    const int64_t target = target_ratio_ < 0 ? target_
                                             : std::max<int64_t>(1, (int64_t)((double)(step.pos[n - 1] + 1) * (1.0 - target_ratio_)));
    int64_t& count = steps_[(size_t)step.layer];
    if (++count >= interval_ || n >= target) {
      compress(step.layer, target, cache);
      count = 0;
    }
  }

  int64_t n_evicted() const { return n_evicted_; }

 private:
  // One (layer, head) stream's scores, slot for slot with the cache's entries (positions increasing).
  struct Stream {
    std::vector<int32_t> pos;  // [length]
    std::vector<float> score;  // [length]
  };

  void realign(Stream& s, const KvCache& cache, int l, int h) {
    const int64_t len = cache.length(l, h);
    // A sliding window dropped its oldest entries (every step): the stream is a suffix of ours.
    const int64_t drop = (int64_t)s.pos.size() - len;
    if (drop > 0 && len > 0 && s.pos[(size_t)drop] == cache.position_at(l, h, 0)) {
      s.pos.erase(s.pos.begin(), s.pos.begin() + drop);
      s.score.erase(s.score.begin(), s.score.begin() + drop);
      return;
    }
    Stream out;
    out.pos.resize((size_t)len);
    out.score.resize((size_t)len);
    size_t j = 0;
    for (int64_t i = 0; i < len; i++) {
      const int32_t p = cache.position_at(l, h, i);
      while (j < s.pos.size() && s.pos[j] < p) j++;
      // An entry the press never saw (it was attached after that token) is evicted last.
      const bool seen = j < s.pos.size() && s.pos[j] == p;
      out.pos[(size_t)i] = p;
      out.score[(size_t)i] = seen ? s.score[j] : std::numeric_limits<float>::infinity();
    }
    s = std::move(out);
  }

  // Each head of the layer keeps its `target` best entries (ties: the earlier slot goes first).
  void compress(int l, int64_t target, KvCache& cache) {
    const int H = cache.n_head_kv();
    for (int h = 0; h < H; h++) {
      Stream& s = streams_[(size_t)l * H + h];
      const int64_t T = (int64_t)s.score.size();
      if (T <= target) continue;
      drop_.assign((size_t)T, 0);
      mark_lowest_in_stream(s.score, T - target, drop_);
      const int64_t removed = cache.evict(l, h, drop_);
      n_evicted_ += removed;
      cache.pool().count_evicted(removed);
      size_t w = 0;
      for (size_t i = 0; i < (size_t)T; i++)
        if (!drop_[i]) s.pos[w] = s.pos[i], s.score[w] = s.score[i], w++;
      s.pos.resize(w);
      s.score.resize(w);
    }
  }

  std::shared_ptr<Scorer> scorer_;
  std::string name_;
  int64_t interval_, target_;
  double target_ratio_;              // < 0: the fixed target_
  bool sliding_layers_;
  bool in_context_ = false;
  int64_t n_evicted_ = 0;
  std::vector<Stream> streams_;      // [n_layer * n_head_kv], sized on first use
  std::vector<int64_t> steps_;       // [n_layer] steps since the layer's last compression
  std::vector<float> step_scores_;   // [n_head_kv][n_tok] scratch, grows to the largest step
  std::vector<uint8_t> drop_;        // eviction mask scratch
};

}  // namespace

std::unique_ptr<Press> make_decoding_press(std::unique_ptr<Scorer> scorer, const PressSpec& spec,
                                           int64_t compression_interval, int64_t target_size, double target_ratio) {
  return std::make_unique<DecodingPress>(std::shared_ptr<Scorer>(std::move(scorer)), spec, compression_interval,
                                         target_size, target_ratio);
}

std::unique_ptr<Press> make_decoding_press(const PressSpec& spec, const ScorerEntry& entry, const Model& model) {
  const std::string& name = spec.name;
  if (!entry.supports_threshold)
    throw Error("press '" + name + "' needs a press that scores token by token (knorm, kvzap-linear, ...): '" +
                entry.name + "' scores the whole context, which kvpress DecodingPress rescores from a buffer of hidden "
                "states that kvzap does not keep");
  if (spec.has_ratio || spec.has_threshold || !spec.ratios.empty())
    throw Error("press '" + name + "' takes no " + (spec.has_threshold ? "threshold" : "ratio") +
                ": its target sets the ratio at each compression");
  if (spec.prefill_evict_every > 0)
    throw Error("press '" + name + "' leaves the context whole while it is prefilled: prefill_evict_every does not apply");
  std::unique_ptr<Scorer> scorer = entry.make(spec, model);
  if (!scorer->per_step()) throw Error("internal: press '" + entry.name + "' supports a threshold but is not a per-step scorer");
  const int64_t interval = (int64_t)press_param(spec, "compression_interval");
  if (is_ratio_decoding_name(name))
    return make_decoding_press(std::move(scorer), spec, interval, 0, press_param(spec, "target_compression_ratio"));
  return make_decoding_press(std::move(scorer), spec, interval, (int64_t)press_param(spec, "target_size"));
}

}  // namespace kvzap
