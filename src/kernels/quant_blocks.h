// ggml quantization block structs (byte-exact with GGUF data) and the scalar helpers shared by every
// kernel file. Layouts: ggml's block_* structs (ggml-common.h). Scales are IEEE fp16 unless noted.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/fp16.h"
#include "kernels/ggml_type.h"

namespace kvzap::kernels {

constexpr int kQK = 32;    // elements per block of the 32-wide formats
constexpr int kQKK = 256;  // elements per super-block of the K formats
constexpr int kKScaleBytes = 12;

struct BlockQ4_0 { uint16_t d; uint8_t qs[kQK / 2]; };
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[kQK / 2]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[kQK / 2]; };
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[kQK / 2]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[kQK]; };
struct BlockQ8_1 { uint16_t d, s; int8_t qs[kQK]; };  // s = d * sum(qs), activations only
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[kKScaleBytes]; uint8_t qs[kQKK / 2]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[kKScaleBytes]; uint8_t qh[kQKK / 8]; uint8_t qs[kQKK / 2]; };
struct BlockQ6_K { uint8_t ql[kQKK / 2]; uint8_t qh[kQKK / 4]; int8_t scales[kQKK / 16]; uint16_t d; };
struct BlockQ8_K { float d; int8_t qs[kQKK]; int16_t bsums[kQKK / 16]; };  // activations only

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

// The helpers below are `static inline` on purpose: they are compiled into the ISA-specific files too,
// and internal linkage keeps the linker from sharing an AVX-512-compiled copy with baseline code.

// Block geometry known to the kernels themselves (independent of the GGUF reader's tables).
struct TypeGeometry {
  int block_elems;  // elements per block (1 for float types)
  int block_bytes;
};
static inline TypeGeometry geometry(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return {1, 4};
    case GgmlType::F16: return {1, 2};
    case GgmlType::BF16: return {1, 2};
    case GgmlType::Q4_0: return {kQK, sizeof(BlockQ4_0)};
    case GgmlType::Q4_1: return {kQK, sizeof(BlockQ4_1)};
    case GgmlType::Q5_0: return {kQK, sizeof(BlockQ5_0)};
    case GgmlType::Q5_1: return {kQK, sizeof(BlockQ5_1)};
    case GgmlType::Q8_0: return {kQK, sizeof(BlockQ8_0)};
    case GgmlType::Q8_1: return {kQK, sizeof(BlockQ8_1)};
    case GgmlType::Q4_K: return {kQKK, sizeof(BlockQ4_K)};
    case GgmlType::Q5_K: return {kQKK, sizeof(BlockQ5_K)};
    case GgmlType::Q6_K: return {kQKK, sizeof(BlockQ6_K)};
    case GgmlType::Q8_K: return {kQKK, sizeof(BlockQ8_K)};
    default: return {0, 0};
  }
}
static inline size_t kernel_row_bytes(GgmlType t, int64_t n) {
  const TypeGeometry g = geometry(t);
  return g.block_elems ? (size_t)(n / g.block_elems) * (size_t)g.block_bytes : 0;
}

// The activation format each weight type is multiplied with (ggml's vec_dot_type).
static inline GgmlType partner_type(GgmlType w) {
  switch (w) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: return GgmlType::Q8_0;
    case GgmlType::Q4_1: case GgmlType::Q5_1: return GgmlType::Q8_1;
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: return GgmlType::Q8_K;
    case GgmlType::F16: return GgmlType::F16;    // activations rounded to f16
    case GgmlType::BF16: return GgmlType::BF16;  // activations rounded to bf16
    default: return GgmlType::F32;  // F32 weights take float activations as they are
  }
}

static inline float h2f(uint16_t h) { return fp16_to_fp32(h); }
static inline uint16_t f2h(float f) { return fp32_to_fp16(f); }

// Q4_K / Q5_K: 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
static inline void k_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// ggml's nearest_int: round half to even through the 1.5*2^23 trick (valid for |x| < 2^22).
static inline int nearest_int(float fval) {
  float val = fval + 12582912.f;
  int i;
  std::memcpy(&i, &val, 4);
  return (i & 0x007fffff) - 0x00400000;
}

}  // namespace kvzap::kernels
