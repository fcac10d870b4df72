#include "model/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/fp16.h"
#include "kernels/fast_exp.h"
#include "kernels/isa_dispatch.h"
#include "kernels/matmul.h"
#include "kernels/quant_blocks.h"

namespace kvzap {

namespace {

// The portable hot loops are plain C++ written so the compiler vectorises them (lane-split accumulators,
// no cross-lane reduction in the inner loop), built for AVX-512, AVX2 and baseline by KVZAP_ISA_DISPATCH
// and chosen per call by active_isa() (kernels/isa_dispatch.h).

KVZAP_INLINE_BODY void page_to_f32_body(const uint16_t* src, float* dst, int64_t n) {
  const _Float16* h = reinterpret_cast<const _Float16*>(src);  // same bits; F16C converts in bulk
  for (int64_t i = 0; i < n; i++) dst[i] = (float)h[i];
}
KVZAP_ISA_DISPATCH(void, page_to_f32, (const uint16_t* src, float* dst, int64_t n), (src, dst, n))

// Keys of one page, transposed to [D][P] so a row's scores against the whole page are P lanes.
KVZAP_INLINE_BODY void page_keys_transposed_body(const uint16_t* src, float* dst, int64_t nj, int d) {
  const _Float16* h = reinterpret_cast<const _Float16*>(src);
  constexpr int P = KvCache::kPageTokens;
  for (int64_t j = 0; j < P; j++)
    for (int i = 0; i < d; i++) dst[i * P + j] = j < nj ? (float)h[j * d + i] : 0.0f;
}
KVZAP_ISA_DISPATCH(void, page_keys_transposed, (const uint16_t* src, float* dst, int64_t nj, int d), (src, dst, nj, d))

// The same for an f32 page (KvType::F32).
KVZAP_INLINE_BODY void page_keys_transposed_f32_body(const float* src, float* dst, int64_t nj, int d) {
  constexpr int P = KvCache::kPageTokens;
  for (int64_t j = 0; j < P; j++)
    for (int i = 0; i < d; i++) dst[i * P + j] = j < nj ? src[j * d + i] : 0.0f;
}
KVZAP_ISA_DISPATCH(void, page_keys_transposed_f32, (const float* src, float* dst, int64_t nj, int d), (src, dst, nj, d))

// Quantised pages (KvType::Q8_0 / Q4_0): rows of d / 32 ggml blocks, element y = q * scale in f32 (the
// rounding of kv_dequantize_row). Keys are dequantised straight into the transposed [D][P] layout,
// values into [nj][D]; rows past nj are never read.
template <class B>
KVZAP_INLINE_BODY void dequant_block_body(const B& blk, float* y, int stride) {
  const float s = kernels::h2f(blk.d);
  if constexpr (std::is_same_v<B, kernels::BlockQ8_0>) {
    for (int i = 0; i < kernels::kQK; i++) y[i * stride] = (float)blk.qs[i] * s;
  } else {
    for (int i = 0; i < kernels::kQK / 2; i++) {
      y[i * stride] = (float)((blk.qs[i] & 15) - 8) * s;
      y[(i + 16) * stride] = (float)((blk.qs[i] >> 4) - 8) * s;
    }
  }
}
template <class B>
KVZAP_INLINE_BODY void page_keys_transposed_q_body(const B* src, float* dst, int64_t nj, int d) {
  constexpr int P = KvCache::kPageTokens;
  const int nb = d / kernels::kQK;
  for (int64_t j = 0; j < P; j++) {
    if (j >= nj) {
      for (int i = 0; i < d; i++) dst[i * P + j] = 0.0f;
      continue;
    }
    for (int b = 0; b < nb; b++) dequant_block_body(src[j * nb + b], dst + (int64_t)b * kernels::kQK * P + j, P);
  }
}
template <class B>
KVZAP_INLINE_BODY void page_to_f32_q_body(const B* src, float* dst, int64_t nj, int d) {
  const int64_t nb = nj * (d / kernels::kQK);
  for (int64_t b = 0; b < nb; b++) dequant_block_body(src[b], dst + b * kernels::kQK, 1);
}
#define page_keys_transposed_q8_0_body page_keys_transposed_q_body<kernels::BlockQ8_0>
#define page_keys_transposed_q4_0_body page_keys_transposed_q_body<kernels::BlockQ4_0>
#define page_to_f32_q8_0_body page_to_f32_q_body<kernels::BlockQ8_0>
#define page_to_f32_q4_0_body page_to_f32_q_body<kernels::BlockQ4_0>
KVZAP_ISA_DISPATCH(void, page_keys_transposed_q8_0, (const kernels::BlockQ8_0* src, float* dst, int64_t nj, int d), (src, dst, nj, d))
KVZAP_ISA_DISPATCH(void, page_keys_transposed_q4_0, (const kernels::BlockQ4_0* src, float* dst, int64_t nj, int d), (src, dst, nj, d))
KVZAP_ISA_DISPATCH(void, page_to_f32_q8_0, (const kernels::BlockQ8_0* src, float* dst, int64_t nj, int d), (src, dst, nj, d))
KVZAP_ISA_DISPATCH(void, page_to_f32_q4_0, (const kernels::BlockQ4_0* src, float* dst, int64_t nj, int d), (src, dst, nj, d))
#undef page_keys_transposed_q8_0_body
#undef page_keys_transposed_q4_0_body
#undef page_to_f32_q8_0_body
#undef page_to_f32_q4_0_body

KVZAP_INLINE_BODY void scores_page_body(const float* q, int64_t q_stride, int rows, const int64_t* visible, const float* kt,
                 int64_t j0, int64_t nj, int d, float* scores, int64_t s_stride) {
  constexpr int P = KvCache::kPageTokens;
  for (int r = 0; r < rows; r++) {
    const float* qr = q + r * q_stride;
    float acc[P] = {0};
    for (int i = 0; i < d; i++) {
      const float qi = qr[i];
      for (int j = 0; j < P; j++) acc[j] += qi * kt[i * P + j];
    }
    const int64_t jmax = std::min<int64_t>(nj, visible[r] - j0);
    float* sr = scores + r * s_stride + j0;
    for (int64_t j = 0; j < jmax; j++) sr[j] = acc[j];
  }
}
KVZAP_ISA_DISPATCH(void, scores_page, (const float* q, int64_t q_stride, int rows, const int64_t* visible, const float* kt, int64_t j0, int64_t nj, int d, float* scores, int64_t s_stride), (q, q_stride, rows, visible, kt, j0, nj, d, scores, s_stride))

KVZAP_INLINE_BODY void accumulate_page_body(const float* probs, int64_t s_stride, int rows, const int64_t* visible, const float* vf,
                     int64_t j0, int64_t nj, int d, float* out, int64_t out_stride) {
  for (int r = 0; r < rows; r++) {
    const float* pr = probs + r * s_stride + j0;
    float* o = out + r * out_stride;
    const int64_t jmax = std::min<int64_t>(nj, visible[r] - j0);
    if (d == 64) {  // the common head size: keep the output row in registers
      float acc[64];
      for (int i = 0; i < 64; i++) acc[i] = o[i];
      for (int64_t j = 0; j < jmax; j++) {
        const float p = pr[j];
        const float* vj = vf + j * 64;
        for (int i = 0; i < 64; i++) acc[i] += p * vj[i];
      }
      for (int i = 0; i < 64; i++) o[i] = acc[i];
      continue;
    }
    for (int64_t j = 0; j < jmax; j++) {
      const float p = pr[j];
      const float* vj = vf + j * d;
      for (int i = 0; i < d; i++) o[i] += p * vj[i];
    }
  }
}
KVZAP_ISA_DISPATCH(void, accumulate_page, (const float* probs, int64_t s_stride, int rows, const int64_t* visible, const float* vf, int64_t j0, int64_t nj, int d, float* out, int64_t out_stride), (probs, s_stride, rows, visible, vf, j0, nj, d, out, out_stride))


}  // namespace

KVZAP_INLINE_BODY void round_rows_f16_body(const float* src, float* dst, int64_t n, float scale) {
  for (int64_t i = 0; i < n; i++) dst[i] = (float)(_Float16)src[i] * scale;
}
KVZAP_ISA_DISPATCH(void, round_rows_f16, (const float* src, float* dst, int64_t n, float scale), (src, dst, n, scale))

namespace {

KVZAP_INLINE_BODY void round_to_f16_body(float* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = (float)(_Float16)x[i];
}
KVZAP_ISA_DISPATCH(void, round_to_f16, (float* x, int64_t n), (x, n))

KVZAP_INLINE_BODY void softmax_row_body(float* x, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; i++) mx = std::max(mx, x[i]);
  float lanes[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++) {
      x[i + l] = fast_exp(x[i + l] - mx);
      lanes[l] += x[i + l];
    }
  for (; i < n; i++) {
    x[i] = fast_exp(x[i] - mx);
    lanes[0] += x[i];
  }
  float sum = 0;
  for (int l = 0; l < 16; l++) sum += lanes[l];
  const float inv = 1.0f / sum;
  for (int64_t k = 0; k < n; k++) x[k] *= inv;
}
KVZAP_ISA_DISPATCH(void, softmax_row, (float* x, int64_t n), (x, n))

// The matmul kernels' dispatch decides (one mechanism: KVZAP_ISA / set_active_isa), so the portable
// path below is what runs, and is tested, under KVZAP_ISA=avx2 or scalar on an AVX-512 host.
bool use_avx512() { return active_isa() >= Isa::Avx512; }

// Pages come from a pool in no particular address order, and the hardware prefetchers stop at 4 KiB
// boundaries, so at long context the score and value passes stalled on the first loads of every page
// (perf: two thirds of the score kernel's time). Asking for a page's keys (values) a few pages ahead,
// into L2, hides that latency: SmolLM2 decode at depth 4096 went from ~45 to ~60 tok/s (2 threads);
// into L1 (prefetcht0) it gained half as much, since L1's miss buffers fill.
constexpr int kPrefetchPages = 4;
inline void prefetch_to_l2(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  for (size_t i = 0; i < n; i += 64) __builtin_prefetch(c + i, 0, 2);
}

}  // namespace

namespace avx512 {
void attention_scores_page(const float* q, int64_t q_stride, int rows, const int64_t* visible, const uint16_t* keys,
                           int64_t j0, int64_t nj, int d, float* scores, int64_t s_stride);
void attention_accumulate_page(const float* probs, int64_t s_stride, int rows, const int64_t* visible,
                               const uint16_t* values, int64_t j0, int64_t nj, int d, float* out, int64_t out_stride);
// The same over f32 pages.
void attention_scores_page(const float* q, int64_t q_stride, int rows, const int64_t* visible, const float* keys,
                           int64_t j0, int64_t nj, int d, float* scores, int64_t s_stride);
void attention_accumulate_page(const float* probs, int64_t s_stride, int rows, const int64_t* visible,
                               const float* values, int64_t j0, int64_t nj, int d, float* out, int64_t out_stride);
// The same over q8_0 / q4_0 pages (rows of d / 32 blocks).
void attention_scores_page(const float* q, int64_t q_stride, int rows, const int64_t* visible,
                           const kernels::BlockQ8_0* keys, int64_t j0, int64_t nj, int d, float* scores, int64_t s_stride);
void attention_accumulate_page(const float* probs, int64_t s_stride, int rows, const int64_t* visible,
                               const kernels::BlockQ8_0* values, int64_t j0, int64_t nj, int d, float* out,
                               int64_t out_stride);
void attention_scores_page(const float* q, int64_t q_stride, int rows, const int64_t* visible,
                           const kernels::BlockQ4_0* keys, int64_t j0, int64_t nj, int d, float* scores, int64_t s_stride);
void attention_accumulate_page(const float* probs, int64_t s_stride, int rows, const int64_t* visible,
                               const kernels::BlockQ4_0* values, int64_t j0, int64_t nj, int d, float* out,
                               int64_t out_stride);
}  // namespace avx512

AttentionExtent attention_extent(const AttentionBlock& b) {
  const int P = KvCache::kPageTokens;
  int64_t max_vis = 0;
  for (int r = 0; r < b.rows; r++) max_vis = std::max(max_vis, b.visible[r]);
  // Sliding window: pages wholly before every row's first entry are skipped.
  int64_t min_first = b.first ? max_vis : 0;
  if (b.first)
    for (int r = 0; r < b.rows; r++) min_first = std::min(min_first, b.first[r]);
  AttentionExtent e;
  e.s_stride = max_vis;
  e.n_pages = (int)((max_vis + P - 1) / P);
  e.p0 = std::min((int)(min_first / P), e.n_pages);
  e.c0 = e.p0 / kAttentionChunkPages;
  e.c1 = (e.n_pages + kAttentionChunkPages - 1) / kAttentionChunkPages;
  return e;
}

void attend_scores(const AttentionBlock& b, const KvCache& cache, int layer, int head, const AttentionExtent& e,
                   int page_begin, int page_end, float* scores, float* page_f32) {
  const int d = cache.head_dim();
  const int P = KvCache::kPageTokens;
  const bool fast = use_avx512() && d % 16 == 0 && d <= 256;
  const KvType type = cache.kv_type();
  const size_t half_bytes = (size_t)P * cache.row_bytes();  // the keys of one page
  for (int p = page_begin; p < std::min(page_end, page_begin + kPrefetchPages); p++)
    prefetch_to_l2(cache.page_keys_raw(layer, head, p), half_bytes);
  for (int p = page_begin; p < page_end; p++) {
    if (p + kPrefetchPages < page_end) prefetch_to_l2(cache.page_keys_raw(layer, head, p + kPrefetchPages), half_bytes);
    const int64_t j0 = (int64_t)p * P;
    const int64_t nj = std::min<int64_t>(P, e.s_stride - j0);
    const void* keys = cache.page_keys_raw(layer, head, p);
    if (fast) {
      switch (type) {
        case KvType::F32: avx512::attention_scores_page(b.q, b.q_stride, b.rows, b.visible, (const float*)keys, j0, nj, d, scores, e.s_stride); break;
        case KvType::Q8_0: avx512::attention_scores_page(b.q, b.q_stride, b.rows, b.visible, (const kernels::BlockQ8_0*)keys, j0, nj, d, scores, e.s_stride); break;
        case KvType::Q4_0: avx512::attention_scores_page(b.q, b.q_stride, b.rows, b.visible, (const kernels::BlockQ4_0*)keys, j0, nj, d, scores, e.s_stride); break;
        default: avx512::attention_scores_page(b.q, b.q_stride, b.rows, b.visible, (const uint16_t*)keys, j0, nj, d, scores, e.s_stride); break;
      }
      continue;
    }
    switch (type) {
      case KvType::F32: page_keys_transposed_f32((const float*)keys, page_f32, nj, d); break;
      case KvType::Q8_0: page_keys_transposed_q8_0((const kernels::BlockQ8_0*)keys, page_f32, nj, d); break;
      case KvType::Q4_0: page_keys_transposed_q4_0((const kernels::BlockQ4_0*)keys, page_f32, nj, d); break;
      default: page_keys_transposed((const uint16_t*)keys, page_f32, nj, d); break;
    }
    scores_page(b.q, b.q_stride, b.rows, b.visible, page_f32, j0, nj, d, scores, e.s_stride);
  }
}

void attend_softmax(const AttentionBlock& b, const AttentionExtent& e, int r, float* scores) {
  const int P = KvCache::kPageTokens;
  float* row = scores + r * e.s_stride;
  const int64_t f = b.first ? b.first[r] : 0;  // entries [p0 * P, f) of the row weigh 0
  softmax_row(row + f, b.visible[r] - f);
  if (b.f16_probs) round_to_f16(row + f, b.visible[r] - f);
  if (f > (int64_t)e.p0 * P) std::fill(row + (int64_t)e.p0 * P, row + f, 0.0f);
}

void attend_values(const AttentionBlock& b, const KvCache& cache, int layer, int head, const AttentionExtent& e,
                   int chunk_begin, int chunk_end, const float* probs, float* partials, float* page_f32) {
  const int d = cache.head_dim();
  const int P = KvCache::kPageTokens;
  const bool fast = use_avx512() && d % 16 == 0 && d <= 256;
  const KvType type = cache.kv_type();
  const size_t half_bytes = (size_t)P * cache.row_bytes();  // the values of one page
  const int page_begin = std::max(e.p0, chunk_begin * kAttentionChunkPages);
  const int page_end = std::min(e.n_pages, chunk_end * kAttentionChunkPages);
  for (int p = page_begin; p < std::min(page_end, page_begin + kPrefetchPages); p++)
    prefetch_to_l2(cache.page_values_raw(layer, head, p), half_bytes);
  for (int c = chunk_begin; c < chunk_end; c++) {
    float* out = partials + (int64_t)(c - chunk_begin) * b.rows * d;  // [rows][d], this chunk's sums
    std::fill(out, out + (int64_t)b.rows * d, 0.0f);
    const int pc0 = std::max(page_begin, c * kAttentionChunkPages);
    const int pc1 = std::min(page_end, (c + 1) * kAttentionChunkPages);
    for (int p = pc0; p < pc1; p++) {
      if (p + kPrefetchPages < page_end)
        prefetch_to_l2(cache.page_values_raw(layer, head, p + kPrefetchPages), half_bytes);
      const int64_t j0 = (int64_t)p * P;
      const int64_t nj = std::min<int64_t>(P, e.s_stride - j0);
      const void* values = cache.page_values_raw(layer, head, p);
      if (fast) {
        switch (type) {
          case KvType::F32: avx512::attention_accumulate_page(probs, e.s_stride, b.rows, b.visible, (const float*)values, j0, nj, d, out, d); break;
          case KvType::Q8_0: avx512::attention_accumulate_page(probs, e.s_stride, b.rows, b.visible, (const kernels::BlockQ8_0*)values, j0, nj, d, out, d); break;
          case KvType::Q4_0: avx512::attention_accumulate_page(probs, e.s_stride, b.rows, b.visible, (const kernels::BlockQ4_0*)values, j0, nj, d, out, d); break;
          default: avx512::attention_accumulate_page(probs, e.s_stride, b.rows, b.visible, (const uint16_t*)values, j0, nj, d, out, d); break;
        }
        continue;
      }
      // f32 pages are read in place; f16 and quantised ones are converted once per page for all rows.
      const float* vf = page_f32;
      switch (type) {
        case KvType::F32: vf = (const float*)values; break;
        case KvType::Q8_0: page_to_f32_q8_0((const kernels::BlockQ8_0*)values, page_f32, nj, d); break;
        case KvType::Q4_0: page_to_f32_q4_0((const kernels::BlockQ4_0*)values, page_f32, nj, d); break;
        default: page_to_f32((const uint16_t*)values, page_f32, nj * d); break;
      }
      accumulate_page(probs, e.s_stride, b.rows, b.visible, vf, j0, nj, d, out, d);
    }
  }
}

namespace {
// out[r] (+)= partial[r]: the first chunk is copied (0 + x = x), later ones added, in chunk order.
void add_chunk(const AttentionBlock& b, int d, const float* partial, bool first) {
  for (int r = 0; r < b.rows; r++) {
    float* o = b.out + r * b.out_stride;
    const float* x = partial + (int64_t)r * d;
    if (first) std::copy(x, x + d, o);
    else for (int i = 0; i < d; i++) o[i] += x[i];
  }
}
}  // namespace

void attend_merge(const AttentionBlock& b, const AttentionExtent& e, int d, const float* partials) {
  if (e.c0 == e.c1)
    for (int r = 0; r < b.rows; r++) std::fill(b.out + r * b.out_stride, b.out + r * b.out_stride + d, 0.0f);
  for (int c = e.c0; c < e.c1; c++) add_chunk(b, d, partials + (int64_t)(c - e.c0) * b.rows * d, c == e.c0);
}

void attend(const AttentionBlock& b, const KvCache& cache, int layer, int head, float* scores, float* page_f32,
            float* partial) {
  const int d = cache.head_dim();
  const AttentionExtent e = attention_extent(b);
  attend_scores(b, cache, layer, head, e, e.p0, e.n_pages, scores, page_f32);
  for (int r = 0; r < b.rows; r++) attend_softmax(b, e, r, scores);
  if (e.c0 == e.c1)  // no entries: a zero output, as attend_merge gives (the first chunk is copied, not added)
    for (int r = 0; r < b.rows; r++) std::fill(b.out + r * b.out_stride, b.out + r * b.out_stride + d, 0.0f);
  for (int c = e.c0; c < e.c1; c++) {
    attend_values(b, cache, layer, head, e, c, c + 1, scores, partial, page_f32);
    add_chunk(b, d, partial, c == e.c0);
  }
}

void attend_reference(const AttentionBlock& b, const KvCache& cache, int layer, int head) {
  const int d = cache.head_dim();
  std::vector<float> k((size_t)d), v((size_t)d);  // one entry in f32 (exact for f16/f32; q8_0/q4_0 dequantised)
  for (int r = 0; r < b.rows; r++) {
    const int64_t n = b.visible[r], f = b.first ? b.first[r] : 0;
    std::vector<double> s((size_t)n, 0.0);
    double mx = -INFINITY;
    for (int64_t j = f; j < n; j++) {
      cache.key_row(layer, head, j, k.data());
      double acc = 0;
      for (int i = 0; i < d; i++) acc += (double)b.q[r * b.q_stride + i] * k[(size_t)i];
      s[j] = acc;
      mx = std::max(mx, acc);
    }
    double sum = 0;
    for (int64_t j = f; j < n; j++) sum += (s[j] = std::exp(s[j] - mx));
    for (int64_t j = f; j < n; j++) s[j] = b.f16_probs ? fp16_to_fp32(fp32_to_fp16((float)(s[j] / sum))) : s[j] / sum;
    std::vector<double> o((size_t)d, 0.0);
    for (int64_t j = f; j < n; j++) {
      cache.value_row(layer, head, j, v.data());
      for (int i = 0; i < d; i++) o[(size_t)i] += s[j] * v[(size_t)i];
    }
    for (int i = 0; i < d; i++) b.out[r * b.out_stride + i] = (float)o[(size_t)i];
  }
}

}  // namespace kvzap
