// `.kvzd` dataset reader (the training pairs `kvzap collect` writes and `kvzap train` reads): header,
// shape, record count, every accessor on the first records; then the resumable writer's open_append
// (which cuts a partial last record) on the same bytes, and a re-read that must agree with it.
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "fuzz_common.h"
#include "kvzap/error.h"
#include "train/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvzap;
  const std::string path = fuzz::write_file("input.kvzd", data, size);
  DatasetShape shape;
  int64_t n = 0;
  try {
    Dataset d = Dataset::open(path);
    shape = d.shape();
    n = d.size();
    const int64_t m = std::min<int64_t>(n, 8);
    std::vector<float> x((size_t)shape.d_model * (size_t)m), y((size_t)shape.n_heads * (size_t)m);
    float acc = 0;
    for (int64_t i = 0; i < m; ++i) {
      acc += (float)d.group(i) + (float)d.position(i);
      for (int l = 0; l < shape.n_layers; ++l) acc += d.y(i, l, shape.n_heads - 1);
      for (int l = 0; l < shape.n_layers && l < 4; ++l) d.x_row(i, l, x.data());
    }
    std::vector<int64_t> idx((size_t)m);
    std::iota(idx.begin(), idx.end(), 0);
    d.gather(shape.n_layers - 1, idx.data(), m, x.data(), y.data());
    d.gather_range(0, 0, m, x.data(), y.data());
    const Dataset sub = d.subset(idx);
    if (sub.size() != m) __builtin_trap();
    volatile float sink = acc;
    (void)sink;
  } catch (const Error&) {
    return 0;
  }
  // The file read as valid: the appender must accept it, keep exactly its whole records, and a
  // record appended after them must read back.
  try {
    {
      DatasetWriter w = DatasetWriter::open_append(path, shape);
      if (w.size() != n) __builtin_trap();
      std::vector<float> x((size_t)shape.n_layers * shape.d_model, 0.5f), y((size_t)shape.n_layers * shape.n_heads, -1.f);
      if (x.size() <= (1u << 16) && y.size() <= (1u << 16)) w.append(7, 9, x.data(), y.data());
      w.flush();
    }
    Dataset again = Dataset::open(path);
    if (again.size() < n || again.size() > n + 1) __builtin_trap();
    if (again.size() == n + 1 && (again.group(n) != 7 || again.position(n) != 9)) __builtin_trap();
  } catch (const Error&) {
  }
  return 0;
}
