// Surrogate folder loader (kvpress format: config.json + model.safetensors). The input is
// config.json, the separator line "--8<--", then model.safetensors. A loaded surrogate also predicts
// one token through every layer.
#include <cstdint>
#include <filesystem>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "kvzap/error.h"
#include "press/surrogate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvzap;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  const std::string_view config = fuzz::next_part(rest);
  const std::filesystem::path dir = fuzz::scratch_dir() / "surrogate";
  std::filesystem::create_directories(dir);
  fuzz::write_file("surrogate/config.json", config);
  fuzz::write_file("surrogate/model.safetensors", rest);
  try {
    const auto s = Surrogate::load(dir.string());
    std::vector<float> h((size_t)s->input_dim(), 0.25f), out((size_t)s->output_dim());
    std::vector<float> scratch((size_t)s->scratch_floats(1));
    for (int l = 0; l < s->n_layers() && l < 64; ++l) s->predict(l, h.data(), 1, out.data(), scratch.data());
    (void)s->n_params();
  } catch (const Error&) {
  }
  return 0;
}
