// Scalar reference for every supported type: dequantize, ggml's reference quantizers, the activation
// quantizers (Q8_0 / Q8_1 / Q8_K, bit-exact with ggml's *_ref functions) and scalar vec-dots.
// The SIMD kernels are tested against these.
#pragma once
#include <cstdint>

#include "kernels/quant_blocks.h"

namespace kvzap::kernels {

// n must be a multiple of the type's block size (unchecked here; the public wrappers check).
void dequantize_row_ref(GgmlType type, const void* src, float* dst, int64_t n);
void quantize_row_ref(GgmlType type, const float* src, void* dst, int64_t n);

// Activation partners as ggml's x86 quantizers (what llama.cpp runs here): d = amax / 127,
// q = round-half-even(x * (127 / amax)) (Q8_0, Q8_1); Q8_K as ggml (see .cpp).
void quantize_q8_0_ref(const float* x, BlockQ8_0* y, int64_t n);
void quantize_q8_1_ref(const float* x, BlockQ8_1* y, int64_t n);
void quantize_q8_K_ref(const float* x, BlockQ8_K* y, int64_t n);

// Quantizes x into the partner format of weight type w. Float weights take n floats: F32 a plain copy of
// x, F16 / BF16 x rounded to f16 / bf16 (ggml's vec_dot_type) and kept as f32 values.
void quantize_activation_ref(GgmlType w, const float* x, void* dst, int64_t n);

// Dot of one weight row (GGUF blocks of type w) with one activation row in the partner format,
// accumulating blocks in order in float, like ggml's scalar vec_dot. Float weights: 16 f32 lanes in the
// order the SIMD kernels use (see quant_ref.cpp), so those match it bit for bit.
float vec_dot_ref(GgmlType w, const void* w_row, const void* act_row, int64_t n);

}  // namespace kvzap::kernels
