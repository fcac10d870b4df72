#include "model/blocks.h"

#include <array>
#include <cmath>
#include <cstring>

#include "common/fp16.h"

namespace kvzap {

void rmsnorm(const float* x, const float* gain, float* out, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; i++) ss += (double)(x[i] * x[i]);  // float products, double sum (as ggml)
  const float scale = 1.0f / std::sqrt((float)(ss / n) + eps);
  for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * gain[i];
}

void rope_table(int64_t n_pos, int head_dim, float base, float freq_scale, float* cos_out, float* sin_out,
                const float* freq_factors) {
  const int half = head_dim / 2;
  const float theta_scale = std::pow(base, -2.0f / (float)head_dim);
  for (int64_t p = 0; p < n_pos; p++) {
    float theta = (float)p * freq_scale;
    for (int i = 0; i < half; i++) {
      const float t = freq_factors ? theta / freq_factors[i] : theta;
      cos_out[p * half + i] = std::cos(t);
      sin_out[p * half + i] = std::sin(t);
      theta *= theta_scale;
    }
  }
}

void rope_apply(float* x, const float* c, const float* s, int head_dim, RopeMode mode) {
  const int half = head_dim / 2;
  if (mode == RopeMode::Adjacent) {
    for (int i = 0; i < half; i++) {
      const float x0 = x[2 * i], x1 = x[2 * i + 1];
      x[2 * i] = x0 * c[i] - x1 * s[i];
      x[2 * i + 1] = x0 * s[i] + x1 * c[i];
    }
  } else {
    for (int i = 0; i < half; i++) {
      const float x0 = x[i], x1 = x[i + half];
      x[i] = x0 * c[i] - x1 * s[i];
      x[i + half] = x0 * s[i] + x1 * c[i];
    }
  }
}

void swiglu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f, kCoef = 0.044715f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kCoef * x * x)));
}

namespace {
// gelu over every f16 value, rounded to f16: what ggml's CPU GELU (GGML_GELU_FP16) looks up.
const std::array<uint16_t, 65536>& gelu_f16_table() {
  static const std::array<uint16_t, 65536> table = [] {
    std::array<uint16_t, 65536> t{};
    for (uint32_t i = 0; i < 65536; i++) t[i] = fp32_to_fp16(gelu_tanh(fp16_to_fp32((uint16_t)i)));
    return t;
  }();
  return table;
}
}  // namespace

void geglu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; i++) gate[i] = gelu_tanh(gate[i]) * up[i];
}

void geglu_f16_table(float* gate, const float* up, int64_t n) {
  const std::array<uint16_t, 65536>& table = gelu_f16_table();
  for (int64_t i = 0; i < n; i++) {
    const float g = gate[i];
    float a;
    if (g <= -10.0f) a = 0.0f;
    else if (g >= 10.0f) a = g;
    else a = fp16_to_fp32(table[fp32_to_fp16(g)]);
    gate[i] = a * up[i];
  }
}

void softcap(float* x, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; i++) x[i] = cap * std::tanh(x[i] * inv);
}

double log_softmax_at(const float* logits, int64_t n, int64_t id, int64_t* argmax) {
  float mx = -INFINITY;
  int64_t am = 0;
  for (int64_t i = 0; i < n; i++)
    if (logits[i] > mx) { mx = logits[i]; am = i; }
  double sum = 0;
  for (int64_t i = 0; i < n; i++) sum += std::exp((double)logits[i] - mx);
  if (argmax) *argmax = am;
  return (double)logits[id] - mx - std::log(sum);
}

}  // namespace kvzap
