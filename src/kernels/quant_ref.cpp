// Scalar reference quantization (the formulas of ggml-quants.c).
#include "kernels/quant_ref.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

namespace kvzap::kernels {
namespace {

constexpr float kGroupMaxEps = 1e-15f;

// ---------------------------------------------------------------- dequantize

void dequant_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[i * kQK + j] = d * (float)((b[i].qs[j] & 0xF) - 8);
      y[i * kQK + j + 16] = d * (float)((b[i].qs[j] >> 4) - 8);
    }
  }
}

void dequant_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d), m = h2f(b[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[i * kQK + j] = d * (float)(b[i].qs[j] & 0xF) + m;
      y[i * kQK + j + 16] = d * (float)(b[i].qs[j] >> 4) + m;
    }
  }
}

inline uint32_t load_qh(const uint8_t* qh) {
  uint32_t v;
  std::memcpy(&v, qh, 4);
  return v;
}

void dequant_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d);
    const uint32_t qh = load_qh(b[i].qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = (b[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int q1 = (b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      y[i * kQK + j] = d * (float)(q0 - 16);
      y[i * kQK + j + 16] = d * (float)(q1 - 16);
    }
  }
}

void dequant_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d), m = h2f(b[i].m);
    const uint32_t qh = load_qh(b[i].qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = (b[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int q1 = (b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      y[i * kQK + j] = d * (float)q0 + m;
      y[i * kQK + j + 16] = d * (float)q1 + m;
    }
  }
}

void dequant_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < kQK; ++j) y[i * kQK + j] = d * (float)b[i].qs[j];
  }
}

void dequant_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int g = 0; g < 4; ++g) {  // 4 groups of 64: low nibbles then high nibbles
      uint8_t sc, m;
      k_scale_min(2 * g, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      k_scale_min(2 * g + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (float)(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (float)(q[l] >> 4) - m2;
      q += 32;
    }
  }
}

void dequant_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    const uint8_t* ql = b[i].qs;
    const uint8_t* qh = b[i].qh;
    for (int g = 0; g < 4; ++g) {
      uint8_t sc, m;
      k_scale_min(2 * g, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      k_scale_min(2 * g + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      const uint8_t u1 = (uint8_t)(1u << (2 * g)), u2 = (uint8_t)(2u << (2 * g));
      for (int l = 0; l < 32; ++l) *y++ = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      ql += 32;
    }
  }
}

void dequant_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d);
    for (int h = 0; h < 2; ++h) {  // two halves of 128
      const uint8_t* ql = b[i].ql + 64 * h;
      const uint8_t* qh = b[i].qh + 32 * h;
      const int8_t* sc = b[i].scales + 8 * h;
      float* yh = y + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        yh[l] = d * sc[is] * q1;
        yh[l + 32] = d * sc[is + 2] * q2;
        yh[l + 64] = d * sc[is + 4] * q3;
        yh[l + 96] = d * sc[is + 6] * q4;
      }
    }
    y += kQKK;
  }
}

// ---------------------------------------------------------------- quantize (weights)

void quant_q4_0(const float* x, BlockQ4_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.f, max = 0.f;
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) { amax = std::fabs(x[j]); max = x[j]; }
    }
    const float d = max / -8;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = f2h(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t q0 = (uint8_t)std::min(15, (int)(int8_t)(x[j] * id + 8.5f));
      const uint8_t q1 = (uint8_t)std::min(15, (int)(int8_t)(x[j + 16] * id + 8.5f));
      y[i].qs[j] = q0 | (uint8_t)(q1 << 4);
    }
  }
}

void quant_q4_1(const float* x, BlockQ4_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < kQK; ++j) {
      min = std::min(min, x[j]);
      max = std::max(max, x[j]);
    }
    const float d = (max - min) / 15;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = f2h(d);
    y[i].m = f2h(min);
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t q0 = (uint8_t)std::min(15, (int)(int8_t)((x[j] - min) * id + 0.5f));
      const uint8_t q1 = (uint8_t)std::min(15, (int)(int8_t)((x[j + 16] - min) * id + 0.5f));
      y[i].qs[j] = q0 | (uint8_t)(q1 << 4);
    }
  }
}

void quant_q5_0(const float* x, BlockQ5_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.f, max = 0.f;
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) { amax = std::fabs(x[j]); max = x[j]; }
    }
    const float d = max / -16;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = f2h(d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(31, (int)(int8_t)(x[j] * id + 16.5f));
      const int q1 = std::min(31, (int)(int8_t)(x[j + 16] * id + 16.5f));
      y[i].qs[j] = (uint8_t)((q0 & 0xF) | ((q1 & 0xF) << 4));
      qh |= (uint32_t)((q0 & 0x10) >> 4) << j;
      qh |= (uint32_t)((q1 & 0x10) >> 4) << (j + 16);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

void quant_q5_1(const float* x, BlockQ5_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < kQK; ++j) {
      min = std::min(min, x[j]);
      max = std::max(max, x[j]);
    }
    const float d = (max - min) / 31;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = f2h(d);
    y[i].m = f2h(min);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = (int)(uint8_t)((x[j] - min) * id + 0.5f);
      const int q1 = (int)(uint8_t)((x[j + 16] - min) * id + 0.5f);
      y[i].qs[j] = (uint8_t)((q0 & 0xF) | ((q1 & 0xF) << 4));
      qh |= (uint32_t)((q0 & 0x10) >> 4) << j;
      qh |= (uint32_t)((q1 & 0x10) >> 4) << (j + 16);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

// ggml's weighted min/max search for the K formats (one sub-block of n values, levels 0..nmax).
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                       uint8_t* Laux, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = weights[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = (uint8_t)std::max(0, std::min(nmax, l));
    const float diff = scale * L[i] + min - x[i];
    best_error += weights[i] * diff * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = (uint8_t)l;
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * Laux[i] + this_min - x[i];
        cur_error += weights[i] * diff * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// Shared by Q4_K and Q5_K: per sub-block scale/min search, 6-bit packing, final levels in L[256].
void quant_k_scales(const float* x, int nmax, float rmin, int nstep, uint16_t* d_out, uint16_t* dmin_out,
                    uint8_t* scales_out, uint8_t* L) {
  uint8_t laux[32];
  float weights[32], mins[8], scales[8];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], laux, rmin, 0.1f, nstep);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  std::memset(scales_out, 0, kKScaleBytes);
  for (int j = 0; j < 8; ++j) {
    const uint8_t ls = (uint8_t)std::min(63, nearest_int(inv_scale * scales[j]));
    const uint8_t lm = (uint8_t)std::min(63, nearest_int(inv_min * mins[j]));
    if (j < 4) {
      scales_out[j] = ls;
      scales_out[j + 4] = lm;
    } else {
      scales_out[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
      scales_out[j - 4] |= (uint8_t)((ls >> 4) << 6);
      scales_out[j] |= (uint8_t)((lm >> 4) << 6);
    }
  }
  *d_out = f2h(max_scale / 63.f);
  *dmin_out = f2h(max_min / 63.f);
  // Requantize with the rounded scales so the levels match what dequantization will see.
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    k_scale_min(j, scales_out, &sc, &m);
    const float d = h2f(*d_out) * sc;
    if (!d) continue;
    const float dm = h2f(*dmin_out) * m;
    for (int ii = 0; ii < 32; ++ii) {
      const int l = nearest_int((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = (uint8_t)std::max(0, std::min(nmax, l));
    }
  }
}

void quant_q4_k(const float* x, BlockQ4_K* y, int64_t nb) {
  uint8_t L[kQKK];
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    quant_k_scales(x, 15, -1.f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
    uint8_t* q = y[i].qs;
    for (int j = 0; j < kQKK; j += 64, q += 32) {
      for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
  }
}

void quant_q5_k(const float* x, BlockQ5_K* y, int64_t nb) {
  uint8_t L[kQKK];
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    quant_k_scales(x, 31, -0.5f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
    uint8_t* ql = y[i].qs;
    uint8_t* qh = y[i].qh;
    std::memset(qh, 0, kQKK / 8);
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < kQKK; n += 64, ql += 32) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[n + j];
        if (l1 > 15) { l1 -= 16; qh[j] |= m1; }
        int l2 = L[n + j + 32];
        if (l2 > 15) { l2 -= 16; qh[j] |= m2; }
        ql[j] = (uint8_t)(l1 | (l2 << 4));
      }
      m1 = (uint8_t)(m1 << 2);
      m2 = (uint8_t)(m2 << 2);
    }
  }
}

// ggml's make_qx_quants with rmse_type 1 (weights x^2): symmetric levels -nmax..nmax-1, stored + nmax.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) { amax = ax; max = x[i]; }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = (int8_t)(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = (int8_t)(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void quant_q6_k(const float* x, BlockQ6_K* y, int64_t nb) {
  int8_t L[kQKK];
  float scales[kQKK / 16];
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < kQKK / 16; ++ib) {
      const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
      scales[ib] = scale;
      if (std::fabs(scale) > max_abs_scale) {
        max_abs_scale = std::fabs(scale);
        max_scale = scale;
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y[i], 0, sizeof(BlockQ6_K));
      continue;
    }
    const float iscale = -128.f / max_scale;
    y[i].d = f2h(1 / iscale);
    for (int ib = 0; ib < kQKK / 16; ++ib) y[i].scales[ib] = (int8_t)std::min(127, nearest_int(iscale * scales[ib]));
    for (int j = 0; j < kQKK / 16; ++j) {
      const float d = h2f(y[i].d) * y[i].scales[j];
      if (!d) continue;
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int(x[16 * j + ii] / d);
        l = std::max(-32, std::min(31, l));
        L[16 * j + ii] = (int8_t)(l + 32);
      }
    }
    uint8_t* ql = y[i].ql;
    uint8_t* qh = y[i].qh;
    for (int j = 0; j < kQKK; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
        const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
        ql[l] = (uint8_t)(q1 | (q3 << 4));
        ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
        qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                          ((L[j + l + 96] >> 4) << 6));
      }
    }
  }
}

// ---------------------------------------------------------------- vec-dots (weight x partner)

float dot_q4_0(const BlockQ4_0* w, const BlockQ8_0* a, int64_t nb) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int s = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      s += ((w[i].qs[j] & 0xF) - 8) * a[i].qs[j] + ((w[i].qs[j] >> 4) - 8) * a[i].qs[j + 16];
    }
    sum += (float)s * (h2f(w[i].d) * h2f(a[i].d));
  }
  return sum;
}

float dot_q4_1(const BlockQ4_1* w, const BlockQ8_1* a, int64_t nb) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int s = 0;
    for (int j = 0; j < kQK / 2; ++j) s += (w[i].qs[j] & 0xF) * a[i].qs[j] + (w[i].qs[j] >> 4) * a[i].qs[j + 16];
    sum += (h2f(w[i].d) * h2f(a[i].d)) * (float)s + h2f(w[i].m) * h2f(a[i].s);
  }
  return sum;
}

float dot_q5_0(const BlockQ5_0* w, const BlockQ8_0* a, int64_t nb) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const uint32_t qh = load_qh(w[i].qh);
    int s = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = ((w[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16;
      const int q1 = ((w[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
      s += q0 * a[i].qs[j] + q1 * a[i].qs[j + 16];
    }
    sum += (float)s * (h2f(w[i].d) * h2f(a[i].d));
  }
  return sum;
}

float dot_q5_1(const BlockQ5_1* w, const BlockQ8_1* a, int64_t nb) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const uint32_t qh = load_qh(w[i].qh);
    int s = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = (w[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int q1 = (w[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      s += q0 * a[i].qs[j] + q1 * a[i].qs[j + 16];
    }
    sum += (h2f(w[i].d) * h2f(a[i].d)) * (float)s + h2f(w[i].m) * h2f(a[i].s);
  }
  return sum;
}

float dot_q8_0(const BlockQ8_0* w, const BlockQ8_0* a, int64_t nb) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int s = 0;
    for (int j = 0; j < kQK; ++j) s += w[i].qs[j] * a[i].qs[j];
    sum += (float)s * (h2f(w[i].d) * h2f(a[i].d));
  }
  return sum;
}

float dot_q4_k(const BlockQ4_K* w, const BlockQ8_K* a, int64_t nb) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* q = w[i].qs;
    const int8_t* qa = a[i].qs;
    int sumi = 0, summ = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      k_scale_min(j, w[i].scales, &sc, &m);
      const uint8_t* qj = q + 32 * (j / 2);
      const int shift = (j & 1) ? 4 : 0;
      int s = 0;
      for (int l = 0; l < 32; ++l) s += ((qj[l] >> shift) & 0xF) * qa[32 * j + l];
      sumi += sc * s;
      summ += m * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
    }
    const float d = h2f(w[i].d) * a[i].d, dmin = h2f(w[i].dmin) * a[i].d;
    sum += d * (float)sumi - dmin * (float)summ;
  }
  return sum;
}

float dot_q5_k(const BlockQ5_K* w, const BlockQ8_K* a, int64_t nb) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const int8_t* qa = a[i].qs;
    int sumi = 0, summ = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      k_scale_min(j, w[i].scales, &sc, &m);
      const uint8_t* qj = w[i].qs + 32 * (j / 2);
      const int shift = (j & 1) ? 4 : 0;
      const uint8_t hbit = (uint8_t)(1u << j);
      int s = 0;
      for (int l = 0; l < 32; ++l) {
        const int q = ((qj[l] >> shift) & 0xF) + ((w[i].qh[l] & hbit) ? 16 : 0);
        s += q * qa[32 * j + l];
      }
      sumi += sc * s;
      summ += m * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
    }
    const float d = h2f(w[i].d) * a[i].d, dmin = h2f(w[i].dmin) * a[i].d;
    sum += d * (float)sumi - dmin * (float)summ;
  }
  return sum;
}

float dot_q6_k(const BlockQ6_K* w, const BlockQ8_K* a, int64_t nb) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = w[i].ql + 64 * h;
      const uint8_t* qh = w[i].qh + 32 * h;
      const int8_t* sc = w[i].scales + 8 * h;
      const int8_t* qa = a[i].qs + 128 * h;
      int s[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // per 16-element sub-block of this half
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        s[is] += q1 * qa[l];
        s[is + 2] += q2 * qa[l + 32];
        s[is + 4] += q3 * qa[l + 64];
        s[is + 6] += q4 * qa[l + 96];
      }
      for (int k = 0; k < 8; ++k) sumi += sc[k] * s[k];
    }
    sum += h2f(w[i].d) * a[i].d * (float)sumi;
  }
  return sum;
}

// Float weights: the arithmetic of the SIMD kernels (gemm_float_avx512.cpp, gemm_float_avx2.cpp) in
// scalar form, so they match it bit for bit. 16 f32 lanes; the row is zero-padded to whole steps (padding
// adds 0 * 0, as the kernels' zeroed tails do); the lanes are folded as avx512_reduce.h folds a zmm.
float fold16(const float* l) {
  float s8[8], s4[4];
  for (int j = 0; j < 8; ++j) s8[j] = l[j] + l[j + 8];
  for (int j = 0; j < 4; ++j) s4[j] = s8[j] + s8[j + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// F32 / F16: element i goes to lane i % 16, acc = fma(w_i, a_i, acc) in element order. F16 x f16-rounded
// products are exact in f32, so there a plain multiply-add is the same fma (and keeps baseline code fast).
template <bool kFma, typename Load>
float dot_float_lanes(const float* a, int64_t n, Load load) {
  float acc[16] = {};
  const int64_t padded = (n + 15) / 16 * 16;
  for (int64_t i = 0; i < padded; ++i) {
    const float w = i < n ? load(i) : 0.f, x = i < n ? a[i] : 0.f;
    acc[i % 16] = kFma ? std::fma(w, x, acc[i % 16]) : acc[i % 16] + w * x;
  }
  return fold16(acc);
}

// BF16: AVX-512 BF16's vdpbf16ps per 32 elements: lane j adds the product of element 2j + 1, then that of
// element 2j, each add rounded to f32 (the products are exact). The instruction also treats denormals as
// zero and flushes denormal results; that is not modelled (it never matters for model-sized values).
float dot_bf16_lanes(const uint16_t* w, const float* a, int64_t n) {
  float acc[16] = {};
  auto prod = [&](int64_t i) { return i < n ? bf16_to_fp32(w[i]) * a[i] : 0.f * 0.f; };
  for (int64_t s = 0; s < n; s += 32)
    for (int j = 0; j < 16; ++j) {
      acc[j] = acc[j] + prod(s + 2 * j + 1);
      acc[j] = acc[j] + prod(s + 2 * j);
    }
  return fold16(acc);
}

}  // namespace

void quantize_q8_0_ref(const float* x, BlockQ8_0* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float amax = 0.f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    y[i].d = f2h(d);
    for (int j = 0; j < kQK; ++j) y[i].qs[j] = (int8_t)std::nearbyint(x[j] * id);
  }
}

void quantize_q8_1_ref(const float* x, BlockQ8_1* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float amax = 0.f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    y[i].d = f2h(d);
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      y[i].qs[j] = (int8_t)std::nearbyint(x[j] * id);
      sum += y[i].qs[j];
    }
    y[i].s = f2h((float)sum * d);
  }
}

void quantize_q8_K_ref(const float* x, BlockQ8_K* y, int64_t n) {
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    float max = 0, amax = 0;
    for (int j = 0; j < kQKK; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) { amax = ax; max = x[j]; }
    }
    if (!amax) {
      std::memset(&y[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < kQKK; ++j) y[i].qs[j] = (int8_t)std::min(127, nearest_int(iscale * x[j]));
    for (int j = 0; j < kQKK / 16; ++j) {
      int sum = 0;
      for (int k = 0; k < 16; ++k) sum += y[i].qs[16 * j + k];
      y[i].bsums[j] = (int16_t)sum;
    }
    y[i].d = 1 / iscale;
  }
}

void quantize_activation_ref(GgmlType w, const float* x, void* dst, int64_t n) {
  switch (partner_type(w)) {
    case GgmlType::Q8_0: quantize_q8_0_ref(x, (BlockQ8_0*)dst, n); break;
    case GgmlType::Q8_1: quantize_q8_1_ref(x, (BlockQ8_1*)dst, n); break;
    case GgmlType::Q8_K: quantize_q8_K_ref(x, (BlockQ8_K*)dst, n); break;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) ((float*)dst)[i] = fp16_to_fp32(fp32_to_fp16(x[i]));
      break;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) ((float*)dst)[i] = bf16_to_fp32(fp32_to_bf16(x[i]));
      break;
    default: std::memcpy(dst, x, (size_t)n * sizeof(float)); break;
  }
}

void dequantize_row_ref(GgmlType type, const void* src, float* dst, int64_t n) {
  const int64_t nb = n / std::max(1, geometry(type).block_elems);
  switch (type) {
    case GgmlType::F32: std::memcpy(dst, src, (size_t)n * 4); break;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(((const uint16_t*)src)[i]);
      break;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(((const uint16_t*)src)[i]);
      break;
    case GgmlType::Q4_0: dequant_q4_0((const BlockQ4_0*)src, dst, nb); break;
    case GgmlType::Q4_1: dequant_q4_1((const BlockQ4_1*)src, dst, nb); break;
    case GgmlType::Q5_0: dequant_q5_0((const BlockQ5_0*)src, dst, nb); break;
    case GgmlType::Q5_1: dequant_q5_1((const BlockQ5_1*)src, dst, nb); break;
    case GgmlType::Q8_0: dequant_q8_0((const BlockQ8_0*)src, dst, nb); break;
    case GgmlType::Q4_K: dequant_q4_k((const BlockQ4_K*)src, dst, nb); break;
    case GgmlType::Q5_K: dequant_q5_k((const BlockQ5_K*)src, dst, nb); break;
    case GgmlType::Q6_K: dequant_q6_k((const BlockQ6_K*)src, dst, nb); break;
    case GgmlType::Q8_1: {  // activation format: d * q
      const auto* b = (const BlockQ8_1*)src;
      for (int64_t i = 0; i < nb; ++i)
        for (int j = 0; j < kQK; ++j) dst[i * kQK + j] = h2f(b[i].d) * b[i].qs[j];
      break;
    }
    case GgmlType::Q8_K: {
      const auto* b = (const BlockQ8_K*)src;
      for (int64_t i = 0; i < nb; ++i)
        for (int j = 0; j < kQKK; ++j) dst[i * kQKK + j] = b[i].d * b[i].qs[j];
      break;
    }
    default: break;
  }
}

void quantize_row_ref(GgmlType type, const float* src, void* dst, int64_t n) {
  const int64_t nb = n / std::max(1, geometry(type).block_elems);
  switch (type) {
    case GgmlType::F32: std::memcpy(dst, src, (size_t)n * 4); break;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) ((uint16_t*)dst)[i] = fp32_to_fp16(src[i]);
      break;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) ((uint16_t*)dst)[i] = fp32_to_bf16(src[i]);
      break;
    case GgmlType::Q4_0: quant_q4_0(src, (BlockQ4_0*)dst, nb); break;
    case GgmlType::Q4_1: quant_q4_1(src, (BlockQ4_1*)dst, nb); break;
    case GgmlType::Q5_0: quant_q5_0(src, (BlockQ5_0*)dst, nb); break;
    case GgmlType::Q5_1: quant_q5_1(src, (BlockQ5_1*)dst, nb); break;
    case GgmlType::Q8_0: quantize_q8_0_ref(src, (BlockQ8_0*)dst, n); break;
    case GgmlType::Q8_1: quantize_q8_1_ref(src, (BlockQ8_1*)dst, n); break;
    case GgmlType::Q4_K: quant_q4_k(src, (BlockQ4_K*)dst, nb); break;
    case GgmlType::Q5_K: quant_q5_k(src, (BlockQ5_K*)dst, nb); break;
    case GgmlType::Q6_K: quant_q6_k(src, (BlockQ6_K*)dst, nb); break;
    case GgmlType::Q8_K: quantize_q8_K_ref(src, (BlockQ8_K*)dst, n); break;
    default: break;
  }
}

float vec_dot_ref(GgmlType w, const void* w_row, const void* act_row, int64_t n) {
  const int64_t nb = n / std::max(1, geometry(w).block_elems);
  const float* af = (const float*)act_row;
  switch (w) {
    case GgmlType::F32: {
      const float* wf = (const float*)w_row;
      return dot_float_lanes<true>(af, n, [&](int64_t i) { return wf[i]; });
    }
    case GgmlType::F16: {
      const uint16_t* wh = (const uint16_t*)w_row;
      return dot_float_lanes<false>(af, n, [&](int64_t i) { return fp16_to_fp32(wh[i]); });
    }
    case GgmlType::BF16: return dot_bf16_lanes((const uint16_t*)w_row, af, n);
    case GgmlType::Q4_0: return dot_q4_0((const BlockQ4_0*)w_row, (const BlockQ8_0*)act_row, nb);
    case GgmlType::Q4_1: return dot_q4_1((const BlockQ4_1*)w_row, (const BlockQ8_1*)act_row, nb);
    case GgmlType::Q5_0: return dot_q5_0((const BlockQ5_0*)w_row, (const BlockQ8_0*)act_row, nb);
    case GgmlType::Q5_1: return dot_q5_1((const BlockQ5_1*)w_row, (const BlockQ8_1*)act_row, nb);
    case GgmlType::Q8_0: return dot_q8_0((const BlockQ8_0*)w_row, (const BlockQ8_0*)act_row, nb);
    case GgmlType::Q4_K: return dot_q4_k((const BlockQ4_K*)w_row, (const BlockQ8_K*)act_row, nb);
    case GgmlType::Q5_K: return dot_q5_k((const BlockQ5_K*)w_row, (const BlockQ8_K*)act_row, nb);
    case GgmlType::Q6_K: return dot_q6_k((const BlockQ6_K*)w_row, (const BlockQ8_K*)act_row, nb);
    default: return 0.f;
  }
}

}  // namespace kvzap::kernels
