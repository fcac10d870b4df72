// AVX-512 (F/BW/VL/DQ + VNNI) kernels for the 32-element formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
// The K formats are in gemm_k_avx512.cpp, the float formats in gemm_float_avx512.cpp; other types fall
// back to the AVX2 kernels in the dispatcher.
//
// Scheme (one zmm = a pair of 32-element blocks b, b+1):
//  * Activations are quantized exactly as ggml's Q8_0 / Q8_1 (same q, fp16-rounded d, s) and stored per
//    pair as [64 int8 quants][16 float d per int32 lane][16 int32 per-lane offset corrections] (+ a float s[] tail
//    for Q4_1 / Q5_1).
//  * Weights are unpacked per group of 4 rows into the matching byte order, as unsigned bytes: nibble
//    formats as 0..15 / 0..31, Q8_0 as q + 128 (xor 0x80). vpdpbusd(u8 weight, s8 activation) then gives
//    sum q_w * q_a per 4 bytes; the offsets (-8, -16, +128) are removed exactly by starting each int32
//    lane at -offset * (sum of its 4 activation quants), so every lane holds its exact signed partial.
//  * Q4_1 / Q5_1 / Q8_0: per (row, token) a float accumulator takes isum * (d_w * d_a) lane-wise;
//    Q4_1/Q5_1 also take m_b * s_b for 16 blocks after every 8 pairs; at the end the 16 lanes are summed
//    by folding halves. Prefill: a 4-row x 4-token tile reuses every unpacked weight pair 4 times (rows
//    are packed once per work item into the thread's workspace and reused for all its tokens).
//  * Q4_0 / Q5_0 ("block-sum path"): the lanes of each block are summed as integers first (exact), and
//    the float accumulator takes isum_b * (d_w * d_a) once per block. Prefill packs 16 rows per zmm (int32
//    lane = row), so a 16-row x 8-token tile spends one cvt + mul + fma per 8 vpdpbusd.
//  * Decode (one token): rows are read straight from the GGUF data, 4 at a time, with prefetching.
//  * Every output element goes through the same arithmetic wherever it sits in a tile and on either
//    path, so results are bit-identical across thread counts and batch sizes (decode == prefill).
// Internal linkage throughout and no standard-library templates: nothing AVX-512-compiled can be
// shared with baseline code by the linker.
#include <immintrin.h>

#include "kernels/avx512_reduce.h"
#include "kernels/kernel_table.h"
#include "kernels/quant_blocks.h"

// GCC 12 reports its own intrinsic headers (_mm512_reduce_*, undefined vectors) as uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace kvzap::kernels {
namespace {

constexpr int kRows = 4;           // weight rows per micro-tile
constexpr int kToks = 4;           // tokens per micro-tile
constexpr size_t kZ = 64;          // bytes per zmm
constexpr size_t kPackPair = 2 * kRows * kZ;  // per pair: 4 unpacked rows + 4 scale vectors

enum class Order { Nibble, Linear };  // byte order inside a pair (see below)

// Nibble formats: bytes [b.0-15 | b1.0-15 | b.16-31 | b1.16-31] (int32 lanes 0-3, 8-11 belong to b).
// Q8_0:           bytes [b.0-31 | b1.0-31]                       (int32 lanes 0-7 belong to b).
template <GgmlType T>
struct Fmt;
template <> struct Fmt<GgmlType::Q4_0> { static constexpr int kBytes = 18, kOffset = 8; static constexpr bool kMin = false; static constexpr Order kOrder = Order::Nibble; };
template <> struct Fmt<GgmlType::Q4_1> { static constexpr int kBytes = 20, kOffset = 0; static constexpr bool kMin = true; static constexpr Order kOrder = Order::Nibble; };
template <> struct Fmt<GgmlType::Q5_0> { static constexpr int kBytes = 22, kOffset = 16; static constexpr bool kMin = false; static constexpr Order kOrder = Order::Nibble; };
template <> struct Fmt<GgmlType::Q5_1> { static constexpr int kBytes = 24, kOffset = 0; static constexpr bool kMin = true; static constexpr Order kOrder = Order::Nibble; };
template <> struct Fmt<GgmlType::Q8_0> { static constexpr int kBytes = 34, kOffset = 128; static constexpr bool kMin = false; static constexpr Order kOrder = Order::Linear; };

// Activation row layout.
template <GgmlType T>
constexpr size_t act_pair_bytes() { return Fmt<T>::kOffset ? 3 * kZ : 2 * kZ; }

inline int64_t n_pairs(int64_t n) { return (n / kQK + 1) / 2; }
inline int64_t padded_blocks(int64_t n) { return (n / kQK + 15) / 16 * 16; }  // s[] / m[] length

// Q4_0 / Q5_0 use block sums (see "block-sum path" below): each output is sum_b (d_w * d_a) * isum_b with
// the exact integer dot isum_b of block b, so the prefill tile can hold 16 rows per zmm.
template <GgmlType T>
constexpr bool kBlockSum = T == GgmlType::Q4_0 || T == GgmlType::Q5_0;

template <GgmlType T>
size_t act_bytes(int64_t n) {
  size_t bytes = (size_t)n_pairs(n) * act_pair_bytes<T>();
  if (Fmt<T>::kMin) bytes += (size_t)padded_blocks(n) * sizeof(float);
  if (kBlockSum<T>) bytes += (size_t)padded_blocks(n) * sizeof(int32_t);  // -offset * sum(q_a) per block
  return (bytes + kZ - 1) / kZ * kZ;
}

constexpr size_t kRows16 = 16;                 // rows per zmm in the block-sum tile
constexpr size_t kPackBlock16 = 8 * kZ + kZ;   // per block: 8 k-groups x [16 rows x 4 bytes], 16 d_w floats

template <GgmlType T>
size_t work_bytes(int64_t n) {
  if constexpr (kBlockSum<T>) return (size_t)(n / kQK) * kPackBlock16;
  size_t bytes = (size_t)n_pairs(n) * kPackPair;
  if (Fmt<T>::kMin) bytes += (size_t)kRows * (size_t)padded_blocks(n) * sizeof(float);
  return bytes;
}

inline float round_fp16(float f) { return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }

// Round half to even, as ggml's x86 activation quantizers do (_MM_ROUND_NEAREST).
inline __m512 round_nearest_even(__m512 v) {
  return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// One block with the rule of ggml's x86 quantize_row_q8_0/q8_1 (what llama.cpp runs on this CPU):
// d = amax / 127, q = round_half_even(x * (127 / amax)).
struct QuantBlock {
  __m128i lo, hi;  // quants of elements 0-15 and 16-31
  float d;         // unrounded scale
  int sum;         // sum of the quants
};

inline QuantBlock quantize_block(const float* x) {
  const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  QuantBlock q;
  q.d = amax / 127;
  const __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
  const __m512i i0 = _mm512_cvttps_epi32(round_nearest_even(_mm512_mul_ps(v0, id)));
  const __m512i i1 = _mm512_cvttps_epi32(round_nearest_even(_mm512_mul_ps(v1, id)));
  q.sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
  q.lo = _mm512_cvtepi32_epi8(i0);
  q.hi = _mm512_cvtepi32_epi8(i1);
  return q;
}

template <GgmlType T>
void prepare_act(const float* x, uint8_t* dst, int64_t n) {
  using F = Fmt<T>;
  const int64_t nb = n / kQK, np = n_pairs(n);
  float* s_tail = F::kMin ? (float*)(dst + (size_t)np * act_pair_bytes<T>()) : nullptr;
  int32_t* c_tail = kBlockSum<T> ? (int32_t*)(dst + (size_t)np * act_pair_bytes<T>()) : nullptr;
  for (int64_t p = 0; p < np; ++p) {
    uint8_t* out = dst + (size_t)p * act_pair_bytes<T>();
    QuantBlock q[2];
    for (int h = 0; h < 2; ++h) {
      const int64_t b = 2 * p + h;
      if (b < nb) {
        q[h] = quantize_block(x + b * kQK);
      } else {
        q[h] = {_mm_setzero_si128(), _mm_setzero_si128(), 0.f, 0};
      }
    }
    if constexpr (F::kOrder == Order::Nibble) {
      _mm_store_si128((__m128i*)(out + 0), q[0].lo);
      _mm_store_si128((__m128i*)(out + 16), q[1].lo);
      _mm_store_si128((__m128i*)(out + 32), q[0].hi);
      _mm_store_si128((__m128i*)(out + 48), q[1].hi);
    } else {
      _mm_store_si128((__m128i*)(out + 0), q[0].lo);
      _mm_store_si128((__m128i*)(out + 16), q[0].hi);
      _mm_store_si128((__m128i*)(out + 32), q[1].lo);
      _mm_store_si128((__m128i*)(out + 48), q[1].hi);
    }
    const float d0 = round_fp16(q[0].d), d1 = round_fp16(q[1].d);
    // Which int32 lanes belong to block b (bit set) vs b+1.
    constexpr __mmask16 kLanesB = F::kOrder == Order::Nibble ? 0x0F0F : 0x00FF;
    _mm512_store_ps((float*)(out + kZ), _mm512_mask_blend_ps(kLanesB, _mm512_set1_ps(d1), _mm512_set1_ps(d0)));
    if constexpr (F::kOffset != 0) {
      // Per int32 lane: -offset * (sum of the 4 quants that lane multiplies), so that every lane of
      // the weight dot holds its exact signed partial sum (no large values cancelling in float).
      const __m512i qa = _mm512_load_si512((const void*)out);
      const __m512i k_sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)F::kOffset), qa);
      _mm512_store_si512((void*)(out + 2 * kZ), _mm512_sub_epi32(_mm512_setzero_si512(), k_sums));
    }
    if constexpr (kBlockSum<T>) {
      c_tail[2 * p] = -F::kOffset * q[0].sum;
      c_tail[2 * p + 1] = -F::kOffset * q[1].sum;  // 0 for a missing block; padded_blocks >= 2 * np
    }
    if constexpr (F::kMin) {
      // ggml: s = fp16(d * sum(q)) with the unrounded d.
      s_tail[2 * p] = round_fp16((float)q[0].sum * q[0].d);
      if (2 * p + 1 < nb) s_tail[2 * p + 1] = round_fp16((float)q[1].sum * q[1].d);
    }
  }
  if constexpr (F::kMin) {
    for (int64_t b = nb; b < padded_blocks(n); ++b) s_tail[b] = 0.f;
  }
  if constexpr (kBlockSum<T>) {
    for (int64_t b = 2 * np; b < padded_blocks(n); ++b) c_tail[b] = 0;
  }
}

// ---------------------------------------------------------------- weight unpacking

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  __builtin_memcpy(&v, p, 2);
  return v;
}
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

// Two 16-byte nibble arrays -> [b.lo | b1.lo | b.hi | b1.hi] as bytes 0..15.
inline __m512i unpack_nibble_pair(const uint8_t* qs0, const uint8_t* qs1) {
  const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)qs0)),
                                            _mm_loadu_si128((const __m128i*)qs1), 1);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m4)),
                            _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), 1);
}

// Fifth bits of a Q5 pair as a byte mask in the nibble byte order: b's 16-bit halves go to mask bits
// 0-15 and 32-47, b1's to 16-31 and 48-63 (two bit deposits instead of shifting four halves).
inline __mmask64 fifth_bits(uint32_t qh0, uint32_t qh1) {
  return (__mmask64)(_pdep_u64(qh0, 0x0000FFFF0000FFFFull) | _pdep_u64(qh1, 0xFFFF0000FFFF0000ull));
}

// One weight pair (blocks 2p and 2p + 1 of a row) ready for vpdpbusd, plus its fp16 header fields as
// floats; a missing block 2p + 1 (odd block count) reads as zeros.
struct WeightPair {
  __m512i z;
  __m512 hdr;
};

// Float positions in WeightPair::hdr of d_b, d_b1, m_b, m_b1.
template <GgmlType T> constexpr int kHdrD0 = 0;
template <GgmlType T> constexpr int kHdrD1 = Fmt<T>::kBytes / 2;
template <GgmlType T> constexpr int kHdrM0 = 1;
template <GgmlType T> constexpr int kHdrM1 = Fmt<T>::kBytes / 2 + 1;
template <> constexpr int kHdrD1<GgmlType::Q8_0> = 1;  // Q8_0 assembles its two scales itself

// Pairs [0, full_load_pairs) can be read with one unmasked 64-byte load without leaving the row.
template <GgmlType T>
inline int64_t full_load_pairs(int64_t nb) {
  const int64_t row_bytes = nb * Fmt<T>::kBytes;
  return row_bytes >= 64 ? (row_bytes - 64) / (2 * Fmt<T>::kBytes) + 1 : 0;
}

template <GgmlType T>
inline WeightPair load_pair(const uint8_t* row, int64_t p, bool has_b1, bool masked) {
  using F = Fmt<T>;
  const uint8_t* b0 = row + (size_t)(2 * p) * F::kBytes;
  const uint8_t* b1 = b0 + F::kBytes;
  WeightPair out;
  if constexpr (T == GgmlType::Q4_1 || T == GgmlType::Q5_1) {
    // Headers and nibbles are dword aligned: one load, a dword permute puts both blocks' 16 nibble
    // bytes in each 256-bit half, a per-qword shift exposes the high nibbles in the upper half.
    // A full 64-byte load would leave the row on its last pair or two (full_load_pairs); masked loads
    // are much slower when they miss the cache (measured on Zen 5), so only those pairs use one.
    constexpr int kDw = F::kBytes / 4, kQs = T == GgmlType::Q4_1 ? 1 : 2;
    __m512i raw;
    if (!masked) {
      raw = _mm512_loadu_si512((const void*)b0);
    } else {
      const __mmask16 valid = has_b1 ? (__mmask16)((1u << (2 * kDw)) - 1) : (__mmask16)((1u << kDw) - 1);
      raw = _mm512_maskz_loadu_epi32(valid, b0);
    }
    const __m512i idx = _mm512_setr_epi32(kQs, kQs + 1, kQs + 2, kQs + 3, kDw + kQs, kDw + kQs + 1, kDw + kQs + 2,
                                          kDw + kQs + 3, kQs, kQs + 1, kQs + 2, kQs + 3, kDw + kQs, kDw + kQs + 1,
                                          kDw + kQs + 2, kDw + kQs + 3);
    const __m512i both = _mm512_permutexvar_epi32(idx, raw);
    const __m512i shifted = _mm512_srlv_epi64(both, _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4));
    out.z = _mm512_and_si512(shifted, _mm512_set1_epi8(0x0F));
    out.hdr = _mm512_cvtph_ps(_mm512_castsi512_si256(raw));
    if constexpr (T == GgmlType::Q5_1) {
      const __mmask64 hb = fifth_bits(load_u32(b0 + 4), has_b1 ? load_u32(b1 + 4) : 0);
      out.z = _mm512_or_si512(out.z, _mm512_maskz_mov_epi8(hb, _mm512_set1_epi8(0x10)));
    }
  } else if constexpr (T == GgmlType::Q8_0) {
    const __m256i lo = _mm256_loadu_si256((const __m256i*)(b0 + 2));
    const __m256i hi = has_b1 ? _mm256_loadu_si256((const __m256i*)(b1 + 2)) : _mm256_setzero_si256();
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    out.z = _mm512_xor_si512(z, _mm512_set1_epi8((char)0x80));  // q + 128 as unsigned
    const uint32_t d01 = (uint32_t)load_u16(b0) | (has_b1 ? (uint32_t)load_u16(b1) << 16 : 0u);
    out.hdr = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)d01)));
  } else {  // Q4_0, Q5_0
    constexpr int kQsOff = T == GgmlType::Q4_0 ? 2 : 6;
    static const uint8_t kZeros[16] = {};
    out.z = unpack_nibble_pair(b0 + kQsOff, has_b1 ? b1 + kQsOff : kZeros);
    if constexpr (T == GgmlType::Q5_0) {
      const __mmask64 hb = fifth_bits(load_u32(b0 + 2), has_b1 ? load_u32(b1 + 2) : 0);
      out.z = _mm512_or_si512(out.z, _mm512_maskz_mov_epi8(hb, _mm512_set1_epi8(0x10)));
    }
    out.hdr = _mm512_cvtph_ps(has_b1 ? _mm256_loadu_si256((const __m256i*)b0)  // inside the pair
                                     : _mm256_maskz_loadu_epi16((__mmask16)((1u << (F::kBytes / 2)) - 1), b0));
  }
  return out;
}

// Lane patterns turning hdr into d_w per int32 lane, and into m per block (even lane: block b).
template <GgmlType T>
inline __m512i d_lane_index() {
  constexpr int a = kHdrD0<T>, b = kHdrD1<T>;
  if constexpr (Fmt<T>::kOrder == Order::Nibble)
    return _mm512_setr_epi32(a, a, a, a, b, b, b, b, a, a, a, a, b, b, b, b);
  else
    return _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b);
}
template <GgmlType T>
inline __m512i m_lane_index() {
  constexpr int a = kHdrM0<T>, b = kHdrM1<T>;
  return _mm512_setr_epi32(a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b);
}

// Lanes of the 16-block m / s chunk that pair p fills.
inline __mmask16 pair_lanes(int64_t p, bool has_b1) { return (__mmask16)((has_b1 ? 3u : 1u) << ((2 * p) & 15)); }

// ---------------------------------------------------------------- decode path (one token)
//
// Reads weight pairs straight from the GGUF rows (no packing), with exactly the arithmetic of the
// packed tile path per output, so decode and prefill give bit-identical rows.

// Rows are read in lock-step, which the hardware prefetchers follow poorly (measured 2.5x slower on a
// DRAM-resident LM head): each pair also prefetches the same bytes of the row 4 groups further on, into
// L2 (prefetcht1): into L1 the prefetches filled L1's miss buffers and the LM head streamed at 9 GB/s on
// one thread instead of ~24 (docs/BENCHMARKS.md). The other decode GEMVs (K, float, AVX2) use L2 too.
constexpr int kPrefetchGroups = 4;

// Accumulators of NR rows x 1 token; step() consumes one weight pair of every row.
template <GgmlType T, int NR>
struct GemvState {
  using F = Fmt<T>;
  const uint8_t* const* rows;
  const uint8_t* a;
  size_t prefetch_distance;
  __m512i idx_d, idx_m;
  __m512 acc[NR], mvec[NR];

  template <bool kMasked>
  inline void step(int64_t p, bool has_b1) {
    constexpr size_t kAct = act_pair_bytes<T>();
    const uint8_t* ap = a + (size_t)p * kAct;
    const __m512i av = _mm512_load_si512((const void*)ap);
    const __m512 da = _mm512_load_ps((const float*)(ap + kZ));
    const __m512i init = F::kOffset ? _mm512_load_si512((const void*)(ap + 2 * kZ)) : _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const char* ahead = (const char*)rows[r] + prefetch_distance + (size_t)(2 * p) * F::kBytes;
      _mm_prefetch(ahead, _MM_HINT_T1);
      if constexpr (2 * F::kBytes > 64) _mm_prefetch(ahead + 2 * F::kBytes - 1, _MM_HINT_T1);
      const WeightPair w = load_pair<T>(rows[r], p, has_b1, kMasked);
      const __m512 dwv = _mm512_permutexvar_ps(idx_d, w.hdr);
      const __m512i isum = _mm512_dpbusd_epi32(init, w.z, av);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dwv, da), acc[r]);
      if constexpr (F::kMin) mvec[r] = _mm512_mask_permutexvar_ps(mvec[r], pair_lanes(p, has_b1), idx_m, w.hdr);
    }
  }
};

template <GgmlType T, int NR>
__attribute__((always_inline)) inline void gemv_rows(const uint8_t* const* rows, const uint8_t* a, int64_t nb, size_t prefetch_distance,
                      float* out) {
  using F = Fmt<T>;
  const int64_t np = n_pairs(nb * kQK);
  GemvState<T, NR> st{rows, a, prefetch_distance, d_lane_index<T>(), m_lane_index<T>(), {}, {}};
  for (int r = 0; r < NR; ++r) st.acc[r] = st.mvec[r] = _mm512_setzero_ps();
  const float* s = F::kMin ? (const float*)(a + (size_t)np * act_pair_bytes<T>()) : nullptr;
  // Chunks of 8 pairs = the 16 blocks of one m / s vector; only the row's last pair or two need care
  // (masked loads, possibly a missing second block).
  const int64_t n_full = full_load_pairs<T>(nb) < np - 1 ? full_load_pairs<T>(nb) : np - 1;
  for (int64_t c = 0; c < np; c += 8) {
    const int64_t end = c + 8 < np ? c + 8 : np;
    const int64_t plain_end = end < n_full ? end : (c > n_full ? c : n_full);
    for (int64_t p = c; p < plain_end; ++p) st.template step<false>(p, true);
    for (int64_t p = plain_end; p < end; ++p) st.template step<true>(p, 2 * p + 1 < nb);
    if constexpr (F::kMin) {  // + m_b * s_b of this chunk's 16 blocks, where tile() adds it too
      const __m512 sv = _mm512_load_ps(s + 2 * c);
      for (int r = 0; r < NR; ++r) {
        st.acc[r] = _mm512_fmadd_ps(st.mvec[r], sv, st.acc[r]);
        st.mvec[r] = _mm512_setzero_ps();
      }
    }
  }
  __m512 v[4];
  for (int r = 0; r < 4; ++r) v[r] = r < NR ? st.acc[r] : _mm512_setzero_ps();
  const __m512 sums = reduce4(v[0], v[1], v[2], v[3]);
  _mm512_mask_storeu_ps(out, (__mmask16)((1u << NR) - 1), sums);
}

template <GgmlType T>
void gemv(const WeightMatrix& w, const uint8_t* a, int64_t r0, int64_t r1, float* y) {
  const int64_t nb = w.n_in / kQK;
  int64_t r = r0;
  for (; r + kRows <= r1; r += kRows) {
    const uint8_t* rows[kRows];
    for (int i = 0; i < kRows; ++i) rows[i] = w.data + (size_t)(r + i) * w.row_stride;
    gemv_rows<T, kRows>(rows, a, nb, kPrefetchGroups * kRows * w.row_stride, y + r);
  }
  for (; r < r1; ++r) {
    const uint8_t* row = w.data + (size_t)r * w.row_stride;
    gemv_rows<T, 1>(&row, a, nb, w.row_stride, y + r);
  }
}

// ---------------------------------------------------------------- prefill path (token tiles)

// Packs rows [r0, r0 + nr) (nr <= 4; missing rows are zero) into the workspace:
// per pair: 4 x 64 bytes of unpacked weights, then 4 x 16 floats of d_w per int32 lane;
// then (Q4_1/Q5_1) m[row][padded_blocks] floats.
template <GgmlType T>
void pack_rows(const WeightMatrix& w, int64_t r0, int nr, uint8_t* work) {
  using F = Fmt<T>;
  const int64_t nb = w.n_in / kQK, np = n_pairs(w.n_in), nbp = padded_blocks(w.n_in);
  const int64_t n_full = full_load_pairs<T>(nb) < np - 1 ? full_load_pairs<T>(nb) : np - 1;
  const __m512i idx_d = d_lane_index<T>();
  const __m512i idx_m = m_lane_index<T>();
  for (int r = 0; r < kRows; ++r) {
    const uint8_t* row = r < nr ? w.data + (size_t)(r0 + r) * w.row_stride : nullptr;
    float* m = F::kMin ? (float*)(work + (size_t)np * kPackPair) + (size_t)r * nbp : nullptr;
    __m512 mvec = _mm512_setzero_ps();
    for (int64_t p = 0; p < np; ++p) {
      uint8_t* out = work + (size_t)p * kPackPair;
      const bool has_b1 = 2 * p + 1 < nb;
      WeightPair wp{_mm512_setzero_si512(), _mm512_setzero_ps()};
      if (row) wp = load_pair<T>(row, p, has_b1, p >= n_full);
      _mm512_store_si512((void*)(out + (size_t)r * kZ), wp.z);
      _mm512_store_ps((float*)(out + (size_t)(kRows + r) * kZ), _mm512_permutexvar_ps(idx_d, wp.hdr));
      if constexpr (F::kMin) {
        mvec = _mm512_mask_permutexvar_ps(mvec, pair_lanes(p, has_b1), idx_m, wp.hdr);
        if ((p & 7) == 7 || p == np - 1) {
          _mm512_store_ps(m + (p & ~(int64_t)7) * 2, mvec);
          mvec = _mm512_setzero_ps();
        }
      }
    }
  }
}

// y[t][r] for the 4 packed rows (nr valid) and NT tokens (a[0..NT-1]).
template <GgmlType T, int NT>
inline void tile(const uint8_t* pack, const uint8_t* const* a, int64_t np, int64_t nbp, int nr, float* y,
                 int64_t ldy) {
  constexpr size_t kAct = act_pair_bytes<T>();
  const float* m = Fmt<T>::kMin ? (const float*)(pack + (size_t)np * kPackPair) : nullptr;  // [row][nbp]
  __m512 acc[16];  // [row][token], as reduce16 wants it
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t p = 0; p < np; ++p) {
    const uint8_t* g = pack + (size_t)p * kPackPair;
    __m512i wz[kRows];
    __m512 dw[kRows];  // loaded once per pair, not once per token
    for (int r = 0; r < kRows; ++r) {
      wz[r] = _mm512_load_si512((const void*)(g + (size_t)r * kZ));
      dw[r] = _mm512_load_ps((const float*)(g + (size_t)(kRows + r) * kZ));
    }
    for (int t = 0; t < NT; ++t) {
      const uint8_t* ap = a[t] + (size_t)p * kAct;
      const __m512i av = _mm512_load_si512((const void*)ap);
      const __m512 da = _mm512_load_ps((const float*)(ap + kZ));
      const __m512i init =
          Fmt<T>::kOffset ? _mm512_load_si512((const void*)(ap + 2 * kZ)) : _mm512_setzero_si512();
      for (int r = 0; r < kRows; ++r) {
        const __m512i isum = _mm512_dpbusd_epi32(init, wz[r], av);
        acc[4 * r + t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw[r], da), acc[4 * r + t]);
      }
    }
    if constexpr (Fmt<T>::kMin) {
      if ((p & 7) == 7 || p == np - 1) {  // + m_b * s_b of the 16 blocks just finished, as gemv_rows does
        const int64_t b0 = (p & ~(int64_t)7) * 2;
        for (int r = 0; r < kRows; ++r) {
          const __m512 mv = _mm512_load_ps(m + (size_t)r * nbp + b0);
          for (int t = 0; t < NT; ++t)
            acc[4 * r + t] = _mm512_fmadd_ps(mv, _mm512_load_ps((const float*)(a[t] + (size_t)np * kAct) + b0),
                                             acc[4 * r + t]);
        }
      }
    }
  }
  alignas(64) float sums[16];  // [token][row]
  _mm512_store_ps(sums, reduce16(acc));
  const __mmask8 rows_valid = (__mmask8)((1u << nr) - 1);
  for (int t = 0; t < NT; ++t) _mm_mask_storeu_ps(y + t * ldy, rows_valid, _mm_load_ps(sums + 4 * t));
}

// ---------------------------------------------------------------- block-sum path (Q4_0, Q5_0)
//
// Per output: acc = fma((float)isum_b, d_w[b] * d_a[b], acc) for b = 0, 1, ... in order, where isum_b is
// the exact integer dot of block b (offset removed). Integer sums are exact in any order, so the decode
// GEMV (4 raw rows, integer lane folds) and the prefill tile (16 rows per zmm) give identical bits.
// The tile spends one cvt + mul + fma per 8 vpdpbusd instead of per vpdpbusd.

// Which act dword (of pair p) holds elements 4j..4j+3 of block half h (Nibble order: b at bytes 0-15 and
// 32-47, b+1 at 16-31 and 48-63).
constexpr int act_dword(int j, int h) { return j < 4 ? 4 * h + j : 8 + 4 * h + (j - 4); }

// NR (1..4) raw rows x 1 token.
template <GgmlType T, int NR>
__attribute__((always_inline)) inline void gemv_rows_blocksum(const uint8_t* const* rows, const uint8_t* a, int64_t nb,
                                                              size_t prefetch_distance, float* out) {
  using F = Fmt<T>;
  constexpr size_t kAct = act_pair_bytes<T>();
  constexpr int kD1 = kHdrD1<T>;
  const int64_t np = n_pairs(nb * kQK);
  const int64_t n_full = full_load_pairs<T>(nb) < np - 1 ? full_load_pairs<T>(nb) : np - 1;
  // hdr lanes -> [d_b of rows 0-3 | d_b1 of rows 0-3]: first rows (0,1) and (2,3), then both pairs.
  const __m512i idx_pair = _mm512_setr_epi32(0, 16, kD1, 16 + kD1, 0, 16, kD1, 16 + kD1, 0, 16, kD1, 16 + kD1, 0, 16,
                                             kD1, 16 + kD1);
  const __m512i idx_quad = _mm512_setr_epi32(0, 1, 16, 17, 2, 3, 18, 19, 0, 1, 16, 17, 2, 3, 18, 19);
  __m128 acc = _mm_setzero_ps();
  for (int64_t p = 0; p < np; ++p) {
    const bool masked = p >= n_full, has_b1 = 2 * p + 1 < nb;
    const uint8_t* ap = a + (size_t)p * kAct;
    const __m512i av = _mm512_load_si512((const void*)ap);
    const __m512 da = _mm512_load_ps((const float*)(ap + kZ));
    const __m512i init = _mm512_load_si512((const void*)(ap + 2 * kZ));
    __m512i z[4];
    __m512 hdr[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      if (r < NR) {
        const char* ahead = (const char*)rows[r] + prefetch_distance + (size_t)(2 * p) * F::kBytes;
        _mm_prefetch(ahead, _MM_HINT_T1);
        const WeightPair w = masked ? load_pair<T>(rows[r], p, has_b1, true) : load_pair<T>(rows[r], p, true, false);
        z[r] = _mm512_dpbusd_epi32(init, w.z, av);
        hdr[r] = w.hdr;
      } else {
        z[r] = _mm512_setzero_si512();
        hdr[r] = _mm512_setzero_ps();
      }
    }
    // Per 128-bit chunk c: [row0, row1, row2, row3] sums of the chunk's 4 lanes; chunks 0 and 2 are block
    // b, 1 and 3 block b + 1.
    const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(z[0], z[1]), _mm512_unpackhi_epi32(z[0], z[1]));
    const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(z[2], z[3]), _mm512_unpackhi_epi32(z[2], z[3]));
    const __m512i c = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
    const __m512i s = _mm512_add_epi32(c, _mm512_shuffle_i64x2(c, c, _MM_SHUFFLE(1, 0, 3, 2)));
    const __m512 isum = _mm512_cvtepi32_ps(s);  // lanes 0-3: block b of rows 0-3, 4-7: block b + 1
    const __m512 d01 = _mm512_permutex2var_ps(hdr[0], idx_pair, hdr[1]);
    const __m512 d23 = _mm512_permutex2var_ps(hdr[2], idx_pair, hdr[3]);
    const __m512 scale = _mm512_mul_ps(_mm512_permutex2var_ps(d01, idx_quad, d23), da);  // da lanes 0-3 / 4-7
    acc = _mm_fmadd_ps(_mm512_castps512_ps128(isum), _mm512_castps512_ps128(scale), acc);
    if (has_b1) acc = _mm_fmadd_ps(_mm512_extractf32x4_ps(isum, 1), _mm512_extractf32x4_ps(scale, 1), acc);
  }
  _mm_mask_storeu_ps(out, (__mmask8)((1u << NR) - 1), acc);
}

template <GgmlType T>
void gemv_blocksum(const WeightMatrix& w, const uint8_t* a, int64_t r0, int64_t r1, float* y) {
  const int64_t nb = w.n_in / kQK;
  const uint8_t* rows[kRows];
  int64_t r = r0;
  for (; r + kRows <= r1; r += kRows) {
    for (int i = 0; i < kRows; ++i) rows[i] = w.data + (size_t)(r + i) * w.row_stride;
    gemv_rows_blocksum<T, kRows>(rows, a, nb, kPrefetchGroups * kRows * w.row_stride, y + r);
  }
  const int rest = (int)(r1 - r);
  for (int i = 0; i < rest; ++i) rows[i] = w.data + (size_t)(r + i) * w.row_stride;
  const size_t ahead = (size_t)rest * w.row_stride;
  if (rest == 3) gemv_rows_blocksum<T, 3>(rows, a, nb, ahead, y + r);
  if (rest == 2) gemv_rows_blocksum<T, 2>(rows, a, nb, ahead, y + r);
  if (rest == 1) gemv_rows_blocksum<T, 1>(rows, a, nb, ahead, y + r);
}

// Transposes 16 x 16 int32: out[d] lane r = in[r] lane d.
inline void transpose16(const __m512i* in, __m512i* out) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
  }
  // u[4g + e], 128-bit lane L: element 4L + e of rows 4g..4g+3.
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  // 4 x 4 transpose of 128-bit lanes among u[e], u[4 + e], u[8 + e], u[12 + e].
  for (int e = 0; e < 4; ++e) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[e], u[4 + e], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i v1 = _mm512_shuffle_i32x4(u[e], u[4 + e], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], _MM_SHUFFLE(3, 2, 3, 2));
    out[0 + e] = _mm512_shuffle_i32x4(v0, v2, _MM_SHUFFLE(2, 0, 2, 0));
    out[4 + e] = _mm512_shuffle_i32x4(v0, v2, _MM_SHUFFLE(3, 1, 3, 1));
    out[8 + e] = _mm512_shuffle_i32x4(v1, v3, _MM_SHUFFLE(2, 0, 2, 0));
    out[12 + e] = _mm512_shuffle_i32x4(v1, v3, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// Packs rows [r0, r0 + nr) (nr <= 16; missing rows are zero) as [block][8 k-groups][16 rows][4 bytes]
// followed by the block's 16 d_w floats: int32 lane r of a k-group vector is row r.
template <GgmlType T>
void pack_rows16(const WeightMatrix& w, int64_t r0, int nr, uint8_t* work) {
  const int64_t nb = w.n_in / kQK, np = n_pairs(w.n_in);
  const int64_t n_full = full_load_pairs<T>(nb) < np - 1 ? full_load_pairs<T>(nb) : np - 1;
  for (int64_t p = 0; p < np; ++p) {
    const bool has_b1 = 2 * p + 1 < nb;
    __m512i z[kRows16], zt[kRows16];
    alignas(64) float hdr[kRows16][16];
    for (int r = 0; r < (int)kRows16; ++r) {
      WeightPair wp{_mm512_setzero_si512(), _mm512_setzero_ps()};
      if (r < nr) wp = load_pair<T>(w.data + (size_t)(r0 + r) * w.row_stride, p, has_b1, p >= n_full);
      z[r] = wp.z;
      _mm512_store_ps(hdr[r], wp.hdr);
    }
    transpose16(z, zt);
    for (int h = 0; h < (has_b1 ? 2 : 1); ++h) {
      uint8_t* out = work + (size_t)(2 * p + h) * kPackBlock16;
      for (int j = 0; j < 8; ++j) _mm512_store_si512((void*)(out + (size_t)j * kZ), zt[act_dword(j, h)]);
      alignas(64) float dw[kRows16];
      for (int r = 0; r < (int)kRows16; ++r) dw[r] = hdr[r][h ? kHdrD1<T> : kHdrD0<T>];
      _mm512_store_ps((float*)(out + 8 * kZ), _mm512_load_ps(dw));
    }
  }
}

// y[t][r] for the 16 packed rows (nr valid) and NT tokens (a[0..NT-1]).
template <GgmlType T, int NT>
inline void tile16(const uint8_t* pack, const uint8_t* const* a, int64_t nb, int64_t np, int nr, float* y,
                   int64_t ldy) {
  constexpr size_t kAct = act_pair_bytes<T>();
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = pack + (size_t)b * kPackBlock16;
    const int h = (int)(b & 1);
    const size_t pair_off = (size_t)(b >> 1) * kAct;
    __m512i isum[NT];
    for (int t = 0; t < NT; ++t)
      isum[t] = _mm512_set1_epi32(((const int32_t*)(a[t] + (size_t)np * kAct))[b]);  // -offset * sum(q_a)
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512i wv = _mm512_load_si512((const void*)(wb + (size_t)j * kZ));
      const size_t off = pair_off + 4 * (size_t)act_dword(j, 0) + 16 * (size_t)h;
      for (int t = 0; t < NT; ++t)
        isum[t] = _mm512_dpbusd_epi32(isum[t], wv, _mm512_set1_epi32((int)load_u32(a[t] + off)));
    }
    const __m512 dw = _mm512_load_ps((const float*)(wb + 8 * kZ));
    for (int t = 0; t < NT; ++t) {
      const __m512 da = _mm512_set1_ps(*(const float*)(a[t] + pair_off + kZ + 16 * (size_t)h));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dw, da), acc[t]);
    }
  }
  const __mmask16 rows_valid = (__mmask16)((1u << nr) - 1);
  for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + t * ldy, rows_valid, acc[t]);
}

template <GgmlType T>
void compute_blocksum(const WeightMatrix& w, const uint8_t* act, size_t act_stride, int64_t r0, int64_t r1,
                      int64_t t0, int64_t t1, float* y, int64_t ldy, uint8_t* work) {
  if (t1 - t0 == 1) {
    gemv_blocksum<T>(w, act + (size_t)t0 * act_stride, r0, r1, y + t0 * ldy);
    return;
  }
  constexpr int64_t kToks16 = 8;
  const int64_t nb = w.n_in / kQK, np = n_pairs(w.n_in);
  for (int64_t g = r0; g < r1; g += (int64_t)kRows16) {
    const int nr = (int)(r1 - g < (int64_t)kRows16 ? r1 - g : (int64_t)kRows16);
    pack_rows16<T>(w, g, nr, work);
    for (int64_t t = t0; t < t1; t += kToks16) {
      const int nt = (int)(t1 - t < kToks16 ? t1 - t : kToks16);
      const uint8_t* a[kToks16];
      for (int i = 0; i < kToks16; ++i) a[i] = act + (size_t)(t + (i < nt ? i : 0)) * act_stride;
      float* yt = y + t * ldy + g;
      switch (nt) {
        case 8: tile16<T, 8>(work, a, nb, np, nr, yt, ldy); break;
        case 7: tile16<T, 7>(work, a, nb, np, nr, yt, ldy); break;
        case 6: tile16<T, 6>(work, a, nb, np, nr, yt, ldy); break;
        case 5: tile16<T, 5>(work, a, nb, np, nr, yt, ldy); break;
        case 4: tile16<T, 4>(work, a, nb, np, nr, yt, ldy); break;
        case 3: tile16<T, 3>(work, a, nb, np, nr, yt, ldy); break;
        case 2: tile16<T, 2>(work, a, nb, np, nr, yt, ldy); break;
        default: tile16<T, 1>(work, a, nb, np, nr, yt, ldy); break;
      }
    }
  }
}

template <GgmlType T>
void compute(const WeightMatrix& w, const uint8_t* act, size_t act_stride, int64_t r0, int64_t r1, int64_t t0,
             int64_t t1, float* y, int64_t ldy, uint8_t* work) {
  if (t1 - t0 == 1) {
    gemv<T>(w, act + (size_t)t0 * act_stride, r0, r1, y + t0 * ldy);
    return;
  }
  const int64_t np = n_pairs(w.n_in), nbp = padded_blocks(w.n_in);
  for (int64_t g = r0; g < r1; g += kRows) {
    const int nr = (int)(r1 - g < kRows ? r1 - g : kRows);
    pack_rows<T>(w, g, nr, work);
    for (int64_t t = t0; t < t1; t += kToks) {
      const int nt = (int)(t1 - t < kToks ? t1 - t : kToks);
      const uint8_t* a[kToks];
      for (int i = 0; i < kToks; ++i) a[i] = act + (size_t)(t + (i < nt ? i : 0)) * act_stride;
      float* yt = y + t * ldy + g;
      switch (nt) {
        case 4: tile<T, 4>(work, a, np, nbp, nr, yt, ldy); break;
        case 3: tile<T, 3>(work, a, np, nbp, nr, yt, ldy); break;
        case 2: tile<T, 2>(work, a, np, nbp, nr, yt, ldy); break;
        default: tile<T, 1>(work, a, np, nbp, nr, yt, ldy); break;
      }
    }
  }
}

template <GgmlType T>
MatmulKernel make_kernel() {
  MatmulKernel k;
  k.act_row_bytes = act_bytes<T>;
  k.prepare_act = prepare_act<T>;
  k.work_bytes = work_bytes<T>;
  if constexpr (kBlockSum<T>) {
    k.compute = compute_blocksum<T>;
    k.token_block = 256;  // packing 16 rows costs ~30 % of a 64-token tile (perf); 256 tokens: +6 % prefill
  } else {
    k.compute = compute<T>;
  }
  return k;
}

}  // namespace

MatmulKernel avx512_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0: return make_kernel<GgmlType::Q4_0>();
    case GgmlType::Q4_1: return make_kernel<GgmlType::Q4_1>();
    case GgmlType::Q5_0: return make_kernel<GgmlType::Q5_0>();
    case GgmlType::Q5_1: return make_kernel<GgmlType::Q5_1>();
    case GgmlType::Q8_0: return make_kernel<GgmlType::Q8_0>();
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: return avx512_float_kernel(type);
    default: return avx512_k_kernel(type);
  }
}

// The f32/f16 helpers are short vectors (head_dim); the AVX2 versions are as fast here.
const VectorKernels& avx512_vector_kernels() { return avx2_vector_kernels(); }

}  // namespace kvzap::kernels
