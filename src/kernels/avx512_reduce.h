// Horizontal sums of AVX-512 float accumulators shared by the AVX-512 kernel files. Include only from
// files compiled for AVX-512 (*_avx512.cpp): everything here has internal linkage so no AVX-512 code
// can be shared with baseline code by the linker.
#pragma once
#include <immintrin.h>

namespace kvzap::kernels {
namespace {

// Sums the 16 lanes of each of v[0..15] by folding halves (lane i + lane i+8, then +4, +2, +1), for 16
// vectors at once. Result lane 4 * b + k holds the sum of v[4 * k + b]. Each vector's own lanes are
// added in the same order whatever the other vectors hold, so every caller gets identical bits.
inline __m512 fold_level(__m512 a, __m512 b, int level) {
  switch (level) {
    case 0: return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    case 1: return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
    case 2: return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
    default: return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
  }
}

inline __m512 reduce16(const __m512* v) {
  __m512 c[8], e[4], g[2];
  for (int k = 0; k < 8; ++k) c[k] = fold_level(v[2 * k], v[2 * k + 1], 0);
  for (int k = 0; k < 4; ++k) e[k] = fold_level(c[2 * k], c[2 * k + 1], 1);
  for (int k = 0; k < 2; ++k) g[k] = fold_level(e[2 * k], e[2 * k + 1], 2);
  return fold_level(g[0], g[1], 3);
}

// The same folds for 4 vectors; result lane k (k < 4) = sum of v_k.
inline __m512 reduce4(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
  const __m512 z = _mm512_setzero_ps();
  const __m512 e = fold_level(fold_level(v0, v1, 0), fold_level(v2, v3, 0), 1);  // 128-bit block k: v_k
  const __m512 x = fold_level(fold_level(e, z, 2), z, 3);                         // lane 4k: sum of v_k
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), x);
}

}  // namespace
}  // namespace kvzap::kernels
