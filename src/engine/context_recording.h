// One context prefill, recorded so that many presses can judge it without prefilling it again
// (kvzap sweep runs every cell of a grid on one prefill per context).
//
// Why that is exact: inside a context no press evicts before end_context (ThresholdPress and RatioPress
// only score and record while the context goes in), so the activations of a context prefill do not depend
// on the press, and a press sees the same LayerSteps whichever press it is. Engine::replay() puts a
// recording into a sequence under that sequence's press, doing the cache operations the prefill did in
// the same order; the press then judges it at end_context as if the context had been prefilled under it
// (bit for bit: ContextRecording.ReplayUnderEveryPressMatchesAPrefill).
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/forward.h"

namespace kvzap {

class ContextRecording : public LayerObserver {
 public:
  explicit ContextRecording(const ModelConfig& cfg);

  // Forgets the recorded steps (keeps the buffers for the next context).
  void clear();
  // Records the step (a new step starts at layer 0).
  void after_attention(const LayerStep& step, KvCache& cache) override;

  const std::vector<RecordedStep>& steps() const { return steps_; }
  int64_t n_tokens() const;
  // The distribution after the context's last token ([n_vocab]), set by Engine::prefill_recorded.
  std::vector<float>& logits() { return logits_; }
  const std::vector<float>& logits() const { return logits_; }
  // Bytes the recorded tensors take (h, q, k, v of every layer), and what a context of n_tokens needs:
  // n_tokens * n_layer * 4 * (n_embd + (n_head + 2 n_head_kv) * head_dim).
  int64_t bytes() const;
  static int64_t bytes_for(const ModelConfig& cfg, int64_t n_tokens);

 private:
  int64_t E_, Dq_, Dkv_;
  int n_layer_;
  std::vector<RecordedStep> steps_;  // [steps] of the current context
  std::vector<RecordedStep> spare_;  // buffers of cleared steps, reused
  std::vector<float> logits_;
};

}  // namespace kvzap
