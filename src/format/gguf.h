// GGUF v3 reader: validates the whole header, then maps the file read-only (zero-copy tensor views).
// Every problem throws kvzap::Error("<path>: <problem>") — never a crash on a corrupt file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "kernels/ggml_type.h"  // the tensor types a GGUF file names
#include "kvzap/error.h"

namespace kvzap {

namespace gguf {

// GGUF metadata value type ids.
enum ValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
const char* value_type_name(uint32_t type);  // "u32", "string", "array", ... ("?" when unknown)

struct Value;
using Array = std::vector<Value>;
// Scalars are widened: all integer types -> int64_t (u64 values above INT64_MAX are rejected), floats -> double.
struct Value {
  uint32_t type = 0;  // original GGUF value type id (0..12)
  std::variant<int64_t, double, bool, std::string, std::shared_ptr<Array>> v;
  uint32_t array_type = 0;  // element type id when type == kArray (kept for empty arrays)
};

struct TensorInfo {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;  // ggml order: ne[0] = contiguous row length
  uint64_t offset = 0;      // relative to the data section
  const uint8_t* data = nullptr;
  size_t n_bytes = 0;
  int64_t n_elements() const;
};

class File {
 public:
  // Opens, validates and mmaps. Throws kvzap::Error naming the file and the problem.
  static std::unique_ptr<File> open(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  size_t file_size() const { return size_; }
  size_t alignment() const { return alignment_; }

  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }
  // Typed getters: throw "<path>: missing metadata key 'k'" / "... has wrong type" when absent or mistyped.
  int64_t get_int(const std::string& key) const;  // any integer type
  std::optional<int64_t> get_int_opt(const std::string& key) const;
  double get_float(const std::string& key) const;  // f32/f64 (or integer)
  std::optional<double> get_float_opt(const std::string& key) const;
  bool get_bool_opt(const std::string& key, bool dflt) const;
  std::string get_string(const std::string& key) const;
  std::optional<std::string> get_string_opt(const std::string& key) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;  // also accepts a scalar -> {x}
  std::vector<double> get_float_array(const std::string& key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(const std::string& name) const;
  // Throws "<path>: missing tensor 'name'" / "tensor 'name' has shape [..], expected [..]".
  const TensorInfo& tensor(const std::string& name, const std::vector<int64_t>& expected_ne) const;

  std::string value_to_string(const Value& v, size_t max_array_items = 8) const;

 private:
  File() = default;
  std::string path_;
  uint32_t version_ = 0;
  size_t size_ = 0;
  size_t alignment_ = 32;
  void* map_ = nullptr;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
  friend class Parser;
};

}  // namespace gguf
}  // namespace kvzap
