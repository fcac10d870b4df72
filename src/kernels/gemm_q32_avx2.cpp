// AVX2 kernels for the 32-element formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (the AVX-512 file has the same
// design with pairs of blocks per register; read its header comment first).
//  * Activations: ggml's Q8_0 / Q8_1 quantization, stored per block as [32 int8 quants (Q8_0 weights:
//    32 int16)][8 x d_a][8 x int32 per-lane offset corrections (Q4_0, Q5_0)] (+ float s[] tail for Q4_1/Q5_1).
//  * Nibble weights are unpacked to bytes 0..15 / 0..31 and multiplied with vpmaddubsw (no saturation:
//    31 * 127 * 2 < 32767); the -8 / -16 offsets are removed exactly by a per-lane correction.
//    Q8_0 weights are widened to int16 and use vpmaddwd (u8 x s8 would saturate).
//  * Per (row, token) a float accumulator takes isum * (d_w * d_a); Q4_1/Q5_1 add sum_b m_b * s_b.
//    Tiles of 2 rows x 4 tokens reuse each unpacked weight block 4 times (16 ymm registers).
//  * Decode (one token) reads the GGUF rows directly with the same per-output arithmetic.
// Internal linkage throughout, no standard-library templates (see matmul_avx2.cpp).
#include <immintrin.h>

#include "kernels/kernel_table.h"
#include "kernels/quant_blocks.h"

namespace kvzap::kernels {
namespace {

constexpr int kRows = 2;      // weight rows per micro-tile
constexpr int kToks = 4;      // tokens per micro-tile
constexpr size_t kY = 32;     // bytes per ymm
constexpr int kPrefetchGroups = 8;

template <GgmlType T>
struct Fmt;
template <> struct Fmt<GgmlType::Q4_0> { static constexpr int kBytes = 18, kOffset = 8, kQs = 2, kQh = -1; static constexpr bool kMin = false, kWide = false; };
template <> struct Fmt<GgmlType::Q4_1> { static constexpr int kBytes = 20, kOffset = 0, kQs = 4, kQh = -1; static constexpr bool kMin = true, kWide = false; };
template <> struct Fmt<GgmlType::Q5_0> { static constexpr int kBytes = 22, kOffset = 16, kQs = 6, kQh = 2; static constexpr bool kMin = false, kWide = false; };
template <> struct Fmt<GgmlType::Q5_1> { static constexpr int kBytes = 24, kOffset = 0, kQs = 8, kQh = 4; static constexpr bool kMin = true, kWide = false; };
template <> struct Fmt<GgmlType::Q8_0> { static constexpr int kBytes = 34, kOffset = 0, kQs = 2, kQh = -1; static constexpr bool kMin = false, kWide = true; };

template <GgmlType T> constexpr size_t kQBytes = Fmt<T>::kWide ? 2 * kY : kY;  // quants per block
template <GgmlType T> constexpr size_t kActBlock = kQBytes<T> + kY + (Fmt<T>::kOffset ? kY : 0);
template <GgmlType T> constexpr size_t kPackBlock = kRows * (kQBytes<T> + kY);  // quants + d per row

inline int64_t padded8(int64_t nb) { return (nb + 7) / 8 * 8; }

template <GgmlType T>
size_t act_bytes(int64_t n) {
  const int64_t nb = n / kQK;
  size_t bytes = (size_t)nb * kActBlock<T>;
  if (Fmt<T>::kMin) bytes += (size_t)padded8(nb) * sizeof(float);
  return (bytes + 63) / 64 * 64;
}

template <GgmlType T>
size_t work_bytes(int64_t n) {
  const int64_t nb = n / kQK;
  size_t bytes = (size_t)nb * kPackBlock<T>;
  if (Fmt<T>::kMin) bytes += (size_t)kRows * (size_t)padded8(nb) * sizeof(float);
  return bytes;
}

inline float h2f_fast(uint16_t h) { return _cvtsh_ss(h); }
inline float round_fp16(float f) { return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }
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

inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lane sum by folding halves (i + i+4, + i+2, + i+1); every path reduces with this one function.
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int hsum8_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// Round half to even, as ggml's x86 activation quantizers do (_MM_ROUND_NEAREST).
inline __m256 round_nearest_even(__m256 v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

// ---------------------------------------------------------------- activations

template <GgmlType T>
void prepare_act(const float* x, uint8_t* dst, int64_t n) {
  using F = Fmt<T>;
  const int64_t nb = n / kQK;
  float* s_tail = F::kMin ? (float*)(dst + (size_t)nb * kActBlock<T>) : nullptr;
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    uint8_t* out = dst + (size_t)b * kActBlock<T>;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(x + 8 * k);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v[k]));
    }
    const float m = hmax8(amax);
    const float d = m / 127;
    const __m256 id = _mm256_set1_ps(m != 0.0f ? 127.0f / m : 0.0f);
    __m256i q[4];
    for (int k = 0; k < 4; ++k) q[k] = _mm256_cvttps_epi32(round_nearest_even(_mm256_mul_ps(v[k], id)));
    const int sum = hsum8_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    const __m256i p16a = _mm256_packs_epi32(q[0], q[1]);  // lane-interleaved; permute below restores order
    const __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
    const __m256i q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                   _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    if constexpr (F::kWide) {
      _mm256_store_si256((__m256i*)out, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q8)));
      _mm256_store_si256((__m256i*)(out + kY), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q8, 1)));
    } else {
      _mm256_store_si256((__m256i*)out, q8);
    }
    _mm256_store_ps((float*)(out + kQBytes<T>), _mm256_set1_ps(round_fp16(d)));
    if constexpr (F::kOffset != 0) {
      // Per int32 lane: -offset * (sum of the 4 quants that lane multiplies): exact signed partials.
      const __m256i k_sums = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8((char)F::kOffset), q8),
                                               _mm256_set1_epi16(1));
      _mm256_store_si256((__m256i*)(out + kQBytes<T> + kY), _mm256_sub_epi32(_mm256_setzero_si256(), k_sums));
    }
    if constexpr (F::kMin) s_tail[b] = round_fp16((float)sum * d);  // ggml: fp16(d * sum) with unrounded d
  }
  if constexpr (F::kMin) {
    for (int64_t b = nb; b < padded8(nb); ++b) s_tail[b] = 0.f;
  }
}

// ---------------------------------------------------------------- weights

// 32 bits -> 32 bytes, 0xFF where the bit is set (bit j -> byte j).
inline __m256i bits_to_bytes(uint32_t bits) {
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
  const __m256i bit_of_byte = _mm256_set1_epi64x(0x8040201008040201);
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit_of_byte), bit_of_byte);
}

// One weight block as multiplied: bytes (nibble formats) or int16 pair (Q8_0 -> lo, hi).
struct WeightBlock {
  __m256i lo, hi;  // hi only for Q8_0
  float d, m;
};

template <GgmlType T>
inline WeightBlock load_block(const uint8_t* blk) {
  using F = Fmt<T>;
  WeightBlock w;
  w.d = h2f_fast(load_u16(blk));
  w.m = F::kMin ? h2f_fast(load_u16(blk + 2)) : 0.f;
  if constexpr (F::kWide) {
    const __m256i q = _mm256_loadu_si256((const __m256i*)(blk + F::kQs));
    w.lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
    w.hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
  } else {
    const __m128i v = _mm_loadu_si128((const __m128i*)(blk + F::kQs));
    w.lo = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0F));
    if constexpr (F::kQh >= 0)
      w.lo = _mm256_or_si256(w.lo, _mm256_and_si256(bits_to_bytes(load_u32(blk + F::kQh)), _mm256_set1_epi8(0x10)));
    w.hi = _mm256_setzero_si256();
  }
  return w;
}

// Integer block dot of weights with activation block `ap`, in 8 int32 lanes.
template <GgmlType T>
inline __m256i block_isum(__m256i wlo, __m256i whi, const uint8_t* ap) {
  using F = Fmt<T>;
  if constexpr (F::kWide) {
    return _mm256_add_epi32(_mm256_madd_epi16(wlo, _mm256_load_si256((const __m256i*)ap)),
                            _mm256_madd_epi16(whi, _mm256_load_si256((const __m256i*)(ap + kY))));
  } else {
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wlo, _mm256_load_si256((const __m256i*)ap)),
                                        _mm256_set1_epi16(1));
    if constexpr (F::kOffset != 0) return _mm256_add_epi32(p, _mm256_load_si256((const __m256i*)(ap + kQBytes<T> + kY)));
    return p;
  }
}

// ---------------------------------------------------------------- decode path (one token)

template <GgmlType T, int NR>
__attribute__((always_inline)) inline void gemv_rows(const uint8_t* const* rows, const uint8_t* a, int64_t nb,
                                                     size_t prefetch_distance, float* out) {
  using F = Fmt<T>;
  const float* s = F::kMin ? (const float*)(a + (size_t)nb * kActBlock<T>) : nullptr;
  __m256 acc[NR], macc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = macc[r] = _mm256_setzero_ps();
  for (int64_t c = 0; c < nb; c += 8) {  // chunks of 8 blocks = one m / s vector
    alignas(32) float mbuf[NR][8] = {};
    const int64_t end = c + 8 < nb ? c + 8 : nb;
    for (int64_t b = c; b < end; ++b) {
      const uint8_t* ap = a + (size_t)b * kActBlock<T>;
      const __m256 da = _mm256_load_ps((const float*)(ap + kQBytes<T>));
      for (int r = 0; r < NR; ++r) {
        const uint8_t* blk = rows[r] + (size_t)b * F::kBytes;
        _mm_prefetch((const char*)blk + prefetch_distance, _MM_HINT_T1);
        const WeightBlock w = load_block<T>(blk);
        const __m256i isum = block_isum<T>(w.lo, w.hi, ap);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(_mm256_set1_ps(w.d), da), acc[r]);
        if constexpr (F::kMin) mbuf[r][b - c] = w.m;
      }
    }
    if constexpr (F::kMin) {
      const __m256 sv = _mm256_load_ps(s + c);
      for (int r = 0; r < NR; ++r) macc[r] = _mm256_fmadd_ps(_mm256_load_ps(mbuf[r]), sv, macc[r]);
    }
  }
  for (int r = 0; r < NR; ++r) out[r] = hsum8(F::kMin ? _mm256_add_ps(acc[r], macc[r]) : acc[r]);
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

// Per block: [quants row 0][quants row 1][d row 0 x 8][d row 1 x 8]; then m[row][padded8(nb)].
template <GgmlType T>
void pack_rows(const WeightMatrix& w, int64_t r0, int nr, uint8_t* work) {
  using F = Fmt<T>;
  const int64_t nb = w.n_in / kQK, nbp = padded8(nb);
  for (int r = 0; r < kRows; ++r) {
    const uint8_t* row = r < nr ? w.data + (size_t)(r0 + r) * w.row_stride : nullptr;
    float* m = F::kMin ? (float*)(work + (size_t)nb * kPackBlock<T>) + (size_t)r * nbp : nullptr;
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* out = work + (size_t)b * kPackBlock<T>;
      WeightBlock wb{_mm256_setzero_si256(), _mm256_setzero_si256(), 0.f, 0.f};
      if (row) wb = load_block<T>(row + (size_t)b * F::kBytes);
      uint8_t* q = out + (size_t)r * kQBytes<T>;
      _mm256_store_si256((__m256i*)q, wb.lo);
      if constexpr (F::kWide) _mm256_store_si256((__m256i*)(q + kY), wb.hi);
      _mm256_store_ps((float*)(out + kRows * kQBytes<T> + (size_t)r * kY), _mm256_set1_ps(wb.d));
      if constexpr (F::kMin) m[b] = wb.m;
    }
    if constexpr (F::kMin) {
      for (int64_t b = nb; b < nbp; ++b) m[b] = 0.f;
    }
  }
}

template <GgmlType T, int NT>
inline void tile(const uint8_t* pack, const uint8_t* const* a, int64_t nb, int nr, float* y, int64_t ldy) {
  using F = Fmt<T>;
  __m256 acc[kRows][NT];
  for (int r = 0; r < kRows; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* g = pack + (size_t)b * kPackBlock<T>;
    __m256i wlo[kRows], whi[kRows];
    for (int r = 0; r < kRows; ++r) {
      wlo[r] = _mm256_load_si256((const __m256i*)(g + (size_t)r * kQBytes<T>));
      whi[r] = F::kWide ? _mm256_load_si256((const __m256i*)(g + (size_t)r * kQBytes<T> + kY)) : _mm256_setzero_si256();
    }
    for (int t = 0; t < NT; ++t) {
      const uint8_t* ap = a[t] + (size_t)b * kActBlock<T>;
      const __m256 da = _mm256_load_ps((const float*)(ap + kQBytes<T>));
      for (int r = 0; r < kRows; ++r) {
        const __m256i isum = block_isum<T>(wlo[r], whi[r], ap);
        const __m256 dw = _mm256_load_ps((const float*)(g + kRows * kQBytes<T> + (size_t)r * kY));
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, da), acc[r][t]);
      }
    }
  }
  const int64_t nbp = padded8(nb);
  for (int r = 0; r < nr; ++r) {
    for (int t = 0; t < NT; ++t) {
      __m256 v = acc[r][t];
      if constexpr (F::kMin) {  // sum_b m_b * s_b, 8 blocks at a time as gemv_rows does
        const float* m = (const float*)(pack + (size_t)nb * kPackBlock<T>) + (size_t)r * nbp;
        const float* s = (const float*)(a[t] + (size_t)nb * kActBlock<T>);
        __m256 macc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nbp; b += 8) macc = _mm256_fmadd_ps(_mm256_load_ps(m + b), _mm256_load_ps(s + b), macc);
        v = _mm256_add_ps(v, macc);
      }
      y[t * ldy + r] = hsum8(v);
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
  const int64_t nb = w.n_in / kQK;
  for (int64_t g = r0; g < r1; g += kRows) {
    const int nr = (int)(r1 - g < kRows ? r1 - g : kRows);
    pack_rows<T>(w, g, nr, work);
    for (int64_t t = t0; t < t1; t += kToks) {
      const int nt = (int)(t1 - t < kToks ? t1 - t : kToks);
      const uint8_t* a[kToks];
      for (int i = 0; i < kToks; ++i) a[i] = act + (size_t)(t + (i < nt ? i : 0)) * act_stride;
      float* yt = y + t * ldy + g;
      switch (nt) {
        case 4: tile<T, 4>(work, a, nb, nr, yt, ldy); break;
        case 3: tile<T, 3>(work, a, nb, nr, yt, ldy); break;
        case 2: tile<T, 2>(work, a, nb, nr, yt, ldy); break;
        default: tile<T, 1>(work, a, nb, nr, yt, ldy); break;
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
  k.compute = compute<T>;
  return k;
}

}  // namespace

MatmulKernel avx2_q32_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0: return make_kernel<GgmlType::Q4_0>();
    case GgmlType::Q4_1: return make_kernel<GgmlType::Q4_1>();
    case GgmlType::Q5_0: return make_kernel<GgmlType::Q5_0>();
    case GgmlType::Q5_1: return make_kernel<GgmlType::Q5_1>();
    case GgmlType::Q8_0: return make_kernel<GgmlType::Q8_0>();
    default: return {};
  }
}

}  // namespace kvzap::kernels
