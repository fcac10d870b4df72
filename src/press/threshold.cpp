// Threshold policy (docs/ALGORITHMS.md §6, kvpress DMSPress), evicting for real: an entry is removed from its
// (layer, head) stream once its token has left the window of the `window` most recent tokens and its
// score is below the threshold. Eviction runs after the step's attention, so every token of a step
// first attends to the whole step.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kvzap/error.h"
#include "press/policy.h"

namespace kvzap {

void ThresholdPress::Window::clear() {
  pos.clear();
  for (auto& s : score) s.clear();
}

void ThresholdPress::Window::drop_from(int32_t first_stale_pos) {
  // Positions in the buffer increase, so the stale ones are a suffix.
  size_t keep = pos.size();
  while (keep > 0 && pos[keep - 1] >= first_stale_pos) keep--;
  pos.resize(keep);
  for (auto& s : score) s.resize(keep);
}

void ThresholdPress::Window::drop_front(size_t n) {
  pos.erase(pos.begin(), pos.begin() + (ptrdiff_t)n);
  for (auto& s : score) s.erase(s.begin(), s.begin() + (ptrdiff_t)n);
}

ThresholdPress::ThresholdPress(std::unique_ptr<Scorer> scorer, const PressSpec& opt)
    : scorer_(std::move(scorer)),
      scorer_name_(opt.name),
      threshold_(opt.threshold),
      window_(opt.window),
      evict_every_(opt.prefill_evict_every),
      sink_tokens_(opt.sink_tokens),
      decoding_(opt.decoding),
      sliding_layers_(opt.sliding_layers) {
  if (!scorer_ || !scorer_->per_step()) throw Error("internal: the threshold policy needs a per-step scorer");
  if (window_ < 0) throw Error("the window must be >= 0, got " + std::to_string(window_));
  if (sink_tokens_ < 0) throw Error("the sink token count must be >= 0, got " + std::to_string(sink_tokens_));
  if (evict_every_ < 0) throw Error("the prefill eviction interval must be >= 0, got " + std::to_string(evict_every_));
}

std::string ThresholdPress::name() const {
  char buf[160];
  char sinks[32] = "";
  if (sink_tokens_ > 0) std::snprintf(sinks, sizeof sinks, ", %d sink tokens", sink_tokens_);
  char every[48] = "";
  if (evict_every_ > 0) std::snprintf(every, sizeof every, ", prefill every %lld", (long long)evict_every_);
  std::snprintf(buf, sizeof buf, "%s (threshold %g, window %d%s%s%s)", scorer_name_.c_str(), threshold_, window_, sinks,
                every, decoding_ ? ", decoding" : "");
  return buf;
}

void ThresholdPress::start_context() {
  for (Window& w : windows_) w.clear();
  score_log_.clear();
  scorer_->reset();
  in_context_ = true;
}

void ThresholdPress::after_attention(const LayerStep& step, KvCache& cache) {
  if (step.n_tok <= 0) return;
  if (!sliding_layers_ && cache.layer_window(step.layer) > 0) return;  // its window already bounds it
  const int H = cache.n_head_kv();
  if (windows_.size() != (size_t)cache.n_layer()) {
    windows_.assign((size_t)cache.n_layer(), Window{});
    for (Window& w : windows_) w.score.resize((size_t)H);
  }
  Window& win = windows_[(size_t)step.layer];

  // Outside a context (begin_context .. end_context, which also forgets the old windows) only a
  // decoding press judges tokens.
  if (!in_context_ && !decoding_) return;
  // After cache.truncate(p) (a question and its answer removed) positions >= p come again: the
  // buffered scores of the removed tokens must not judge the new ones.
  win.drop_from(step.pos[0]);

  const int64_t n = step.n_tok;
  if (step_scores_.size() < (size_t)(H * n)) step_scores_.resize((size_t)(H * n));
  scorer_->score_step(step, cache, step_scores_.data());  // [H][n]
  if (ScoreLog* log = scores_to_keep(cache))
    for (int h = 0; h < H; h++)
      for (int64_t t = 0; t < n; t++) log->put(step.layer, h, step.pos[t], step_scores_[(size_t)h * n + t]);
  win.pos.insert(win.pos.end(), step.pos, step.pos + n);
  for (int h = 0; h < H; h++) {
    const float* s = step_scores_.data() + (size_t)h * n;
    win.score[(size_t)h].insert(win.score[(size_t)h].end(), s, s + n);
  }

  if (in_context_) {
    // Judged at finish_context, or at each multiple of evict_every_ the step ends on.
    if (evict_every_ > 0) {
      const int64_t end = (int64_t)step.pos[n - 1] + 1;
      const int64_t boundary = end / evict_every_ * evict_every_;
      if (boundary - window_ > 0) evict_before(step.layer, (int32_t)(boundary - window_), cache);
    }
    return;
  }
  evict_overflow(step.layer, cache);
}

void ThresholdPress::evict_before(int layer, int32_t limit, KvCache& cache) {
  Window& win = windows_[(size_t)layer];
  const size_t n_leave = (size_t)(std::lower_bound(win.pos.begin(), win.pos.end(), limit) - win.pos.begin());
  if (n_leave == 0) return;
  evict_leaving(layer, n_leave, cache);
  win.drop_front(n_leave);
}

void ThresholdPress::evict_overflow(int layer, KvCache& cache) {
  Window& win = windows_[(size_t)layer];
  if (win.pos.size() <= (size_t)window_) return;
  const size_t n_leave = win.pos.size() - (size_t)window_;
  evict_leaving(layer, n_leave, cache);
  win.drop_front(n_leave);
}

void ThresholdPress::finish_context(KvCache& cache) {
  in_context_ = false;
  for (int l = 0; l < (int)windows_.size(); l++) evict_overflow(l, cache);
}

// Evicts, per head, the first n_leave buffered tokens whose score < threshold: one evict() per head.
void ThresholdPress::evict_leaving(int layer, size_t n_leave, KvCache& cache) {
  const Window& win = windows_[(size_t)layer];
  for (int h = 0; h < cache.n_head_kv(); h++) {
    const std::vector<float>& score = win.score[(size_t)h];
    size_t i = 0;
    while (i < n_leave && !(score[i] < threshold_ && win.pos[i] >= sink_tokens_)) i++;
    if (i == n_leave) continue;

    // The stream is sorted by position; binary-search the first victim's slot, then walk forward
    // (the leaving tokens are increasing positions, and the stream holds few others among them).
    const int64_t len = cache.length(layer, h);
    int64_t lo = 0, hi = len;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (cache.position_at(layer, h, mid) < win.pos[i]) lo = mid + 1; else hi = mid;
    }
    drop_.assign((size_t)len, 0);
    bool any = false;
    int64_t slot = lo;
    for (; i < n_leave && slot < len; i++) {
      if (!(score[i] < threshold_ && win.pos[i] >= sink_tokens_)) continue;
      const int32_t p = win.pos[i];
      while (slot < len && cache.position_at(layer, h, slot) < p) slot++;
      if (slot < len && cache.position_at(layer, h, slot) == p) {
        drop_[(size_t)slot] = 1;
        any = true;
      }
    }
    if (any) {
      const int64_t removed = cache.evict(layer, h, drop_);
      n_evicted_ += removed;
      cache.pool().count_evicted(removed);
    }
  }
}

std::unique_ptr<Press> make_threshold_press(std::unique_ptr<Scorer> scorer, const PressSpec& opt) {
  return std::make_unique<ThresholdPress>(std::move(scorer), opt);
}

}  // namespace kvzap
