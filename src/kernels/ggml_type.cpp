// The tensor element types (ggml's numbering, as GGUF files store them): names, block geometry and which
// ones the kernels implement.
#include "kernels/ggml_type.h"

namespace kvzap {

namespace {

struct TypeTraits {
  GgmlType type;
  const char* name;
  int64_t block_size;
  int64_t block_bytes;
  bool supported;
};

constexpr TypeTraits kTypes[] = {
    {GgmlType::F32, "F32", 1, 4, true},        {GgmlType::F16, "F16", 1, 2, true},
    {GgmlType::BF16, "BF16", 1, 2, true},      {GgmlType::Q4_0, "Q4_0", 32, 18, true},
    {GgmlType::Q4_1, "Q4_1", 32, 20, true},    {GgmlType::Q5_0, "Q5_0", 32, 22, true},
    {GgmlType::Q5_1, "Q5_1", 32, 24, true},    {GgmlType::Q8_0, "Q8_0", 32, 34, true},
    {GgmlType::Q8_1, "Q8_1", 32, 36, false},   {GgmlType::Q2_K, "Q2_K", 256, 84, false},
    {GgmlType::Q3_K, "Q3_K", 256, 110, false}, {GgmlType::Q4_K, "Q4_K", 256, 144, true},
    {GgmlType::Q5_K, "Q5_K", 256, 176, true},  {GgmlType::Q6_K, "Q6_K", 256, 210, true},
    {GgmlType::Q8_K, "Q8_K", 256, 292, false},
};

const TypeTraits* traits(GgmlType t) {
  for (const auto& tt : kTypes)
    if (tt.type == t) return &tt;
  return nullptr;
}

}  // namespace

bool is_known_type(GgmlType t) { return traits(t) != nullptr; }
const char* type_name(GgmlType t) {
  const TypeTraits* tt = traits(t);
  return tt ? tt->name : "unknown";
}
bool is_supported_type(GgmlType t) {
  const TypeTraits* tt = traits(t);
  return tt && tt->supported;
}
int64_t type_block_size(GgmlType t) {
  const TypeTraits* tt = traits(t);
  return tt ? tt->block_size : 0;
}
int64_t type_block_bytes(GgmlType t) {
  const TypeTraits* tt = traits(t);
  return tt ? tt->block_bytes : 0;
}

}  // namespace kvzap
