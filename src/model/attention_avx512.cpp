// AVX-512 inner loops of attention: keys and values are read straight from the pages (f16 ones through
// vcvtph2ps, f32 ones as they are), so nothing is transposed per page. One template per element type:
// the f16 instantiation is the instruction sequence the f16 cache always had. Compiled with AVX-512 flags
// by file name; called only when the CPU has AVX-512F (see attention.cpp).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/quant_blocks.h"

namespace kvzap::avx512 {

namespace {

// Lane j of the result = horizontal sum of a[j], for 16 vectors (a transpose-and-add tree: ~45 ops
// instead of 16 separate reductions).
inline __m512 reduce16(const __m512* a) {
  __m512 b[8], c[4];
  for (int i = 0; i < 8; i++)
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; i++) {
    const __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
    c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 e01 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x44), _mm512_shuffle_f32x4(c[0], c[1], 0xEE));
  const __m512 e23 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x44), _mm512_shuffle_f32x4(c[2], c[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(e01, e23, 0x88), _mm512_shuffle_f32x4(e01, e23, 0xDD));
}

// 16 consecutive elements of a page row as f32.
inline __m512 load16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

inline __m512 block_scale(uint16_t d) { return _mm512_set1_ps(_cvtsh_ss(d)); }

// The first n_rows rows of a page as f32 dst [n_rows][16 * nc] (dst 64-byte aligned).
template <class T>
inline void rows_to_f32(const T* src, float* dst, int n_rows, int nc) {
  for (int i = 0; i < n_rows * nc; i++) _mm512_store_ps(dst + 16 * i, load16(src + 16 * i));
}
// q8_0 rows: nc / 2 blocks of 32 per row, the rows' blocks consecutive; y = q * d.
inline void rows_to_f32(const kernels::BlockQ8_0* src, float* dst, int n_rows, int nc) {
  for (int b = 0; b < n_rows * nc / 2; b++, dst += 32) {
    const __m512 d = block_scale(src[b].d);
    const __m128i lo = _mm_loadu_si128((const __m128i*)src[b].qs), hi = _mm_loadu_si128((const __m128i*)(src[b].qs + 16));
    _mm512_store_ps(dst, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), d));
    _mm512_store_ps(dst + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), d));
  }
}
// q4_0 rows: element j of a block is (qs[j] & 15) - 8, element j + 16 is (qs[j] >> 4) - 8; y = q * d.
inline void rows_to_f32(const kernels::BlockQ4_0* src, float* dst, int n_rows, int nc) {
  const __m512i mask = _mm512_set1_epi32(15), eight = _mm512_set1_epi32(8);
  for (int b = 0; b < n_rows * nc / 2; b++, dst += 32) {
    const __m512 d = block_scale(src[b].d);
    const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)src[b].qs));
    const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(w, mask), eight);
    const __m512i hi = _mm512_sub_epi32(_mm512_srli_epi32(w, 4), eight);
    _mm512_store_ps(dst, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d));
    _mm512_store_ps(dst + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d));
  }
}

// scores[r][j0 + j] = q_r . k_j for the visible keys of one page (head_dim = 16 * nc, nc <= 16).
// Every score goes through the same 16-lane reduction whatever the page's fill and the other rows of
// the block, so a row's result does not depend on which rows share its block (batched = alone).
// Heads wider than 128 (Gemma 3: 256) run the chunks in groups of 8 so the query chunks and the 16
// accumulators stay in registers; each accumulator still sums its chunks in order 0 .. nc-1.
// NC > 0 fixes nc at compile time (64-, 128- and 256-wide heads: loops unrolled, queries in registers;
// with a run-time count the compiler copied the query chunks through the stack and branched per chunk
// inside the FMA loop); NC = 0 takes nc from d. Both sum in the same order.
template <int NC, class T>
void scores_page(const float* q, int64_t q_stride, int rows, const int64_t* visible, const T* keys, int64_t j0,
                 int64_t nj, int d, float* scores, int64_t s_stride) {
  const int nc = NC > 0 ? NC : d / 16;
  // Convert the page's keys once (unfilled slots are zeros, never read from the page).
  alignas(64) float kf[16 * 256];
  rows_to_f32(keys, kf, (int)nj, nc);
  for (int i = (int)nj * nc; i < 16 * nc; i++) _mm512_store_ps(kf + 16 * i, _mm512_setzero_ps());
  constexpr int kGroup = NC > 0 && NC < 8 ? NC : 8;  // query chunks held in registers at a time
  for (int r = 0; r < rows; r++) {
    const int64_t jmax = std::min<int64_t>(nj, visible[r] - j0);
    if (jmax <= 0) continue;
    const float* qr = q + r * q_stride;
    __m512 acc[16];  // fma(q, k, 0) rounds q * k once, as a multiply would
    for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
    for (int c0 = 0; c0 < nc; c0 += kGroup) {
      if (NC > 0 || nc - c0 >= kGroup) {  // a whole group: a compile-time count
        __m512 qv[kGroup];
        for (int c = 0; c < kGroup; c++) qv[c] = _mm512_loadu_ps(qr + 16 * (c0 + c));
        for (int j = 0; j < 16; j++) {
          const float* kj = kf + j * nc * 16 + 16 * c0;
          for (int c = 0; c < kGroup; c++) acc[j] = _mm512_fmadd_ps(qv[c], _mm512_load_ps(kj + 16 * c), acc[j]);
        }
        continue;
      }
      const int cn = nc - c0;
      __m512 qv[8];
      for (int c = 0; c < cn; c++) qv[c] = _mm512_loadu_ps(qr + 16 * (c0 + c));
      for (int j = 0; j < 16; j++) {
        const float* kj = kf + j * nc * 16 + 16 * c0;
        for (int c = 0; c < cn; c++) acc[j] = _mm512_fmadd_ps(qv[c], _mm512_load_ps(kj + 16 * c), acc[j]);
      }
    }
    _mm512_mask_storeu_ps(scores + r * s_stride + j0, (__mmask16)((1u << jmax) - 1), reduce16(acc));
  }
}

// out[r] += sum_j probs[r][j0 + j] * v_j over the visible values of one page (NC as for scores_page).
template <int NC, class T>
void accumulate_page(const float* probs, int64_t s_stride, int rows, const int64_t* visible, const T* values,
                     int64_t j0, int64_t nj, int d, float* out, int64_t out_stride) {
  const int nc = NC > 0 ? NC : d / 16;
  // Convert f16 / quantised values once for all rows (a KV head's query heads share them); f32 ones are
  // read in place.
  alignas(64) float vf[std::is_same_v<T, float> ? 1 : 16 * 256];
  if constexpr (!std::is_same_v<T, float>) {
    int64_t jmax_all = 0;
    for (int r = 0; r < rows; r++) jmax_all = std::max<int64_t>(jmax_all, std::min<int64_t>(nj, visible[r] - j0));
    rows_to_f32(values, vf, (int)jmax_all, nc);
  }
  for (int r = 0; r < rows; r++) {
    const int64_t jmax = std::min<int64_t>(nj, visible[r] - j0);
    if (jmax <= 0) continue;
    float* o = out + r * out_stride;
    const float* pr = probs + r * s_stride + j0;
    __m512 acc[16];
    for (int c = 0; c < nc; c++) acc[c] = _mm512_loadu_ps(o + 16 * c);
    for (int64_t j = 0; j < jmax; j++) {
      const __m512 p = _mm512_set1_ps(pr[j]);
      if constexpr (std::is_same_v<T, float>) {
        const float* vj = values + j * nc * 16;
        for (int c = 0; c < nc; c++) acc[c] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vj + 16 * c), acc[c]);
      } else {
        const float* vj = vf + j * nc * 16;
        for (int c = 0; c < nc; c++) acc[c] = _mm512_fmadd_ps(p, _mm512_load_ps(vj + 16 * c), acc[c]);
      }
    }
    for (int c = 0; c < nc; c++) _mm512_storeu_ps(o + 16 * c, acc[c]);
  }
}

// Runs F<NC> with NC fixed for the common head sizes.
#define KVZAP_BY_HEAD_DIM(F, ...)                           \
  switch (d) {                                              \
    case 64: F<4>(__VA_ARGS__); break;                      \
    case 128: F<8>(__VA_ARGS__); break;                     \
    case 256: F<16>(__VA_ARGS__); break;                    \
    default: F<0>(__VA_ARGS__); break;                      \
  }

}  // namespace

void attention_scores_page(const float* q, int64_t q_stride, int rows, const int64_t* visible, const uint16_t* keys,
                           int64_t j0, int64_t nj, int d, float* scores, int64_t s_stride) {
  KVZAP_BY_HEAD_DIM(scores_page, q, q_stride, rows, visible, keys, j0, nj, d, scores, s_stride)
}
void attention_scores_page(const float* q, int64_t q_stride, int rows, const int64_t* visible, const float* keys,
                           int64_t j0, int64_t nj, int d, float* scores, int64_t s_stride) {
  KVZAP_BY_HEAD_DIM(scores_page, q, q_stride, rows, visible, keys, j0, nj, d, scores, s_stride)
}
void attention_accumulate_page(const float* probs, int64_t s_stride, int rows, const int64_t* visible,
                               const uint16_t* values, int64_t j0, int64_t nj, int d, float* out, int64_t out_stride) {
  KVZAP_BY_HEAD_DIM(accumulate_page, probs, s_stride, rows, visible, values, j0, nj, d, out, out_stride)
}
void attention_accumulate_page(const float* probs, int64_t s_stride, int rows, const int64_t* visible,
                               const float* values, int64_t j0, int64_t nj, int d, float* out, int64_t out_stride) {
  KVZAP_BY_HEAD_DIM(accumulate_page, probs, s_stride, rows, visible, values, j0, nj, d, out, out_stride)
}
void attention_scores_page(const float* q, int64_t q_stride, int rows, const int64_t* visible, const kernels::BlockQ8_0* keys,
                           int64_t j0, int64_t nj, int d, float* scores, int64_t s_stride) {
  KVZAP_BY_HEAD_DIM(scores_page, q, q_stride, rows, visible, keys, j0, nj, d, scores, s_stride)
}
void attention_accumulate_page(const float* probs, int64_t s_stride, int rows, const int64_t* visible,
                               const kernels::BlockQ8_0* values, int64_t j0, int64_t nj, int d, float* out, int64_t out_stride) {
  KVZAP_BY_HEAD_DIM(accumulate_page, probs, s_stride, rows, visible, values, j0, nj, d, out, out_stride)
}
void attention_scores_page(const float* q, int64_t q_stride, int rows, const int64_t* visible, const kernels::BlockQ4_0* keys,
                           int64_t j0, int64_t nj, int d, float* scores, int64_t s_stride) {
  KVZAP_BY_HEAD_DIM(scores_page, q, q_stride, rows, visible, keys, j0, nj, d, scores, s_stride)
}
void attention_accumulate_page(const float* probs, int64_t s_stride, int rows, const int64_t* visible,
                               const kernels::BlockQ4_0* values, int64_t j0, int64_t nj, int d, float* out, int64_t out_stride) {
  KVZAP_BY_HEAD_DIM(accumulate_page, probs, s_stride, rows, visible, values, j0, nj, d, out, out_stride)
}

}  // namespace kvzap::avx512
