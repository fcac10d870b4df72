// Safetensors reader: header JSON, dtypes, shapes, offsets; every tensor view is read and converted.
#include <cstdint>

#include "format/safetensors.h"
#include "fuzz_common.h"
#include "kvzap/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvzap;
  const std::string path = fuzz::write_file("input.safetensors", data, size);
  try {
    const auto st = SafetensorsFile::open(path);
    (void)st->metadata().dump();
    for (const SafetensorsFile::Tensor& t : st->tensors()) {
      if (st->find(t.name) != &t) __builtin_trap();
      (void)t.n_elements();
      try {
        const std::vector<float> v = st->to_f32(t);
        if (v.size() != (size_t)t.n_elements()) __builtin_trap();
      } catch (const Error&) {
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
