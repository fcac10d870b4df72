// AVX-512 (BW + VNNI) kernels for the K formats Q4_K, Q5_K, Q6_K against ggml's Q8_K activations.
//
// Scheme (one zmm = 64 consecutive elements of a 256-element super-block, in natural order):
//  * Activations are quantized exactly as ggml's Q8_K (bit-exact with quantize_q8_K_ref) and stored per
//    super-block as [256 int8 quants][16 int16 bsums][float d][pad] = 320 bytes, 64-byte aligned.
//  * Weights unpack to unsigned bytes in natural element order (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63), so
//    zmm g pairs with activation bytes 64g..64g+63. vpmaddubsw(u8 w, s8 a) gives int16 pair sums (at most
//    2 * 63 * 127, no saturation), vpdpwssd multiplies them by the int16 sub-block scale of their lanes and
//    accumulates int32: the super-block's scaled integer dot is exact.
//  * Mins (Q4_K / Q5_K: dmin * m_j; Q6_K: the -32 offset times its signed scale) are integer dots of the
//    per-16 bsums with a per-16 multiplier vector (vpmaddwd). Q6_K folds -32 * that into the integer sum
//    (one scale d); Q4_K / Q5_K add it in float with -dmin * d_a.
//  * Per (row, token) a float accumulator takes isum * (d_w * d_a) (and mins) once per super-block; the
//    16 lanes are summed by reduce4 at the end.
//  * Prefill: rows are unpacked two at a time into the thread's workspace (weights, per-group int16 scale
//    vectors, multipliers, d, dmin) and reused for every token of the work item, in 2-row x 4-token tiles.
//    Decode (one token): rows are read straight from the GGUF data, 4 at a time, with prefetching.
//  * Every output element goes through the same arithmetic on either path and wherever it sits in a tile,
//    so results are bit-identical across thread counts and batch sizes (decode == prefill).
// Internal linkage throughout, no standard-library templates (see matmul_avx512.cpp).
// GCC 12 reports its own intrinsic headers (undefined vectors) as uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include "kernels/avx512_reduce.h"
#include "kernels/kernel_table.h"
#include "kernels/quant_blocks.h"

namespace kvzap::kernels {
namespace {

constexpr size_t kZ = 64;
constexpr size_t kActSb = 5 * kZ;  // [qs 256][bsums 32][d 4][pad 28]
constexpr size_t kActBsums = 256, kActD = 288;
constexpr int kTileRows = 2, kTileToks = 4, kGemvRows = 4;
constexpr int kPrefetchGroups = 4;  // decode: prefetch the same bytes 4 row groups ahead (as matmul_avx512.cpp)

// Packed super-block of one row: [q g=0..3][scale g=0..3][m16 (32 B) | d | dmin | pad] = 9 zmm.
constexpr size_t kPackSb = 9 * kZ;
constexpr size_t kPackScale = 4 * kZ, kPackHdr = 8 * kZ;

template <GgmlType T> struct KFmt;
template <> struct KFmt<GgmlType::Q4_K> { static constexpr size_t kBytes = sizeof(BlockQ4_K); static constexpr bool kMin = true; };
template <> struct KFmt<GgmlType::Q5_K> { static constexpr size_t kBytes = sizeof(BlockQ5_K); static constexpr bool kMin = true; };
template <> struct KFmt<GgmlType::Q6_K> { static constexpr size_t kBytes = sizeof(BlockQ6_K); static constexpr bool kMin = false; };

inline uint16_t load_u16(const uint8_t* p) { uint16_t v; __builtin_memcpy(&v, p, 2); return v; }
inline uint32_t load_u32(const uint8_t* p) { uint32_t v; __builtin_memcpy(&v, p, 4); return v; }
inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

// ---------------------------------------------------------------- activations

size_t act_bytes(int64_t n) { return (size_t)(n / kQKK) * kActSb; }

// Bit-exact with quantize_q8_K_ref (ggml's Q8_K): max = the first element of largest magnitude (its
// sign matters), iscale = -127 / max, q = min(127, round-half-even(iscale * x)), d = 1 / iscale.
void prepare_act(const float* x, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const float* xb = x + b * kQKK;
    uint8_t* out = dst + (size_t)b * kActSb;
    __m512 v[16];
    __m512 vmax = _mm512_setzero_ps();
    for (int i = 0; i < 16; ++i) {
      v[i] = _mm512_loadu_ps(xb + 16 * i);
      vmax = _mm512_max_ps(vmax, _mm512_abs_ps(v[i]));
    }
    const float amax = _mm512_reduce_max_ps(vmax);
    __builtin_memset(out + kActD, 0, kActSb - kActD);
    if (amax == 0.0f) {
      __builtin_memset(out, 0, kActD);
      continue;
    }
    float max = 0;
    for (int i = 0; i < 16; ++i) {
      const __mmask16 hit = _mm512_cmpeq_ps_mask(_mm512_abs_ps(v[i]), _mm512_set1_ps(amax));
      if (hit) {
        max = xb[16 * i + __builtin_ctz((unsigned)hit)];
        break;
      }
    }
    const float iscale = -127.f / max;
    const __m512 vs = _mm512_set1_ps(iscale);
    alignas(32) int16_t bsums[16];
    for (int i = 0; i < 16; ++i) {
      const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(vs, v[i]), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512i q = _mm512_min_epi32(_mm512_cvtps_epi32(r), _mm512_set1_epi32(127));
      _mm_storeu_si128((__m128i*)(out + 16 * i), _mm512_cvtepi32_epi8(q));
      bsums[i] = (int16_t)_mm512_reduce_add_epi32(q);
    }
    __builtin_memcpy(out + kActBsums, bsums, 32);
    const float d = 1 / iscale;
    __builtin_memcpy(out + kActD, &d, 4);
  }
}

// ---------------------------------------------------------------- one super-block of weights

// Scale table of a super-block as int16 lanes: Q4_K / Q5_K [sc_0..sc_7, m_0..m_7]; Q6_K [sc_0..sc_15].
template <GgmlType T>
inline __m256i scale_table(const uint8_t* blk) {
  if constexpr (T == GgmlType::Q6_K) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ6_K, scales))));
  } else {
    // 6-bit scales and mins of the 8 sub-blocks (k_scale_min), four at a time in 32-bit words.
    const uint8_t* s = blk + 4;
    const uint32_t u0 = load_u32(s), u1 = load_u32(s + 4), u2 = load_u32(s + 8);
    const uint32_t sc_lo = u0 & 0x3f3f3f3fu, m_lo = u1 & 0x3f3f3f3fu;
    const uint32_t sc_hi = (u2 & 0x0f0f0f0fu) | (((u0 >> 6) & 0x03030303u) << 4);
    const uint32_t m_hi = ((u2 >> 4) & 0x0f0f0f0fu) | (((u1 >> 6) & 0x03030303u) << 4);
    const __m128i b = _mm_set_epi32((int)m_hi, (int)m_lo, (int)sc_hi, (int)sc_lo);
    return _mm256_cvtepu8_epi16(b);
  }
}

// int16 scale of each int16 product lane of group g (elements 64g + 2k, 64g + 2k + 1).
template <GgmlType T>
inline __m512i group_scale(__m256i table, int g) {
  __m512i idx;
  if constexpr (T == GgmlType::Q6_K) {
    const short a = (short)(4 * g);  // 16-element sub-blocks: lane k -> 4g + k / 8
    idx = _mm512_set_epi16(a + 3, a + 3, a + 3, a + 3, a + 3, a + 3, a + 3, a + 3, a + 2, a + 2, a + 2, a + 2, a + 2,
                           a + 2, a + 2, a + 2, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, a, a, a, a,
                           a, a, a, a);
  } else {
    const short a = (short)(2 * g);  // 32-element sub-blocks: lane k -> 2g + k / 16
    idx = _mm512_set_epi16(a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1,
                           a + 1, a + 1, a + 1, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a);
  }
  return _mm512_permutexvar_epi16(idx, _mm512_zextsi256_si512(table));
}

// Multiplier of each of the 16 per-16 bsums: Q4_K / Q5_K m_{i/2}; Q6_K sc_i.
template <GgmlType T>
inline __m256i bsum_multipliers(__m256i table) {
  if constexpr (T == GgmlType::Q6_K) {
    return table;
  } else {
    const __m256i idx = _mm256_set_epi16(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
    return _mm256_permutexvar_epi16(idx, table);
  }
}

// The 64 quants of group g (elements 64g .. 64g + 63) as unsigned bytes in natural order.
template <GgmlType T>
inline __m512i group_quants(const uint8_t* blk, int g) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  if constexpr (T == GgmlType::Q6_K) {
    const int h = g >> 1, odd = g & 1;
    const __m512i ql = _mm512_loadu_si512((const void*)(blk + 64 * h));
    const __m512i lo = _mm512_and_si512(odd ? _mm512_srli_epi16(ql, 4) : ql, m4);
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(blk + 128 + 32 * h)));
    const long long s0 = odd ? 4 : 0, s1 = odd ? 6 : 2;  // bits of qh for the lower / upper 32 elements
    const __m512i hi = _mm512_and_si512(_mm512_srlv_epi64(qh, _mm512_set_epi64(s1, s1, s1, s1, s0, s0, s0, s0)),
                                        _mm512_set1_epi8(3));
    return _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
  } else {
    constexpr size_t kQs = T == GgmlType::Q4_K ? 16 : 48;
    const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(blk + kQs + 32 * g)));
    __m512i z = _mm512_and_si512(_mm512_srlv_epi64(q, _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0)), m4);
    if constexpr (T == GgmlType::Q5_K) {
      // Fifth bit of element 64g + i is bit 2g of qh[i], of element 64g + 32 + i bit 2g + 1.
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(blk + 16)));
      const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * g))),
                                             _mm256_set1_epi8((char)(2 << (2 * g))), 1);
      z = _mm512_or_si512(z, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(qh, bit), _mm512_set1_epi8(0x10)));
    }
    return z;
  }
}

template <GgmlType T>
inline float block_d(const uint8_t* blk) {
  return h2f(load_u16(blk + (T == GgmlType::Q6_K ? offsetof(BlockQ6_K, d) : 0)));
}
template <GgmlType T>
inline float block_dmin(const uint8_t* blk) {
  return T == GgmlType::Q6_K ? 0.f : h2f(load_u16(blk + 2));
}

// The per-super-block float step shared by both paths (identical arithmetic per output):
// acc += isum * (d_w * d_a) [- mins * (dmin_w * d_a)].
template <GgmlType T>
inline __m512 finish_sb(__m512 acc, __m512i isum, __m256i bsums, __m256i mult, float dw, float dmin, float da) {
  const __m512i mins = _mm512_zextsi256_si512(_mm256_madd_epi16(bsums, mult));
  if constexpr (T == GgmlType::Q6_K) {
    isum = _mm512_sub_epi32(isum, _mm512_slli_epi32(mins, 5));  // (q - 32) * sc
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(dw * da), acc);
  } else {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(dw * da), acc);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins), _mm512_set1_ps(-(dmin * da)), acc);
  }
}

// ---------------------------------------------------------------- decode path (one token)

template <GgmlType T, int NR>
__attribute__((always_inline)) inline void gemv_rows(const uint8_t* const* rows, const uint8_t* a, int64_t nsb,
                                                     size_t prefetch_distance, float* out) {
  constexpr size_t kB = KFmt<T>::kBytes;
  __m512 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nsb; ++b) {
    const uint8_t* ab = a + (size_t)b * kActSb;
    __m512i isum[NR];
    __m256i table[NR];
    for (int r = 0; r < NR; ++r) {
      const char* ahead = (const char*)rows[r] + prefetch_distance + (size_t)b * kB;
      _mm_prefetch(ahead, _MM_HINT_T1);
      _mm_prefetch(ahead + 64, _MM_HINT_T1);
      _mm_prefetch(ahead + 128, _MM_HINT_T1);
      _mm_prefetch(ahead + kB - 1, _MM_HINT_T1);
      table[r] = scale_table<T>(rows[r] + (size_t)b * kB);
      isum[r] = _mm512_setzero_si512();
    }
    for (int g = 0; g < 4; ++g) {
      const __m512i av = _mm512_load_si512((const void*)(ab + 64 * g));
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const __m512i q = group_quants<T>(rows[r] + (size_t)b * kB, g);
        isum[r] = _mm512_dpwssd_epi32(isum[r], _mm512_maddubs_epi16(q, av), group_scale<T>(table[r], g));
      }
    }
    const __m256i bs = _mm256_load_si256((const __m256i*)(ab + kActBsums));
    float da;
    __builtin_memcpy(&da, ab + kActD, 4);
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = rows[r] + (size_t)b * kB;
      acc[r] = finish_sb<T>(acc[r], isum[r], bs, bsum_multipliers<T>(table[r]), block_d<T>(blk), block_dmin<T>(blk),
                            da);
    }
  }
  __m512 v[4];
  for (int r = 0; r < 4; ++r) v[r] = r < NR ? acc[r] : _mm512_setzero_ps();
  _mm512_mask_storeu_ps(out, (__mmask16)((1u << NR) - 1), reduce4(v[0], v[1], v[2], v[3]));
}

template <GgmlType T>
void gemv(const WeightMatrix& w, const uint8_t* a, int64_t r0, int64_t r1, float* y) {
  const int64_t nsb = w.n_in / kQKK;
  int64_t r = r0;
  for (; r + kGemvRows <= r1; r += kGemvRows) {
    const uint8_t* rows[kGemvRows];
    for (int i = 0; i < kGemvRows; ++i) rows[i] = w.data + (size_t)(r + i) * w.row_stride;
    gemv_rows<T, kGemvRows>(rows, a, nsb, kPrefetchGroups * kGemvRows * w.row_stride, y + r);
  }
  for (; r < r1; ++r) {
    const uint8_t* row = w.data + (size_t)r * w.row_stride;
    gemv_rows<T, 1>(&row, a, nsb, w.row_stride, y + r);
  }
}

// ---------------------------------------------------------------- prefill path (token tiles)

size_t work_bytes(int64_t n) { return (size_t)kTileRows * (size_t)(n / kQKK) * kPackSb; }

// Unpacks rows [r0, r0 + nr) (nr <= 2; a missing row is zero) into work: super-block b of row r at
// (b * kTileRows + r) * kPackSb.
template <GgmlType T>
void pack_rows(const WeightMatrix& w, int64_t r0, int nr, uint8_t* work) {
  constexpr size_t kB = KFmt<T>::kBytes;
  const int64_t nsb = w.n_in / kQKK;
  for (int r = 0; r < kTileRows; ++r) {
    for (int64_t b = 0; b < nsb; ++b) {
      uint8_t* out = work + (size_t)(b * kTileRows + r) * kPackSb;
      if (r >= nr) {
        for (size_t i = 0; i < kPackSb; i += kZ) _mm512_store_si512((void*)(out + i), _mm512_setzero_si512());
        continue;
      }
      const uint8_t* blk = w.data + (size_t)(r0 + r) * w.row_stride + (size_t)b * kB;
      const __m256i table = scale_table<T>(blk);
      for (int g = 0; g < 4; ++g) {
        _mm512_store_si512((void*)(out + g * kZ), group_quants<T>(blk, g));
        _mm512_store_si512((void*)(out + kPackScale + g * kZ), group_scale<T>(table, g));
      }
      const float hdr[2] = {block_d<T>(blk), block_dmin<T>(blk)};
      _mm512_store_si512((void*)(out + kPackHdr), _mm512_zextsi256_si512(bsum_multipliers<T>(table)));
      __builtin_memcpy(out + kPackHdr + 32, hdr, sizeof(hdr));
    }
  }
}

// y[t][r] for the 2 packed rows (nr valid) and NT tokens a[0..NT-1].
template <GgmlType T, int NT>
inline void tile(const uint8_t* pack, const uint8_t* const* a, int64_t nsb, int nr, float* y, int64_t ldy) {
  __m512 acc[kTileRows][NT];
  for (int r = 0; r < kTileRows; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nsb; ++b) {
    const uint8_t* p = pack + (size_t)b * kTileRows * kPackSb;
    __m512i isum[kTileRows][NT];
    for (int r = 0; r < kTileRows; ++r)
      for (int t = 0; t < NT; ++t) isum[r][t] = _mm512_setzero_si512();
    for (int g = 0; g < 4; ++g) {
      __m512i wq[kTileRows], ws[kTileRows];
      for (int r = 0; r < kTileRows; ++r) {
        wq[r] = _mm512_load_si512((const void*)(p + r * kPackSb + g * kZ));
        ws[r] = _mm512_load_si512((const void*)(p + r * kPackSb + kPackScale + g * kZ));
      }
      for (int t = 0; t < NT; ++t) {
        const __m512i av = _mm512_load_si512((const void*)(a[t] + (size_t)b * kActSb + 64 * g));
        for (int r = 0; r < kTileRows; ++r)
          isum[r][t] = _mm512_dpwssd_epi32(isum[r][t], _mm512_maddubs_epi16(wq[r], av), ws[r]);
      }
    }
    for (int t = 0; t < NT; ++t) {
      const uint8_t* ab = a[t] + (size_t)b * kActSb;
      const __m256i bs = _mm256_load_si256((const __m256i*)(ab + kActBsums));
      float da;
      __builtin_memcpy(&da, ab + kActD, 4);
      for (int r = 0; r < kTileRows; ++r) {
        const uint8_t* hdr = p + r * kPackSb + kPackHdr;
        float hd[2];
        __builtin_memcpy(hd, hdr + 32, sizeof(hd));
        acc[r][t] = finish_sb<T>(acc[r][t], isum[r][t], bs, _mm256_load_si256((const __m256i*)hdr), hd[0], hd[1], da);
      }
    }
  }
  for (int r = 0; r < nr; ++r) {
    __m512 v[4];
    for (int t = 0; t < 4; ++t) v[t] = t < NT ? acc[r][t] : _mm512_setzero_ps();
    alignas(64) float sums[16];
    _mm512_store_ps(sums, reduce4(v[0], v[1], v[2], v[3]));  // lane t: token t
    for (int t = 0; t < NT; ++t) y[t * ldy + r] = sums[t];
  }
}

template <GgmlType T>
void compute(const WeightMatrix& w, const uint8_t* act, size_t act_stride, int64_t r0, int64_t r1, int64_t t0,
             int64_t t1, float* y, int64_t ldy, uint8_t* work) {
  if (t1 - t0 == 1) {
    gemv<T>(w, act + (size_t)t0 * act_stride, r0, r1, y + t0 * ldy);
    return;
  }
  const int64_t nsb = w.n_in / kQKK;
  for (int64_t g = r0; g < r1; g += kTileRows) {
    const int nr = (int)(r1 - g < kTileRows ? r1 - g : kTileRows);
    pack_rows<T>(w, g, nr, work);
    for (int64_t t = t0; t < t1; t += kTileToks) {
      const int nt = (int)(t1 - t < kTileToks ? t1 - t : kTileToks);
      const uint8_t* a[kTileToks];
      for (int i = 0; i < kTileToks; ++i) a[i] = act + (size_t)(t + (i < nt ? i : 0)) * act_stride;
      float* yt = y + t * ldy + g;
      switch (nt) {
        case 4: tile<T, 4>(work, a, nsb, nr, yt, ldy); break;
        case 3: tile<T, 3>(work, a, nsb, nr, yt, ldy); break;
        case 2: tile<T, 2>(work, a, nsb, nr, yt, ldy); break;
        default: tile<T, 1>(work, a, nsb, nr, yt, ldy); break;
      }
    }
  }
}

template <GgmlType T>
MatmulKernel make_kernel() {
  MatmulKernel k;
  k.act_row_bytes = act_bytes;
  k.prepare_act = prepare_act;
  k.work_bytes = work_bytes;
  k.compute = compute<T>;
  return k;
}

}  // namespace

MatmulKernel avx512_k_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_K: return make_kernel<GgmlType::Q4_K>();
    case GgmlType::Q5_K: return make_kernel<GgmlType::Q5_K>();
    case GgmlType::Q6_K: return make_kernel<GgmlType::Q6_K>();
    default: return {};
  }
}

}  // namespace kvzap::kernels
