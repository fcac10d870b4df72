// Quantized weight x float activation products, the engine's only heavy kernel family.
// Weights stay in their GGUF block format; activations are quantized once per call to the weight
// type's partner (Q8_0 / Q8_1 / Q8_K, as ggml does; F16 / BF16 weights: activations rounded to f16 /
// bf16, as ggml's vec_dot_type) and reused for every weight row.
// Layout: W is n_out rows of n_in values (ggml ne = [n_in, n_out]); x is [n_tok][n_in] row-major;
// y is [n_tok][n_out] row-major: y[t][o] = sum_i W[o][i] * x[t][i].
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/ggml_type.h"
#include "kernels/thread_pool.h"

namespace kvzap {

struct WeightMatrix {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  int64_t n_in = 0;   // row length
  int64_t n_out = 0;  // number of rows
  size_t row_stride = 0;  // bytes per row
};

// Scratch for quantized activations; sized once (reserve) so the hot path never allocates.
// The prepared-activation format is private to the kernels (ggml Q8 blocks or a SIMD-friendly
// interleave of the same quantized values); matmul() grows the buffers if reserve() was too small.
struct MatmulScratch {
  std::vector<uint8_t> act;   // prepared activations [n_tok][kernel row bytes] (+64 for alignment)
  std::vector<uint8_t> work;  // per-thread workspace (repacked weight rows) [n_threads][bytes]
  // max_threads 0 = ThreadPool::default_threads().
  void reserve(int64_t max_tokens, int64_t max_n_in, int max_threads = 0);
};

enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2 };
Isa detected_isa();            // best the CPU supports
Isa active_isa();              // currently selected (default: detected; env KVZAP_ISA=scalar|avx2|avx512 overrides)
void set_active_isa(Isa isa);  // for tests; clamps to detected
const char* isa_name(Isa isa);

// y = x W^T, threaded over output rows (and tokens for large batches).
void matmul(const WeightMatrix& w, const float* x, int64_t n_tok, float* y, ThreadPool& pool,
            MatmulScratch& scratch);
// y_m = x W_m^T for matrices sharing the input (q/k/v, gate/up): the activations are prepared once and
// every matrix's rows go to the threads in one job (one barrier, not one per matrix). Results are the
// same as separate matmul calls; matrices of different types or row lengths run one after the other.
void matmul_group(const WeightMatrix* const* ws, float* const* ys, int n_mats, const float* x, int64_t n_tok,
                  ThreadPool& pool, MatmulScratch& scratch);
// Scalar reference: dequantize each weight row to float and accumulate in double.
void matmul_reference(const WeightMatrix& w, const float* x, int64_t n_tok, float* y);

// Rows -> float (embedding lookup, tests). n must be a multiple of the block size.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);
// Float -> blocks (tests and training export); reference quantizers as ggml defines them.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

// Small vector helpers used by attention over f16 KV pages (dispatched by ISA).
float dot_f32_f16(const float* a, const uint16_t* b, int64_t n);
void axpy_f16(float alpha, const uint16_t* x, float* y, int64_t n);  // y += alpha * x
void f32_to_f16_row(const float* src, uint16_t* dst, int64_t n);
float dot_f32(const float* a, const float* b, int64_t n);

}  // namespace kvzap
