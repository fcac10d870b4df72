// What each ISA file (scalar in matmul.cpp, *_avx2.cpp, *_avx512.cpp) provides to the dispatcher.
// A weight type's kernel owns its activation format: prepare_act turns one float row into that format
// (act_row_bytes long), compute multiplies a block of weight rows by a block of prepared rows.
// Every output element is computed by the same instruction sequence whatever the block bounds, so
// results do not depend on how work is split across threads (nor on n_tok).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/matmul.h"

namespace kvzap::kernels {

struct MatmulKernel {
  // Bytes of one prepared activation row of n_in values (0: activations are used as float, unprepared).
  size_t (*act_row_bytes)(int64_t n_in) = nullptr;
  void (*prepare_act)(const float* x, uint8_t* dst, int64_t n_in) = nullptr;
  // Per-thread workspace compute needs (repacked weight rows), 0 if none; at most max_work_bytes.
  size_t (*work_bytes)(int64_t n_in) = nullptr;
  // y[t * ldy + r] for r in [r0, r1), t in [t0, t1); act row t starts at act + t * act_stride.
  // work: this thread's workspace (64-byte aligned) or nullptr when work_bytes is null.
  void (*compute)(const WeightMatrix& w, const uint8_t* act, size_t act_stride, int64_t r0, int64_t r1,
                  int64_t t0, int64_t t1, float* y, int64_t ldy, uint8_t* work) = nullptr;
  // Tokens per work item on the prefill path (0: the dispatcher's default); a kernel whose per-item
  // weight packing costs more than its activations take in L2 asks for more.
  int64_t token_block = 0;
  explicit operator bool() const { return compute != nullptr; }
};

struct VectorKernels {
  float (*dot_f32)(const float* a, const float* b, int64_t n);
  float (*dot_f32_f16)(const float* a, const uint16_t* b, int64_t n);
  void (*axpy_f16)(float alpha, const uint16_t* x, float* y, int64_t n);
  void (*f32_to_f16_row)(const float* src, uint16_t* dst, int64_t n);
};

// Upper bounds on act_row_bytes / work_bytes for any kernel, so scratch can be reserved without
// knowing the type. Prepared rows start 64-byte aligned when act_row_bytes is a multiple of 64.
static inline size_t max_act_row_bytes(int64_t n_in) { return (size_t)n_in * 4 + 256; }
static inline size_t max_work_bytes(int64_t n_in) { return (size_t)n_in * 20 + 1024; }

// Each returns an empty kernel for types it does not handle (the dispatcher then falls back).
MatmulKernel scalar_kernel(GgmlType type);
MatmulKernel avx2_kernel(GgmlType type);
MatmulKernel avx512_kernel(GgmlType type);
MatmulKernel avx512_k_kernel(GgmlType type);  // Q4_K Q5_K Q6_K (gemm_k_avx512.cpp)
MatmulKernel avx2_q32_kernel(GgmlType type);  // Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 (gemm_q32_avx2.cpp)
// F32 F16 BF16 (gemm_float_avx512.cpp: BF16 only with AVX-512 BF16; gemm_float_avx2.cpp)
MatmulKernel avx512_float_kernel(GgmlType type);
MatmulKernel avx2_float_kernel(GgmlType type);
const VectorKernels& scalar_vector_kernels();
const VectorKernels& avx2_vector_kernels();
const VectorKernels& avx512_vector_kernels();

}  // namespace kvzap::kernels
