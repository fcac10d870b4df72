// AVX-512 float kernels of surrogate inference. gemm_nn_acc: the MLP's first layer, C[M][N] += A[M][K] · B[K][N] (B = W1^T, N = the
// hidden width, 72 for SmolLM2 and 112 for Qwen2.5-0.5B: not always a multiple of 16, so the last vector
// of a row is masked). Register tiles of 4 rows x up to 5 vectors; k runs in order for every element, with
// one FMA per (element, k) as the AVX2 path does. Chosen by Surrogate::predict when active_isa() is AVX-512.
#include <immintrin.h>

#include <cstdint>

#include "kernels/avx512_reduce.h"

// GCC 12 reports _mm512_shuffle_f32x4's internal _mm512_undefined_ps() as uninitialised once the fold is
// inlined into dots_tile; every lane of the result is defined.
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace kvzap::dense::avx512 {

namespace {

template <int MR, int NV>
inline void tile(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                 __mmask16 last) {
  // Fully unrolled so the MR * NV accumulators stay in registers (GCC spills them otherwise).
  __m512 c[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) c[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512 b[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV - 1; ++j) b[j] = _mm512_loadu_ps(B + k * ldb + 16 * j);
    b[NV - 1] = _mm512_maskz_loadu_ps(last, B + k * ldb + 16 * (NV - 1));
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(A[i * lda + k]);
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) c[i][j] = _mm512_fmadd_ps(a, b[j], c[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      float* dst = C + i * ldc + 16 * j;
      const __mmask16 m = j + 1 < NV ? (__mmask16)0xFFFF : last;
      _mm512_mask_storeu_ps(dst, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst), c[i][j]));
    }
}

template <int MR>
inline void row_block(int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                      int64_t ldc) {
  for (int64_t j = 0; j < N; j += 5 * 16) {
    const int64_t cols = N - j < 5 * 16 ? N - j : 5 * 16;
    const int nv = (int)((cols + 15) / 16);
    const __mmask16 last = (__mmask16)(cols % 16 ? (1u << (cols % 16)) - 1 : 0xFFFF);
    switch (nv) {
      case 5: tile<MR, 5>(K, A, lda, B + j, ldb, C + j, ldc, last); break;
      case 4: tile<MR, 4>(K, A, lda, B + j, ldb, C + j, ldc, last); break;
      case 3: tile<MR, 3>(K, A, lda, B + j, ldb, C + j, ldc, last); break;
      case 2: tile<MR, 2>(K, A, lda, B + j, ldb, C + j, ldc, last); break;
      default: tile<MR, 1>(K, A, lda, B + j, ldb, C + j, ldc, last); break;
    }
  }
}

// TT rows of A (tokens) against NB rows of Bt (outputs, NB <= 4). Per (token, output) two 16-lane
// accumulators, for the even and the odd 16-element blocks of k (two FMA chains per output, so one
// token alone is not latency-bound: the linear scorer runs one row at a time next to the norm), then
// their sum folded by the shared reduction. A token's bits never depend on which other tokens share its
// tile, so predict() over any chunking, and the one-row read-out, agree exactly. TT = 2, NB = 4 keeps 16
// accumulators, 2 NB vectors of Bt and one of A in registers.
template <int TT, int NB>
inline void dots_tile(const float* A, int64_t lda, const float* const* b, int64_t n, float* C, int64_t ldc) {
  __m512 s0[TT][NB], s1[TT][NB];
#pragma GCC unroll 4
  for (int t = 0; t < TT; ++t)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) s0[t][j] = s1[t][j] = _mm512_setzero_ps();
  auto step = [&](int64_t k, __mmask16 m0, __mmask16 m1) {
    __m512 b0[NB], b1[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      b0[j] = _mm512_maskz_loadu_ps(m0, b[j] + k);
      b1[j] = _mm512_maskz_loadu_ps(m1, b[j] + k + 16);
    }
#pragma GCC unroll 4
    for (int t = 0; t < TT; ++t) {
      const __m512 a0 = _mm512_maskz_loadu_ps(m0, A + t * lda + k), a1 = _mm512_maskz_loadu_ps(m1, A + t * lda + k + 16);
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        s0[t][j] = _mm512_fmadd_ps(a0, b0[j], s0[t][j]);
        s1[t][j] = _mm512_fmadd_ps(a1, b1[j], s1[t][j]);
      }
    }
  };
  int64_t k = 0;
  for (; k + 32 <= n; k += 32) step(k, (__mmask16)0xFFFF, (__mmask16)0xFFFF);
  if (k < n) {
    const int64_t r = n - k;
    step(k, (__mmask16)(r >= 16 ? 0xFFFF : (1u << r) - 1), (__mmask16)(r <= 16 ? 0 : (1u << (r - 16)) - 1));
  }
  const __m512 z = _mm512_setzero_ps();
  alignas(64) float sums[16];  // lane j: output j of the token
#pragma GCC unroll 4
  for (int t = 0; t < TT; ++t) {
    __m512 v[4] = {z, z, z, z};
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) v[j] = _mm512_add_ps(s0[t][j], s1[t][j]);
    _mm512_store_ps(sums, kernels::reduce4(v[0], v[1], v[2], v[3]));
    for (int j = 0; j < NB; ++j) C[t * ldc + j] += sums[j];
  }
}

template <int TT>
inline void dots_rows(const float* A, int64_t lda, const float* const* b, int nb, int64_t n, float* C, int64_t ldc) {
  switch (nb) {
    case 4: dots_tile<TT, 4>(A, lda, b, n, C, ldc); break;
    case 3: dots_tile<TT, 3>(A, lda, b, n, C, ldc); break;
    case 2: dots_tile<TT, 2>(A, lda, b, n, C, ldc); break;
    default: dots_tile<TT, 1>(A, lda, b, n, C, ldc); break;
  }
}

}  // namespace

// C[M][N] += A[M][K] · Bt[N][K]^T for few outputs N (the linear scorer, the MLP's output layer): every
// vector of a row of A is loaded once for up to 4 outputs, every vector of Bt once for 2 tokens.
void gemm_nt_acc(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* Bt, int64_t ldb, float* C,
                 int64_t ldc) {
  for (int64_t j = 0; j < N; j += 4) {
    const int nb = (int)(N - j < 4 ? N - j : 4);
    const float* b[4];
    for (int q = 0; q < 4; ++q) b[q] = Bt + (j + (q < nb ? q : nb - 1)) * ldb;
    int64_t i = 0;
    for (; i + 2 <= M; i += 2) dots_rows<2>(A + i * lda, lda, b, nb, K, C + i * ldc + j, ldc);
    for (; i < M; ++i) dots_rows<1>(A + i * lda, lda, b, nb, K, C + i * ldc + j, ldc);
  }
}

// C += A · B (accumulate into C, which holds the bias).
void gemm_nn_acc(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                 int64_t ldc) {
  int64_t i = 0;
  for (; i + 4 <= M; i += 4) row_block<4>(N, K, A + i * lda, lda, B, ldb, C + i * ldc, ldc);
  for (; i < M; ++i) row_block<1>(N, K, A + i * lda, lda, B, ldb, C + i * ldc, ldc);
}

}  // namespace kvzap::dense::avx512
