#include "eval/faithfulness.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kvzap/error.h"
#include "model/model.h"

namespace kvzap::eval {

namespace {

// log-sum-exp of a logit row and its argmax.
double log_normaliser(const float* x, int64_t n, int64_t* argmax) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  const double m = x[best];
  double sum = 0;
  for (int64_t i = 0; i < n; i++) sum += std::exp((double)x[i] - m);
  *argmax = best;
  return m + std::log(sum);
}

}  // namespace

PositionComparison compare_logits(const float* full, const float* pressed, int64_t n_vocab, int32_t next) {
  int64_t top_f = 0, top_p = 0;
  const double z_f = log_normaliser(full, n_vocab, &top_f);
  const double z_p = log_normaliser(pressed, n_vocab, &top_p);
  double kl = 0;
  for (int64_t i = 0; i < n_vocab; i++) {
    const double lf = (double)full[i] - z_f, lp = (double)pressed[i] - z_p;
    kl += std::exp(lf) * (lf - lp);
  }
  PositionComparison c;
  c.kl = std::max(0.0, kl);  // rounding can leave a tiny negative for identical rows
  c.same_top1 = top_f == top_p;
  c.nll_full = z_f - (double)full[next];
  c.nll_pressed = z_p - (double)pressed[next];
  return c;
}

FaithfulnessResult measure_faithfulness(Session& full, Session& pressed, Press* press,
                                        const std::vector<int32_t>& tokens, const FaithfulnessOptions& opt,
                                        Progress* progress) {
  if (opt.context_tokens < 1 || opt.window_tokens < 1 || opt.windows < 1)
    throw Error("faithfulness needs a context, a window and a window count of at least 1");
  const int64_t span = opt.context_tokens + opt.window_tokens + 1;
  const int64_t available = (int64_t)tokens.size() / span;
  if (available < 1)
    throw Error("the text has " + std::to_string(tokens.size()) + " tokens, fewer than one window of " +
                std::to_string(span) + " (context + window + 1)");
  const int64_t n_windows = std::min(available, opt.windows);
  const int64_t n_vocab = full.model().config().n_vocab;
  for (Session* s : {&full, &pressed})
    if (s->n_ctx() < span) throw Error("the session's context size is smaller than context + window + 1 tokens");

  const auto t0 = std::chrono::steady_clock::now();
  FaithfulnessResult r;
  r.windows = n_windows;
  int64_t agree = 0;
  for (int64_t w = 0; w < n_windows; w++) {
    const int32_t* win = tokens.data() + w * span;
    const std::vector<int32_t> ctx(win, win + opt.context_tokens);
    full.prefill_context(ctx, nullptr);
    pressed.prefill_context(ctx, press);
    r.evicted_fraction += pressed.cache().evicted_fraction();
    double window_kl = 0;
    for (int64_t i = 0; i < opt.window_tokens; i++) {
      const std::vector<int32_t> tok{win[opt.context_tokens + i]};
      full.feed(tok);
      pressed.feed(tok);
      const PositionComparison c =
          compare_logits(full.logits(), pressed.logits(), n_vocab, win[opt.context_tokens + i + 1]);
      window_kl += c.kl;
      r.mean_kl += c.kl;
      r.max_kl = std::max(r.max_kl, c.kl);
      agree += c.same_top1;
      r.nll_full += c.nll_full;
      r.nll_pressed += c.nll_pressed;
      r.positions++;
      if (progress) progress->add(1);
    }
    r.kl_by_window.push_back(window_kl / (double)opt.window_tokens);
    r.evicted_fraction_end += pressed.cache().evicted_fraction();
    r.kv_bytes += (double)pressed.cache().bytes_resident();
    r.kv_bytes_full += (double)pressed.cache().bytes_full();
  }
  const double n = (double)r.positions;
  r.mean_kl /= n;
  r.top1_agreement = 100.0 * (double)agree / n;
  r.nll_full /= n;
  r.nll_pressed /= n;
  r.nll_diff = r.nll_pressed - r.nll_full;
  r.ppl_ratio = std::exp(r.nll_diff);
  r.evicted_fraction /= (double)n_windows;
  r.evicted_fraction_end /= (double)n_windows;
  r.kv_bytes /= (double)n_windows;
  r.kv_bytes_full /= (double)n_windows;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kvzap::eval
