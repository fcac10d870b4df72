// exp for softmax and GELU loops: Cody-Waite reduction + degree-6 polynomial (relative error ~2e-7),
// branch-free so the compiler vectorises the loops that call it (std::exp does not vectorise without
// -ffast-math). Inputs are clamped to [-87, 88].
#pragma once
#include <cstdint>
#include <cstring>

namespace kvzap {

inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // n = round-half-even(x / ln 2) through the 1.5 * 2^23 trick (|x / ln 2| < 2^22).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t e = ((int32_t)n + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, 4);
  return p * scale;
}

}  // namespace kvzap
