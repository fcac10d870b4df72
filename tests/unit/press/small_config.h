// The small model shape the press tests score by hand (2 layers, 4 query heads over 2 KV heads, head_dim 8)
// and RoPE written out independently of the engine (double angles): pairs (i, i + D/2) or (2i, 2i + 1),
// angle p * base^(-2i/D).
#pragma once
#include <cmath>
#include <cstdint>
#include <utility>

#include "model/config.h"

namespace kvzap::press_test {

inline ModelConfig small_config(RopeMode mode = RopeMode::HalfSplit) {
  ModelConfig c;
  c.arch = "test";
  c.n_layer = 2;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 8;
  c.n_rot = 8;
  c.rope_base = 10000.0f;
  c.rope_mode = mode;
  return c;
}

inline std::pair<int, int> rope_pair(const ModelConfig& c, int i) {
  return c.rope_mode == RopeMode::Adjacent ? std::pair<int, int>{2 * i, 2 * i + 1} : std::pair<int, int>{i, i + c.head_dim / 2};
}
inline double rope_angle(const ModelConfig& c, int64_t p, int i) {
  return (double)p * std::pow((double)c.rope_base, -2.0 * i / c.head_dim);
}
// x [head_dim] rotated to position p (sign -1: back from it).
inline void rotate(const ModelConfig& c, float* x, int64_t p, double sign = 1.0) {
  for (int i = 0; i < c.head_dim / 2; i++) {
    const auto [a, b] = rope_pair(c, i);
    const double th = sign * rope_angle(c, p, i);
    const double x0 = x[a], x1 = x[b];
    x[a] = (float)(x0 * std::cos(th) - x1 * std::sin(th));
    x[b] = (float)(x0 * std::sin(th) + x1 * std::cos(th));
  }
}

}  // namespace kvzap::press_test
