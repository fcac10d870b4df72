// AVX2 + FMA + F16C kernels: ggml-format activation quantizers (bit-exact with the scalar reference),
// one vec-dot per (weight row, token) for every type, and the f32/f16 vector helpers.
// Everything here has internal linkage and no standard-library templates are instantiated, so no
// AVX2-compiled inline function can be picked by the linker for baseline code.
#include <immintrin.h>

#include "kernels/kernel_table.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_ref.h"

namespace kvzap::kernels {
namespace {

// ---------------------------------------------------------------- small helpers

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float h2f_fast(uint16_t h) { return _cvtsh_ss(h); }  // exact, same as fp16_to_fp32
inline float bf16_bits_to_f32(uint16_t h) {
  const uint32_t bits = (uint32_t)h << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15) then high nibbles (16..31).
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128((const __m128i*)qs);
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// 32 bits -> 32 bytes, 0xFF where the bit is set (bit j -> byte j).
inline __m256i bits_to_bytes(uint32_t bits) {
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
  const __m256i bit_of_byte = _mm256_set1_epi64x(0x8040201008040201);
  v = _mm256_and_si256(v, bit_of_byte);
  return _mm256_cmpeq_epi8(v, bit_of_byte);
}

// Sum of u8 x s8 products, in 8 int32 lanes.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
// Sum of s8 x s8 products (sign trick: |x| * (y with x's sign)).
inline __m256i dot_s8s8(__m256i x, __m256i y) {
  return dot_u8s8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

// roundf (half away from zero), exactly: trunc, then step away from zero when |frac| >= 0.5.
inline __m256 round_half_away(__m256 v) {
  const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256 frac = _mm256_andnot_ps(sign_mask, _mm256_sub_ps(v, t));
  const __m256 step = _mm256_or_ps(_mm256_and_ps(v, sign_mask), _mm256_set1_ps(1.0f));
  return _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), step));
}

inline uint16_t f2h_fast(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }  // RNE, as fp32_to_fp16

// Quantizes 32 floats with the Q8_0 rule (d = amax / 127, q = roundf(x * (1 / d))); returns d and the
// sum of the quants.
inline float quantize_block_q8(const float* x, int8_t* qs, int* sum) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[k]));
  }
  const float d = hmax(amax) / 127;
  const float id = d ? 1.0f / d : 0.0f;
  const __m256 vid = _mm256_set1_ps(id);
  __m256i q[4];
  for (int k = 0; k < 4; ++k) q[k] = _mm256_cvttps_epi32(round_half_away(_mm256_mul_ps(v[k], vid)));
  const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
  s = _mm_hadd_epi32(s, s);
  s = _mm_hadd_epi32(s, s);
  *sum = _mm_cvtsi128_si32(s);
  // Pack 32 int32 -> 32 int8; packs interleave 128-bit lanes, the permute restores element order.
  const __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
  const __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
  const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
  const __m256i fixed = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256((__m256i*)qs, fixed);
  return d;
}

size_t act_bytes_q8_0(int64_t n) { return kernel_row_bytes(GgmlType::Q8_0, n); }
size_t act_bytes_q8_1(int64_t n) { return kernel_row_bytes(GgmlType::Q8_1, n); }
size_t act_bytes_q8_k(int64_t n) { return kernel_row_bytes(GgmlType::Q8_K, n); }

void prep_q8_0(const float* x, uint8_t* dst, int64_t n) {
  BlockQ8_0* y = (BlockQ8_0*)dst;
  for (int64_t b = 0; b < n / kQK; ++b) {
    int sum;
    y[b].d = f2h_fast(quantize_block_q8(x + b * kQK, y[b].qs, &sum));
  }
}

void prep_q8_1(const float* x, uint8_t* dst, int64_t n) {
  BlockQ8_1* y = (BlockQ8_1*)dst;
  for (int64_t b = 0; b < n / kQK; ++b) {
    int sum;
    const float d = quantize_block_q8(x + b * kQK, y[b].qs, &sum);
    y[b].d = f2h_fast(d);
    y[b].s = f2h_fast((float)sum * d);
  }
}

void prep_q8_k(const float* x, uint8_t* dst, int64_t n) { quantize_q8_K_ref(x, (BlockQ8_K*)dst, n); }

// ---------------------------------------------------------------- vec-dots (one row x one token)

float dot_q4_0(const void* wv, const void* av, int64_t n) {
  const BlockQ4_0* w = (const BlockQ4_0*)wv;
  const BlockQ8_0* a = (const BlockQ8_0*)av;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK; ++b) {
    const __m256i qw = _mm256_sub_epi8(unpack_nibbles(w[b].qs), _mm256_set1_epi8(8));
    const __m256i qa = _mm256_loadu_si256((const __m256i*)a[b].qs);
    const __m256 d = _mm256_set1_ps(h2f_fast(w[b].d) * h2f_fast(a[b].d));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_s8s8(qw, qa)), d, acc);
  }
  return hsum(acc);
}

float dot_q4_1(const void* wv, const void* av, int64_t n) {
  const BlockQ4_1* w = (const BlockQ4_1*)wv;
  const BlockQ8_1* a = (const BlockQ8_1*)av;
  __m256 acc = _mm256_setzero_ps();
  float summs = 0;
  for (int64_t b = 0; b < n / kQK; ++b) {
    summs += h2f_fast(w[b].m) * h2f_fast(a[b].s);
    const __m256i qw = unpack_nibbles(w[b].qs);
    const __m256i qa = _mm256_loadu_si256((const __m256i*)a[b].qs);
    const __m256 d = _mm256_set1_ps(h2f_fast(w[b].d) * h2f_fast(a[b].d));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(qw, qa)), d, acc);
  }
  return hsum(acc) + summs;
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

float dot_q5_0(const void* wv, const void* av, int64_t n) {
  const BlockQ5_0* w = (const BlockQ5_0*)wv;
  const BlockQ8_0* a = (const BlockQ8_0*)av;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK; ++b) {
    const __m256i hi = _mm256_and_si256(bits_to_bytes(load_u32(w[b].qh)), _mm256_set1_epi8(0x10));
    const __m256i qw = _mm256_sub_epi8(_mm256_or_si256(unpack_nibbles(w[b].qs), hi), _mm256_set1_epi8(16));
    const __m256i qa = _mm256_loadu_si256((const __m256i*)a[b].qs);
    const __m256 d = _mm256_set1_ps(h2f_fast(w[b].d) * h2f_fast(a[b].d));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_s8s8(qw, qa)), d, acc);
  }
  return hsum(acc);
}

float dot_q5_1(const void* wv, const void* av, int64_t n) {
  const BlockQ5_1* w = (const BlockQ5_1*)wv;
  const BlockQ8_1* a = (const BlockQ8_1*)av;
  __m256 acc = _mm256_setzero_ps();
  float summs = 0;
  for (int64_t b = 0; b < n / kQK; ++b) {
    summs += h2f_fast(w[b].m) * h2f_fast(a[b].s);
    const __m256i hi = _mm256_and_si256(bits_to_bytes(load_u32(w[b].qh)), _mm256_set1_epi8(0x10));
    const __m256i qw = _mm256_or_si256(unpack_nibbles(w[b].qs), hi);
    const __m256i qa = _mm256_loadu_si256((const __m256i*)a[b].qs);
    const __m256 d = _mm256_set1_ps(h2f_fast(w[b].d) * h2f_fast(a[b].d));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(qw, qa)), d, acc);
  }
  return hsum(acc) + summs;
}

float dot_q8_0(const void* wv, const void* av, int64_t n) {
  const BlockQ8_0* w = (const BlockQ8_0*)wv;
  const BlockQ8_0* a = (const BlockQ8_0*)av;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK; ++b) {
    const __m256i qw = _mm256_loadu_si256((const __m256i*)w[b].qs);
    const __m256i qa = _mm256_loadu_si256((const __m256i*)a[b].qs);
    const __m256 d = _mm256_set1_ps(h2f_fast(w[b].d) * h2f_fast(a[b].d));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_s8s8(qw, qa)), d, acc);
  }
  return hsum(acc);
}

// Q4_K / Q5_K share everything but the 5th bit.
template <bool kFive>
float dot_q45_k(const void* wv, const void* av, int64_t n) {
  const BlockQ8_K* a = (const BlockQ8_K*)av;
  const uint8_t* wbytes = (const uint8_t*)wv;
  const size_t wb = kFive ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const uint8_t* blk = wbytes + b * wb;
    uint16_t dh, dminh;
    __builtin_memcpy(&dh, blk, 2);
    __builtin_memcpy(&dminh, blk + 2, 2);
    const uint8_t* scales = blk + 4;
    const uint8_t* qs = blk + (kFive ? 48 : 16);
    const __m256i qh = kFive ? _mm256_loadu_si256((const __m256i*)(blk + 16)) : _mm256_setzero_si256();
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) k_scale_min(j, scales, &sc[j], &m[j]);
    int summ = 0;
    for (int j = 0; j < 8; ++j) summ += m[j] * (a[b].bsums[2 * j] + a[b].bsums[2 * j + 1]);
    __m256i sumi = _mm256_setzero_si256();
    for (int g = 0; g < 4; ++g) {
      const __m256i q = _mm256_loadu_si256((const __m256i*)(qs + 32 * g));
      __m256i lo = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), _mm256_set1_epi8(0x0F));
      if (kFive) {
        const __m256i b_lo = _mm256_set1_epi8((char)(1 << (2 * g)));
        const __m256i b_hi = _mm256_set1_epi8((char)(2 << (2 * g)));
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b_lo), b_lo),
                                                  _mm256_set1_epi8(0x10)));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b_hi), b_hi),
                                                  _mm256_set1_epi8(0x10)));
      }
      const __m256i a_lo = _mm256_loadu_si256((const __m256i*)(a[b].qs + 64 * g));
      const __m256i a_hi = _mm256_loadu_si256((const __m256i*)(a[b].qs + 64 * g + 32));
      const __m256i p_lo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a_lo), _mm256_set1_epi16(sc[2 * g]));
      const __m256i p_hi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a_hi), _mm256_set1_epi16(sc[2 * g + 1]));
      sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p_lo, p_hi));
    }
    const float d = h2f_fast(dh) * a[b].d;
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc);
    mins += h2f_fast(dminh) * a[b].d * (float)summ;
  }
  return hsum(acc) - mins;
}

float dot_q6_k(const void* wv, const void* av, int64_t n) {
  const BlockQ6_K* w = (const BlockQ6_K*)wv;
  const BlockQ8_K* a = (const BlockQ8_K*)av;
  __m256 acc = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3), k32 = _mm256_set1_epi8(32);
  for (int64_t b = 0; b < n / kQKK; ++b) {
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256((const __m256i*)(w[b].ql + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256((const __m256i*)(w[b].ql + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256((const __m256i*)(w[b].qh + 32 * h));
      const __m256i low[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                              _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                              _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
      const int8_t* sc = w[b].scales + 8 * h;
      for (int q = 0; q < 4; ++q) {
        const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * q), m3), 4);
        const __m256i q6 = _mm256_or_si256(low[q], high);  // 0..63
        const __m256i qa = _mm256_loadu_si256((const __m256i*)(a[b].qs + 128 * h + 32 * q));
        // sum (q6 - 32) * a = maddubs(q6, a) - maddubs(32, a)
        const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q6, qa), _mm256_maddubs_epi16(k32, qa));
        const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[2 * q + 1]), _mm_set1_epi16(sc[2 * q]));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, scv));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(h2f_fast(w[b].d) * a[b].d), acc);
  }
  return hsum(acc);
}

inline __m256 load_f16x8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
inline __m256 load_bf16x8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

// Float dots: 4 accumulators of 8 lanes, fixed order, scalar tail.
template <int kKind>  // 0 f32, 1 f16, 2 bf16
float dot_float(const void* wv, const void* av, int64_t n) {
  const float* a = (const float*)av;
  auto load = [&](int64_t i) {
    if constexpr (kKind == 0) return _mm256_loadu_ps((const float*)wv + i);
    else if constexpr (kKind == 1) return load_f16x8((const uint16_t*)wv + i);
    else return load_bf16x8((const uint16_t*)wv + i);
  };
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_fmadd_ps(load(i + 8 * k), _mm256_loadu_ps(a + i + 8 * k), acc[k]);
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load(i), _mm256_loadu_ps(a + i), acc[0]);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) {
    float wi;
    if constexpr (kKind == 0) wi = ((const float*)wv)[i];
    else if constexpr (kKind == 1) wi = h2f_fast(((const uint16_t*)wv)[i]);
    else wi = bf16_bits_to_f32(((const uint16_t*)wv)[i]);
    s += wi * a[i];
  }
  return s;
}

// Rows outer (a weight row stays in L1 across the token block), tokens inner.
template <float (*Dot)(const void*, const void*, int64_t)>
void compute_rows(const WeightMatrix& w, const uint8_t* act, size_t act_stride, int64_t r0, int64_t r1,
                  int64_t t0, int64_t t1, float* y, int64_t ldy, uint8_t*) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wr = w.data + (size_t)r * w.row_stride;
    for (int64_t t = t0; t < t1; ++t) y[t * ldy + r] = Dot(wr, act + (size_t)t * act_stride, w.n_in);
  }
}

// ---------------------------------------------------------------- vector helpers

float v_dot_f32(const float* a, const float* b, int64_t n) { return dot_float<0>(b, a, n); }
float v_dot_f32_f16(const float* a, const uint16_t* b, int64_t n) { return dot_float<1>(b, a, n); }

void v_axpy_f16(float alpha, const uint16_t* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load_f16x8(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * h2f_fast(x[i]);
}

void v_f32_to_f16_row(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i*)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) dst[i] = f2h_fast(src[i]);
}

}  // namespace

MatmulKernel avx2_kernel(GgmlType type) {
  MatmulKernel k;
  switch (partner_type(type)) {
    case GgmlType::Q8_0: k.act_row_bytes = act_bytes_q8_0; k.prepare_act = prep_q8_0; break;
    case GgmlType::Q8_1: k.act_row_bytes = act_bytes_q8_1; k.prepare_act = prep_q8_1; break;
    case GgmlType::Q8_K: k.act_row_bytes = act_bytes_q8_k; k.prepare_act = prep_q8_k; break;
    default: break;
  }
  switch (type) {
    case GgmlType::F32: k.compute = compute_rows<dot_float<0>>; break;
    case GgmlType::F16: k.compute = compute_rows<dot_float<1>>; break;
    case GgmlType::BF16: k.compute = compute_rows<dot_float<2>>; break;
    case GgmlType::Q4_0: k.compute = compute_rows<dot_q4_0>; break;
    case GgmlType::Q4_1: k.compute = compute_rows<dot_q4_1>; break;
    case GgmlType::Q5_0: k.compute = compute_rows<dot_q5_0>; break;
    case GgmlType::Q5_1: k.compute = compute_rows<dot_q5_1>; break;
    case GgmlType::Q8_0: k.compute = compute_rows<dot_q8_0>; break;
    case GgmlType::Q4_K: k.compute = compute_rows<dot_q45_k<false>>; break;
    case GgmlType::Q5_K: k.compute = compute_rows<dot_q45_k<true>>; break;
    case GgmlType::Q6_K: k.compute = compute_rows<dot_q6_k>; break;
    default: return {};
  }
  return k;
}

const VectorKernels& avx2_vector_kernels() {
  static const VectorKernels k{v_dot_f32, v_dot_f32_f16, v_axpy_f16, v_f32_to_f16_row};
  return k;
}

}  // namespace kvzap::kernels
