// AVX2 + FMA + F16C kernels for the K formats (one vec-dot per (weight row, token), activations in
// ggml's Q8_K), and the f32/f16 vector helpers. The 32-element formats have tiled kernels in
// gemm_q32_avx2.cpp, the float formats in gemm_float_avx2.cpp.
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

inline float h2f_fast(uint16_t h) { return _cvtsh_ss(h); }  // exact, same as fp16_to_fp32
inline float bf16_bits_to_f32(uint16_t h) {
  const uint32_t bits = (uint32_t)h << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f2h_fast(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }  // RNE, as fp32_to_fp16

size_t act_bytes_q8_k(int64_t n) { return kernel_row_bytes(GgmlType::Q8_K, n); }

void prep_q8_k(const float* x, uint8_t* dst, int64_t n) { quantize_q8_K_ref(x, (BlockQ8_K*)dst, n); }

// ---------------------------------------------------------------- vec-dots (one row x one token)

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
  if (MatmulKernel q32 = avx2_q32_kernel(type)) return q32;
  if (MatmulKernel f = avx2_float_kernel(type)) return f;
  if (partner_type(type) == GgmlType::Q8_K) {
    k.act_row_bytes = act_bytes_q8_k;
    k.prepare_act = prep_q8_k;
  }
  switch (type) {
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
