// Token sampling: greedy, or temperature with top-k, top-p and min-p filters (llama.cpp's order:
// top-k -> top-p -> min-p -> temperature), from a seeded generator that is identical on every platform.
#pragma once
#include <cstdint>
#include <vector>

#include "common/rng.h"

namespace kvzap {

struct SamplerOptions {
  float temperature = 0.8f;  // <= 0 means greedy
  int top_k = 40;            // <= 0 disables
  float top_p = 0.95f;       // >= 1 disables
  float min_p = 0.05f;       // <= 0 disables
  uint64_t seed = 0;
};

class Sampler {
 public:
  Sampler(const SamplerOptions& opt, int n_vocab);
  int32_t sample(const float* logits);
  static int32_t argmax(const float* logits, int n);

 private:
  double uniform();  // [0, 1)
  SamplerOptions opt_;
  int n_vocab_;
  SplitMix64 rng_{0};
  std::vector<std::pair<float, int32_t>> cand_;  // scratch [n_vocab]
  std::vector<double> prob_;                     // scratch [n_vocab]
};

}  // namespace kvzap
