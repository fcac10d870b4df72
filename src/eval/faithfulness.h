// Teacher-forced faithfulness of a pruned cache (docs/ALGORITHMS.md §9.3): a text prefix is prefilled
// into two sessions, one with the full cache and one under a press (compressed in prefill), then
// the continuation is fed token by token to both (so a press that prunes while decoding keeps
// pruning) and every next-token distribution of the pressed run is compared with the full run's:
// KL(full || pressed), top-1 agreement and the log-likelihood of the true next token. Far lower
// variance than task accuracy, and meaningful even where a small model fails the tasks.
#pragma once
#include <cstdint>
#include <vector>

#include "common/progress.h"
#include "engine/session.h"
#include "press/press.h"

namespace kvzap::eval {

// One position: the two distributions over the vocabulary given as logits.
struct PositionComparison {
  double kl = 0;           // KL(full || pressed) in nats, >= 0
  bool same_top1 = true;   // argmax agrees (ties: lowest id)
  double nll_full = 0;     // -log p_full(next)
  double nll_pressed = 0;  // -log p_pressed(next)
};
// Softmax in double precision. logits: [n_vocab] each.
PositionComparison compare_logits(const float* full, const float* pressed, int64_t n_vocab, int32_t next);

struct FaithfulnessOptions {
  int64_t context_tokens = 1024;  // prefix prefilled (and compressed) per window
  int64_t window_tokens = 256;    // continuation positions scored per window
  int64_t windows = 1;            // consecutive non-overlapping windows of context + window + 1 tokens
};

struct FaithfulnessResult {
  int64_t windows = 0, positions = 0;
  double mean_kl = 0, max_kl = 0;          // nats
  double top1_agreement = 0;               // percent of positions, 0..100
  double nll_full = 0, nll_pressed = 0;    // mean over positions
  double nll_diff = 0;                     // nll_pressed - nll_full
  double ppl_ratio = 1;                    // exp(nll_diff)
  double evicted_fraction = 0;             // after compressing the context, mean over windows
  double evicted_fraction_end = 0;         // after the continuation, mean over windows
  double kv_bytes = 0, kv_bytes_full = 0;  // after the continuation, mean over windows
  std::vector<double> kl_by_window;        // mean KL of each window
  double seconds = 0;
};

// Positions predicted: after feeding continuation token i (i = 0..window-1) the distribution of
// token i+1; the first token after the context is skipped (every press compresses after the step
// that produced it, so it never differs). Both sessions must be able to hold context + window + 1
// tokens. Throws kvzap::Error when `tokens` is shorter than one window.
FaithfulnessResult measure_faithfulness(Session& full, Session& pressed, Press* press,
                                        const std::vector<int32_t>& tokens, const FaithfulnessOptions& opt,
                                        Progress* progress = nullptr);

}  // namespace kvzap::eval
