// A per-step scorer for press tests whose score is a fixed scramble of (layer, head, position): distinct
// scores, so no tie decides what a press keeps.
#pragma once

#include "cache/kv_cache.h"
#include "press/press.h"

namespace kvzap::test {

class ScrambleScorer : public Scorer {
 public:
  bool per_step() const override { return true; }
  void score_step(const LayerStep& step, const KvCache& cache, float* out) override {
    for (int h = 0; h < cache.n_head_kv(); h++)
      for (int64_t i = 0; i < step.n_tok; i++) out[(size_t)h * step.n_tok + i] = score(step.layer, h, step.pos[i]);
  }
  static float score(int l, int h, int32_t p) { return (float)((p * 7919 + l * 104729 + h * 1299709) % 10007); }
};

}  // namespace kvzap::test
