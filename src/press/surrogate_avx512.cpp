// AVX-512 float kernels of surrogate inference. gemm_nn_acc: the MLP's first layer, C[M][N] += A[M][K] · B[K][N] (B = W1^T, N = the
// hidden width, 72 for SmolLM2 and 112 for Qwen2.5-0.5B: not always a multiple of 16, so the last vector
// of a row is masked). Register tiles of 4 rows x up to 5 vectors; k runs in order for every element, with
// one FMA per (element, k) as the AVX2 path does. Chosen by Surrogate::predict when active_isa() is AVX-512.
#include <immintrin.h>

#include <cstdint>

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

template <int NB>
inline void dots(const float* a, const float* const* b, int64_t n, float* out) {
  __m512 s0[NB], s1[NB];
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) s0[j] = s1[j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= n; k += 32) {
    const __m512 a0 = _mm512_loadu_ps(a + k), a1 = _mm512_loadu_ps(a + k + 16);
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      s0[j] = _mm512_fmadd_ps(a0, _mm512_loadu_ps(b[j] + k), s0[j]);
      s1[j] = _mm512_fmadd_ps(a1, _mm512_loadu_ps(b[j] + k + 16), s1[j]);
    }
  }
  const __mmask16 m0 = (__mmask16)(n - k >= 16 ? 0xFFFF : (1u << (n - k)) - 1);
  const __mmask16 m1 = (__mmask16)(n - k - 16 <= 0 ? 0 : (1u << (n - k - 16)) - 1);
  const __m512 a0 = _mm512_maskz_loadu_ps(m0, a + k), a1 = _mm512_maskz_loadu_ps(m1, a + k + 16);
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) {
    s0[j] = _mm512_fmadd_ps(a0, _mm512_maskz_loadu_ps(m0, b[j] + k), s0[j]);
    s1[j] = _mm512_fmadd_ps(a1, _mm512_maskz_loadu_ps(m1, b[j] + k + 16), s1[j]);
    out[j] = _mm512_reduce_add_ps(_mm512_add_ps(s0[j], s1[j]));
  }
}

}  // namespace

// C[M][N] += A[M][K] · Bt[N][K]^T for few outputs N (the linear scorer, the MLP's output layer): every
// vector of a row of A is loaded once for up to 4 outputs.
void gemm_nt_acc(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* Bt, int64_t ldb, float* C,
                 int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    const float* a = A + i * lda;
    for (int64_t j = 0; j < N; j += 4) {
      const int nb = (int)(N - j < 4 ? N - j : 4);
      const float* b[4];
      float d[4];
      for (int q = 0; q < 4; ++q) b[q] = Bt + (j + (q < nb ? q : nb - 1)) * ldb;
      switch (nb) {
        case 4: dots<4>(a, b, K, d); break;
        case 3: dots<3>(a, b, K, d); break;
        case 2: dots<2>(a, b, K, d); break;
        default: dots<1>(a, b, K, d); break;
      }
      for (int q = 0; q < nb; ++q) C[i * ldc + j + q] += d[q];
    }
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
