// AVX2 + FMA + F16C kernels for float weights F32, F16 and BF16, with the arithmetic of the AVX-512
// kernels (gemm_float_avx512.cpp) and of the reference (quant_ref.cpp), bit for bit:
//  * one 16-lane f32 accumulator per output, kept as two ymm (lanes 0-7, 8-15), folded at the end as
//    reduce4 folds a zmm (lane j + lane j+8, then +4, +2, +1);
//  * F32 / F16: element i goes to lane i % 16, acc = fma(w_i, a_i, acc) in element order (activations f32;
//    for F16 weights rounded to f16 first);
//  * BF16: vdpbf16ps emulated: per 32 elements lane j adds w a of element 2j + 1, then of element 2j (bf16
//    products are exact in f32, so each fma rounds once, like each add of the instruction). Activations
//    (rounded to bf16) are stored as f32 in "lane order": per 32 elements [odd elements: lanes 0-15]
//    [even elements: lanes 0-15], so the F32 loop over 16-float chunks runs BF16 too.
//  * Prefill: rows are converted two at a time into the workspace in lane order ([2][padded n] f32) and
//    reused for every token of the work item, in 2-row x 3-token tiles (12 accumulators).
//    Decode (one token): 4 rows at a time, converted on the fly.
// Internal linkage throughout, no standard-library templates (see matmul_avx2.cpp).
#include <immintrin.h>

#include "kernels/kernel_table.h"

namespace kvzap::kernels {
namespace {

enum class Kind { F32, F16, BF16 };

// Elements per step: one 16-lane chunk (F32 / F16) or two (BF16: odd, then even elements).
template <Kind K> constexpr int kStep = K == Kind::BF16 ? 32 : 16;
template <Kind K> constexpr int kElemBytes = K == Kind::F32 ? 4 : 2;

constexpr int kGemvRows = 4, kTileRows = 2, kTileToks = 3;

template <Kind K>
inline int64_t padded(int64_t n) { return (n + kStep<K> - 1) / kStep<K> * kStep<K>; }

// bf16 pairs (element 2j low, 2j + 1 high in dword j) -> f32 of the odd / even elements.
inline __m256 bf16_odd(__m256i d) { return _mm256_castsi256_ps(_mm256_and_si256(d, _mm256_set1_epi32((int)0xFFFF0000u))); }
inline __m256 bf16_even(__m256i d) { return _mm256_castsi256_ps(_mm256_slli_epi32(d, 16)); }

// One step of kStep raw weights (all present) -> lane-order f32: out[2c] lanes 0-7, out[2c + 1] lanes 8-15
// of chunk c.
template <Kind K>
inline void load_step(const uint8_t* src, __m256* out) {
  if constexpr (K == Kind::F32) {
    out[0] = _mm256_loadu_ps((const float*)src);
    out[1] = _mm256_loadu_ps((const float*)src + 8);
  } else if constexpr (K == Kind::F16) {
    out[0] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)src));
    out[1] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)src + 1));
  } else {
    const __m256i d0 = _mm256_loadu_si256((const __m256i*)src);       // elements 0-15: lanes 0-7
    const __m256i d1 = _mm256_loadu_si256((const __m256i*)src + 1);   // elements 16-31: lanes 8-15
    out[0] = bf16_odd(d0);
    out[1] = bf16_odd(d1);
    out[2] = bf16_even(d0);
    out[3] = bf16_even(d1);
  }
}

// The last, partial step (left < kStep elements): copied into a zeroed step first.
template <Kind K>
inline void load_tail(const uint8_t* src, int64_t left, __m256* out) {
  alignas(32) uint8_t buf[kStep<K> * kElemBytes<K>] = {};
  __builtin_memcpy(buf, src, (size_t)left * kElemBytes<K>);
  load_step<K>(buf, out);
}

// Sum of the 16 lanes (lo: 0-7, hi: 8-15) in reduce4's order.
inline float fold16(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// ---------------------------------------------------------------- activations

template <Kind K>
size_t act_bytes(int64_t n) { return (size_t)padded<K>(n) * sizeof(float); }

// fp32_to_bf16 of 8 floats (integer RNE, NaN kept and quieted) in the low halves of the lanes.
inline __m256i round_bf16(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
  const __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));  // abs >= 0: signed compare is fine
  const __m256i q = _mm256_blendv_epi8(r, _mm256_or_si256(x, _mm256_set1_epi32(0x00400000)), nan);
  return _mm256_srli_epi32(q, 16);
}

// 16 floats -> their 16 bf16 values as 8 dwords in element order.
inline __m256i bf16_pairs(const float* x) {
  const __m256i p = _mm256_packus_epi32(round_bf16(_mm256_loadu_ps(x)), round_bf16(_mm256_loadu_ps(x + 8)));
  return _mm256_permute4x64_epi64(p, 0xD8);  // packus interleaves the 128-bit halves
}

// One step of kStep activations (all present) -> lane order, as load_step orders the weights.
template <Kind K>
inline void prepare_step(const float* x, float* out) {
  if constexpr (K == Kind::F32) {
    _mm256_store_ps(out, _mm256_loadu_ps(x));
    _mm256_store_ps(out + 8, _mm256_loadu_ps(x + 8));
  } else if constexpr (K == Kind::F16) {
    for (int h = 0; h < 2; ++h)
      _mm256_store_ps(out + 8 * h, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + 8 * h), _MM_FROUND_TO_NEAREST_INT)));
  } else {
    const __m256i d0 = bf16_pairs(x), d1 = bf16_pairs(x + 16);
    _mm256_store_ps(out, bf16_odd(d0));
    _mm256_store_ps(out + 8, bf16_odd(d1));
    _mm256_store_ps(out + 16, bf16_even(d0));
    _mm256_store_ps(out + 24, bf16_even(d1));
  }
}

template <Kind K>
void prepare(const float* x, uint8_t* dst, int64_t n) {
  float* out = (float*)dst;
  int64_t i = 0;
  for (; i + kStep<K> <= n; i += kStep<K>) prepare_step<K>(x + i, out + i);
  if (i < n) {
    float buf[kStep<K>] = {};
    __builtin_memcpy(buf, x + i, (size_t)(n - i) * sizeof(float));
    prepare_step<K>(buf, out + i);
  }
}

// ---------------------------------------------------------------- decode path (one token)

template <Kind K, int NR>
__attribute__((always_inline)) inline void gemv_rows(const uint8_t* const* rows, const float* a, int64_t n, float* out) {
  constexpr int kChunks = kStep<K> / 16;
  __m256 acc[NR][2];
  for (int r = 0; r < NR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += kStep<K>) {
    const bool tail = i + kStep<K> > n;
    for (int r = 0; r < NR; ++r) {
      __m256 wv[2 * kChunks];
      const uint8_t* src = rows[r] + (size_t)i * kElemBytes<K>;
      if (tail) load_tail<K>(src, n - i, wv);
      else load_step<K>(src, wv);
      for (int c = 0; c < kChunks; ++c) {
        acc[r][0] = _mm256_fmadd_ps(wv[2 * c], _mm256_load_ps(a + i + 16 * c), acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(wv[2 * c + 1], _mm256_load_ps(a + i + 16 * c + 8), acc[r][1]);
      }
    }
  }
  for (int r = 0; r < NR; ++r) out[r] = fold16(acc[r][0], acc[r][1]);
}

template <Kind K>
void gemv(const WeightMatrix& w, const float* a, int64_t r0, int64_t r1, float* y) {
  int64_t r = r0;
  for (; r + kGemvRows <= r1; r += kGemvRows) {
    const uint8_t* rows[kGemvRows];
    for (int i = 0; i < kGemvRows; ++i) rows[i] = w.data + (size_t)(r + i) * w.row_stride;
    gemv_rows<K, kGemvRows>(rows, a, w.n_in, y + r);
  }
  for (; r < r1; ++r) {
    const uint8_t* row = w.data + (size_t)r * w.row_stride;
    gemv_rows<K, 1>(&row, a, w.n_in, y + r);
  }
}

// ---------------------------------------------------------------- prefill path (token tiles)

template <Kind K>
size_t work_bytes(int64_t n) { return (size_t)kTileRows * (size_t)padded<K>(n) * sizeof(float); }

// Rows [r0, r0 + nr) in lane order into work [kTileRows][padded n] (a missing row is zero).
template <Kind K>
void pack_rows(const WeightMatrix& w, int64_t r0, int nr, float* work) {
  constexpr int kChunks = kStep<K> / 16;
  const int64_t n = w.n_in, L = padded<K>(n);
  for (int r = 0; r < kTileRows; ++r) {
    float* out = work + (size_t)r * L;
    if (r >= nr) {
      for (int64_t i = 0; i < L; i += 8) _mm256_store_ps(out + i, _mm256_setzero_ps());
      continue;
    }
    const uint8_t* row = w.data + (size_t)(r0 + r) * w.row_stride;
    for (int64_t i = 0; i < n; i += kStep<K>) {
      __m256 wv[2 * kChunks];
      if (i + kStep<K> > n) load_tail<K>(row + (size_t)i * kElemBytes<K>, n - i, wv);
      else load_step<K>(row + (size_t)i * kElemBytes<K>, wv);
      for (int c = 0; c < 2 * kChunks; ++c) _mm256_store_ps(out + i + 8 * c, wv[c]);
    }
  }
}

// y[t][r] for the 2 packed rows (nr valid) and NT tokens; L floats per packed row.
template <int NT>
inline void tile(const float* pack, int64_t L, const float* const* a, int nr, float* y, int64_t ldy) {
  __m256 acc[kTileRows][NT][2];
  for (int r = 0; r < kTileRows; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
  for (int64_t i = 0; i < L; i += 16) {
    for (int h = 0; h < 2; ++h) {
      __m256 wv[kTileRows];
      for (int r = 0; r < kTileRows; ++r) wv[r] = _mm256_load_ps(pack + (size_t)r * L + i + 8 * h);
      for (int t = 0; t < NT; ++t) {
        const __m256 av = _mm256_load_ps(a[t] + i + 8 * h);
        for (int r = 0; r < kTileRows; ++r) acc[r][t][h] = _mm256_fmadd_ps(wv[r], av, acc[r][t][h]);
      }
    }
  }
  for (int r = 0; r < nr; ++r)
    for (int t = 0; t < NT; ++t) y[t * ldy + r] = fold16(acc[r][t][0], acc[r][t][1]);
}

template <Kind K>
void compute(const WeightMatrix& w, const uint8_t* act, size_t act_stride, int64_t r0, int64_t r1, int64_t t0,
             int64_t t1, float* y, int64_t ldy, uint8_t* work) {
  if (t1 - t0 == 1) {
    gemv<K>(w, (const float*)(act + (size_t)t0 * act_stride), r0, r1, y + t0 * ldy);
    return;
  }
  const int64_t L = padded<K>(w.n_in);
  float* pack = (float*)work;
  for (int64_t g = r0; g < r1; g += kTileRows) {
    const int nr = (int)(r1 - g < kTileRows ? r1 - g : kTileRows);
    pack_rows<K>(w, g, nr, pack);
    for (int64_t t = t0; t < t1; t += kTileToks) {
      const int nt = (int)(t1 - t < kTileToks ? t1 - t : kTileToks);
      const float* a[kTileToks];
      for (int i = 0; i < kTileToks; ++i) a[i] = (const float*)(act + (size_t)(t + (i < nt ? i : 0)) * act_stride);
      float* yt = y + t * ldy + g;
      switch (nt) {
        case 3: tile<3>(pack, L, a, nr, yt, ldy); break;
        case 2: tile<2>(pack, L, a, nr, yt, ldy); break;
        default: tile<1>(pack, L, a, nr, yt, ldy); break;
      }
    }
  }
}

template <Kind K>
MatmulKernel make_kernel() {
  MatmulKernel k;
  k.act_row_bytes = act_bytes<K>;
  k.prepare_act = prepare<K>;
  k.work_bytes = work_bytes<K>;
  k.compute = compute<K>;
  return k;
}

}  // namespace

MatmulKernel avx2_float_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::F32: return make_kernel<Kind::F32>();
    case GgmlType::F16: return make_kernel<Kind::F16>();
    case GgmlType::BF16: return make_kernel<Kind::BF16>();
    default: return {};
  }
}

}  // namespace kvzap::kernels
