// Tensor element types, owned by the kernels that implement them (formats read them from files).
#pragma once

#include <cstdint>

namespace kvzap {

// ggml's type ids, as GGUF stores them (ggml docs/gguf.md). Only the ones is_supported_type() lists can be
// loaded.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, BF16 = 30,
};
const char* type_name(GgmlType t);
bool is_known_type(GgmlType t);      // one of the ids above (a file may name others)
bool is_supported_type(GgmlType t);  // F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K
int64_t type_block_size(GgmlType t);   // elements per block (1 for float types)
int64_t type_block_bytes(GgmlType t);  // bytes per block
inline int64_t row_bytes(GgmlType t, int64_t n) { return n / type_block_size(t) * type_block_bytes(t); }

}  // namespace kvzap
