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

// TT rows of A (tokens) against NB rows of Bt (outputs, NB <= 4): one 16-lane accumulator per (token,
// output), k in order, then the shared fold. A token's sum never depends on which other tokens share
// its tile, so predict() over any chunking gives identical bits. TT = 4, NB = 4 keeps 16 accumulators,
// NB vectors of Bt and one of A in registers; every vector of Bt loaded once serves four tokens.
template <int TT, int NB>
inline void dots_tile(const float* A, int64_t lda, const float* const* b, int64_t n, float* C, int64_t ldc) {
  __m512 acc[TT][NB];
#pragma GCC unroll 4
  for (int t = 0; t < TT; ++t)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) acc[t][j] = _mm512_setzero_ps();
  auto step = [&](int64_t k, __mmask16 m) {
    __m512 bv[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) bv[j] = _mm512_maskz_loadu_ps(m, b[j] + k);
#pragma GCC unroll 4
    for (int t = 0; t < TT; ++t) {
      const __m512 av = _mm512_maskz_loadu_ps(m, A + t * lda + k);
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[t][j] = _mm512_fmadd_ps(av, bv[j], acc[t][j]);
    }
  };
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) step(k, (__mmask16)0xFFFF);
  if (k < n) step(k, (__mmask16)((1u << (n - k)) - 1));
  __m512 v[16];
  for (int i = 0; i < 16; ++i) v[i] = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int t = 0; t < TT; ++t)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) v[4 * t + j] = acc[t][j];
  alignas(64) float sums[16];  // lane 4 * j + t: token t, output j
  _mm512_store_ps(sums, kernels::reduce16(v));
  for (int t = 0; t < TT; ++t)
    for (int j = 0; j < NB; ++j) C[t * ldc + j] += sums[4 * j + t];
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
// vector of a row of A is loaded once for up to 4 outputs, every vector of Bt once for 4 tokens.
void gemm_nt_acc(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* Bt, int64_t ldb, float* C,
                 int64_t ldc) {
  for (int64_t j = 0; j < N; j += 4) {
    const int nb = (int)(N - j < 4 ? N - j : 4);
    const float* b[4];
    for (int q = 0; q < 4; ++q) b[q] = Bt + (j + (q < nb ? q : nb - 1)) * ldb;
    int64_t i = 0;
    for (; i + 4 <= M; i += 4) dots_rows<4>(A + i * lda, lda, b, nb, K, C + i * ldc + j, ldc);
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
