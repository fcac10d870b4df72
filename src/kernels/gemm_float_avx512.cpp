// AVX-512 kernels for float weights: F32, F16 (F16C conversions) and BF16 (AVX-512 BF16 vdpbf16ps).
//
// Arithmetic (the same per output on every path; quant_ref.cpp's vec_dot_ref spells it out in scalar):
//  * F32 / F16: activations are f32 (F16 weights: rounded to f16 first, ggml's vec_dot_type), zero-padded
//    to a multiple of 16. Element i goes to lane i % 16 of one 16-lane f32 accumulator, in element order:
//    acc = fma(w_i, a_i, acc). F16 products are exact in f32, so that is also acc + w_i * a_i.
//  * BF16: activations are rounded to bf16 (RNE, as fp32_to_bf16) and zero-padded to a multiple of 32; one
//    vdpbf16ps per 32 elements: lane j adds w a of element 2j + 1, then of element 2j (each rounded to f32).
//  * The 16 lanes are folded by reduce4 / reduce16 (lane j + lane j+8, then +4, +2, +1).
//  * Prefill: 4-row x 4-token tiles. F32 / F16 rows are converted once per work item into the thread's
//    workspace as f32 [4][padded n] and reused for every token; BF16 rows are used as they are.
//    Decode (one token): 4 rows at a time straight from the weights, with prefetching.
// vdpbf16ps treats denormal inputs as zero and flushes denormal results, which plain f32 arithmetic does
// not: the AVX2 emulation and the reference agree with it bit for bit unless a product or partial sum
// falls below FLT_MIN (or an intermediate overflows), i.e. never for weights and activations of a model.
// Without AVX-512 BF16 the BF16 kernel is not offered and the dispatcher takes the AVX2 emulation.
// Internal linkage throughout, no standard-library templates (see matmul_avx512.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include "kernels/avx512_reduce.h"
#include "kernels/kernel_table.h"

#define KVZAP_BF16_TARGET __attribute__((target("avx512bf16")))

namespace kvzap::kernels {
namespace {

constexpr int kRows = 4, kToks = 4;
constexpr int kPrefetchRows = 16;  // decode: prefetch the same bytes 4 row groups ahead

enum class Kind { F32, F16 };

inline int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }
inline int64_t pad32(int64_t n) { return (n + 31) / 32 * 32; }
inline __mmask16 mask16(int64_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1); }
inline __mmask32 mask32(int64_t left) { return left >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << left) - 1); }

// ---------------------------------------------------------------- activations

size_t act_bytes_f32(int64_t n) { return (size_t)pad16(n) * sizeof(float); }

// [pad16(n)] f32, zero tail; F16: each value rounded to f16 (RNE, exactly fp32_to_fp16) and back.
template <Kind K>
void prepare_f(const float* x, uint8_t* dst, int64_t n) {
  float* out = (float*)dst;
  for (int64_t i = 0; i < n; i += 16) {
    __m512 v = _mm512_maskz_loadu_ps(mask16(n - i), x + i);
    if constexpr (K == Kind::F16) v = _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm512_store_ps(out + i, v);
  }
}

size_t act_bytes_bf16(int64_t n) { return (size_t)pad32(n) * sizeof(uint16_t); }

// fp32_to_bf16 of 16 floats (integer RNE, NaN kept and quieted) in the low halves of the lanes. Done in
// integers rather than with vcvtneps2bf16, which would flush denormals where the reference rounds them.
inline __m512i round_bf16(__m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_srli_epi32(_mm512_mask_or_epi32(r, nan, x, _mm512_set1_epi32(0x00400000)), 16);
}

// [pad32(n)] bf16, zero tail.
void prepare_bf16(const float* x, uint8_t* dst, int64_t n) {
  uint16_t* out = (uint16_t*)dst;
  for (int64_t i = 0; i < n; i += 32) {
    const __m512i lo = round_bf16(_mm512_maskz_loadu_ps(mask16(n - i), x + i));
    const __m512i hi = round_bf16(_mm512_maskz_loadu_ps(n - i > 16 ? mask16(n - i - 16) : 0, x + i + 16));
    _mm256_store_si256((__m256i*)(out + i), _mm512_cvtepi32_epi16(lo));
    _mm256_store_si256((__m256i*)(out + i + 16), _mm512_cvtepi32_epi16(hi));
  }
}

// ---------------------------------------------------------------- F32 / F16

// 16 weights from element i of a row (masked lanes read nothing and are 0).
template <Kind K>
inline __m512 load_w(const uint8_t* row, int64_t i, __mmask16 m) {
  if constexpr (K == Kind::F32) return _mm512_maskz_loadu_ps(m, (const float*)row + i);
  else return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t*)row + i));
}
template <Kind K>
inline __m512 load_w(const uint8_t* row, int64_t i) {
  if constexpr (K == Kind::F32) return _mm512_loadu_ps((const float*)row + i);
  else return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)((const uint16_t*)row + i)));
}

template <Kind K, int NR>
__attribute__((always_inline)) inline void gemv_rows_f(const uint8_t* const* rows, const float* a, int64_t n,
                                                       size_t prefetch_distance, float* out) {
  constexpr int kStepBytes = K == Kind::F32 ? 64 : 32;  // weight bytes per 16 elements
  __m512 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 av = _mm512_load_ps(a + i);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      if (K == Kind::F32 || (i & 31) == 0) _mm_prefetch((const char*)rows[r] + prefetch_distance + i / 16 * kStepBytes, _MM_HINT_T1);
      acc[r] = _mm512_fmadd_ps(load_w<K>(rows[r], i), av, acc[r]);
    }
  }
  if (i < n) {
    const __mmask16 m = mask16(n - i);
    const __m512 av = _mm512_load_ps(a + i);
    for (int r = 0; r < NR; ++r) acc[r] = _mm512_fmadd_ps(load_w<K>(rows[r], i, m), av, acc[r]);
  }
  __m512 v[4];
  for (int r = 0; r < 4; ++r) v[r] = r < NR ? acc[r] : _mm512_setzero_ps();
  _mm512_mask_storeu_ps(out, (__mmask16)((1u << NR) - 1), reduce4(v[0], v[1], v[2], v[3]));
}

template <Kind K>
void gemv_f(const WeightMatrix& w, const float* a, int64_t r0, int64_t r1, float* y) {
  int64_t r = r0;
  for (; r + kRows <= r1; r += kRows) {
    const uint8_t* rows[kRows];
    for (int i = 0; i < kRows; ++i) rows[i] = w.data + (size_t)(r + i) * w.row_stride;
    gemv_rows_f<K, kRows>(rows, a, w.n_in, kPrefetchRows * w.row_stride, y + r);
  }
  for (; r < r1; ++r) {
    const uint8_t* row = w.data + (size_t)r * w.row_stride;
    gemv_rows_f<K, 1>(&row, a, w.n_in, w.row_stride, y + r);
  }
}

size_t work_bytes_f(int64_t n) { return (size_t)kRows * (size_t)pad16(n) * sizeof(float); }

// Rows [r0, r0 + nr) as f32 into work [kRows][pad16(n)] (zero tail; a missing row is zero).
template <Kind K>
void pack_rows_f(const WeightMatrix& w, int64_t r0, int nr, float* work) {
  const int64_t n = w.n_in, L = pad16(n);
  for (int r = 0; r < kRows; ++r) {
    float* out = work + (size_t)r * L;
    if (r >= nr) {
      for (int64_t i = 0; i < L; i += 16) _mm512_store_ps(out + i, _mm512_setzero_ps());
      continue;
    }
    const uint8_t* row = w.data + (size_t)(r0 + r) * w.row_stride;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_store_ps(out + i, load_w<K>(row, i));
    if (i < n) _mm512_store_ps(out + i, load_w<K>(row, i, mask16(n - i)));
  }
}

// y[t][r] for the 4 packed rows (nr valid) and NT tokens.
template <int NT>
inline void tile_f(const float* pack, int64_t L, const float* const* a, int nr, float* y, int64_t ldy) {
  __m512 acc[16];  // [row][token], as reduce16 wants it
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t i = 0; i < L; i += 16) {
    __m512 wv[kRows];
    for (int r = 0; r < kRows; ++r) wv[r] = _mm512_load_ps(pack + (size_t)r * L + i);
    for (int t = 0; t < NT; ++t) {
      const __m512 av = _mm512_load_ps(a[t] + i);
      for (int r = 0; r < kRows; ++r) acc[4 * r + t] = _mm512_fmadd_ps(wv[r], av, acc[4 * r + t]);
    }
  }
  alignas(64) float sums[16];  // [token][row]
  _mm512_store_ps(sums, reduce16(acc));
  const __mmask8 rows_valid = (__mmask8)((1u << nr) - 1);
  for (int t = 0; t < NT; ++t) _mm_mask_storeu_ps(y + t * ldy, rows_valid, _mm_load_ps(sums + 4 * t));
}

template <Kind K>
void compute_f(const WeightMatrix& w, const uint8_t* act, size_t act_stride, int64_t r0, int64_t r1, int64_t t0,
               int64_t t1, float* y, int64_t ldy, uint8_t* work) {
  if (t1 - t0 == 1) {
    gemv_f<K>(w, (const float*)(act + (size_t)t0 * act_stride), r0, r1, y + t0 * ldy);
    return;
  }
  const int64_t L = pad16(w.n_in);
  float* pack = (float*)work;
  for (int64_t g = r0; g < r1; g += kRows) {
    const int nr = (int)(r1 - g < kRows ? r1 - g : kRows);
    pack_rows_f<K>(w, g, nr, pack);
    for (int64_t t = t0; t < t1; t += kToks) {
      const int nt = (int)(t1 - t < kToks ? t1 - t : kToks);
      const float* a[kToks];
      for (int i = 0; i < kToks; ++i) a[i] = (const float*)(act + (size_t)(t + (i < nt ? i : 0)) * act_stride);
      float* yt = y + t * ldy + g;
      switch (nt) {
        case 4: tile_f<4>(pack, L, a, nr, yt, ldy); break;
        case 3: tile_f<3>(pack, L, a, nr, yt, ldy); break;
        case 2: tile_f<2>(pack, L, a, nr, yt, ldy); break;
        default: tile_f<1>(pack, L, a, nr, yt, ldy); break;
      }
    }
  }
}

// ---------------------------------------------------------------- BF16 (vdpbf16ps)

KVZAP_BF16_TARGET inline __m512 dp_bf16(__m512 acc, __m512i w, __m512i a) {
  return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)a);
}

template <int NR>
KVZAP_BF16_TARGET __attribute__((always_inline)) inline void gemv_rows_bf16(const uint8_t* const* rows,
                                                                            const uint16_t* a, int64_t n,
                                                                            size_t prefetch_distance, float* out) {
  __m512 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i av = _mm512_load_si512((const void*)(a + i));
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const uint16_t* wr = (const uint16_t*)rows[r] + i;
      _mm_prefetch((const char*)wr + prefetch_distance, _MM_HINT_T1);
      acc[r] = dp_bf16(acc[r], _mm512_loadu_si512((const void*)wr), av);
    }
  }
  if (i < n) {
    const __mmask32 m = mask32(n - i);
    const __m512i av = _mm512_load_si512((const void*)(a + i));
    for (int r = 0; r < NR; ++r)
      acc[r] = dp_bf16(acc[r], _mm512_maskz_loadu_epi16(m, (const uint16_t*)rows[r] + i), av);
  }
  __m512 v[4];
  for (int r = 0; r < 4; ++r) v[r] = r < NR ? acc[r] : _mm512_setzero_ps();
  _mm512_mask_storeu_ps(out, (__mmask16)((1u << NR) - 1), reduce4(v[0], v[1], v[2], v[3]));
}

KVZAP_BF16_TARGET void gemv_bf16(const WeightMatrix& w, const uint16_t* a, int64_t r0, int64_t r1, float* y) {
  int64_t r = r0;
  for (; r + kRows <= r1; r += kRows) {
    const uint8_t* rows[kRows];
    for (int i = 0; i < kRows; ++i) rows[i] = w.data + (size_t)(r + i) * w.row_stride;
    gemv_rows_bf16<kRows>(rows, a, w.n_in, kPrefetchRows * w.row_stride, y + r);
  }
  for (; r < r1; ++r) {
    const uint8_t* row = w.data + (size_t)r * w.row_stride;
    gemv_rows_bf16<1>(&row, a, w.n_in, w.row_stride, y + r);
  }
}

// y[t][r] for rows[0..3] (nr valid; the others repeat a valid row) and NT tokens; weights read in place.
template <int NT>
KVZAP_BF16_TARGET inline void tile_bf16(const uint16_t* const* rows, int64_t n, const uint16_t* const* a, int nr,
                                        float* y, int64_t ldy) {
  __m512 acc[16];  // [row][token]
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512i wv[kRows];
    for (int r = 0; r < kRows; ++r) wv[r] = _mm512_loadu_si512((const void*)(rows[r] + i));
    for (int t = 0; t < NT; ++t) {
      const __m512i av = _mm512_load_si512((const void*)(a[t] + i));
      for (int r = 0; r < kRows; ++r) acc[4 * r + t] = dp_bf16(acc[4 * r + t], wv[r], av);
    }
  }
  if (i < n) {
    const __mmask32 m = mask32(n - i);
    __m512i wv[kRows];
    for (int r = 0; r < kRows; ++r) wv[r] = _mm512_maskz_loadu_epi16(m, rows[r] + i);
    for (int t = 0; t < NT; ++t) {
      const __m512i av = _mm512_load_si512((const void*)(a[t] + i));
      for (int r = 0; r < kRows; ++r) acc[4 * r + t] = dp_bf16(acc[4 * r + t], wv[r], av);
    }
  }
  alignas(64) float sums[16];  // [token][row]
  _mm512_store_ps(sums, reduce16(acc));
  const __mmask8 rows_valid = (__mmask8)((1u << nr) - 1);
  for (int t = 0; t < NT; ++t) _mm_mask_storeu_ps(y + t * ldy, rows_valid, _mm_load_ps(sums + 4 * t));
}

KVZAP_BF16_TARGET void compute_bf16(const WeightMatrix& w, const uint8_t* act, size_t act_stride, int64_t r0,
                                    int64_t r1, int64_t t0, int64_t t1, float* y, int64_t ldy, uint8_t*) {
  if (t1 - t0 == 1) {
    gemv_bf16(w, (const uint16_t*)(act + (size_t)t0 * act_stride), r0, r1, y + t0 * ldy);
    return;
  }
  for (int64_t g = r0; g < r1; g += kRows) {
    const int nr = (int)(r1 - g < kRows ? r1 - g : kRows);
    const uint16_t* rows[kRows];
    for (int i = 0; i < kRows; ++i) rows[i] = (const uint16_t*)(w.data + (size_t)(g + (i < nr ? i : 0)) * w.row_stride);
    for (int64_t t = t0; t < t1; t += kToks) {
      const int nt = (int)(t1 - t < kToks ? t1 - t : kToks);
      const uint16_t* a[kToks];
      for (int i = 0; i < kToks; ++i) a[i] = (const uint16_t*)(act + (size_t)(t + (i < nt ? i : 0)) * act_stride);
      float* yt = y + t * ldy + g;
      switch (nt) {
        case 4: tile_bf16<4>(rows, w.n_in, a, nr, yt, ldy); break;
        case 3: tile_bf16<3>(rows, w.n_in, a, nr, yt, ldy); break;
        case 2: tile_bf16<2>(rows, w.n_in, a, nr, yt, ldy); break;
        default: tile_bf16<1>(rows, w.n_in, a, nr, yt, ldy); break;
      }
    }
  }
}

bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
}

}  // namespace

MatmulKernel avx512_float_kernel(GgmlType type) {
  MatmulKernel k;
  switch (type) {
    case GgmlType::F32:
      k.act_row_bytes = act_bytes_f32;
      k.prepare_act = prepare_f<Kind::F32>;
      k.work_bytes = work_bytes_f;
      k.compute = compute_f<Kind::F32>;
      break;
    case GgmlType::F16:
      k.act_row_bytes = act_bytes_f32;
      k.prepare_act = prepare_f<Kind::F16>;
      k.work_bytes = work_bytes_f;
      k.compute = compute_f<Kind::F16>;
      break;
    case GgmlType::BF16: {
      static const bool has_bf16 = cpu_has_avx512_bf16();
      if (!has_bf16) return {};  // the AVX2 kernel emulates vdpbf16ps
      k.act_row_bytes = act_bytes_bf16;
      k.prepare_act = prepare_bf16;
      k.compute = compute_bf16;
      break;
    }
    default: return {};
  }
  return k;
}

}  // namespace kvzap::kernels
