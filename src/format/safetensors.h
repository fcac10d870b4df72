// Safetensors reader (validated header, read-only mmap, zero-copy tensor views) and a small writer.
// Layout: u64 N (little-endian), N bytes of JSON header, then the data buffer. Every problem with a file
// throws kvzap::Error("<path>: <problem>").
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvzap/error.h"

namespace kvzap {

// Bytes per element for a safetensors dtype string ("F32", "BF16", ...); 0 when unknown.
size_t safetensors_dtype_size(const std::string& dtype);

class SafetensorsFile {
 public:
  struct Tensor {
    std::string name;
    std::string dtype;           // F32, BF16, F16, F64, I64, I32, I16, I8, U8, BOOL, ...
    std::vector<int64_t> shape;  // outermost first (row-major), the reverse of GGUF ne
    const uint8_t* data = nullptr;  // only byte-aligned: read with memcpy / unaligned loads
    size_t n_bytes = 0;
    int64_t n_elements() const;
  };

  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }  // sorted by name
  const Tensor* find(const std::string& name) const;
  const Tensor& tensor(const std::string& name) const;  // throws "<path>: missing tensor 'name'"
  // Converts any float or integer dtype to f32 (row-major); throws for F8 and unknown dtypes.
  std::vector<float> to_f32(const Tensor& t) const;
  // The "__metadata__" string map (an empty object when absent).
  const nlohmann::json& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  [[noreturn]] void fail(const std::string& problem) const;
  void parse(const uint8_t* base, size_t size);

  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t> index_;
  nlohmann::json metadata_ = nlohmann::json::object();
};

struct TensorToWrite {
  std::string name;
  std::string dtype = "F32";   // "F32" or "BF16" (values are rounded to nearest even)
  std::vector<int64_t> shape;  // outermost first
  std::vector<float> values;   // prod(shape) values, row-major
};

// Writes a safetensors file (through a temporary file and a rename). The JSON header is padded with
// spaces to a multiple of 8 bytes; tensors are stored in the given order.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace kvzap
