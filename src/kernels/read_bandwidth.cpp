#include "kernels/read_bandwidth.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "kernels/thread_pool.h"

namespace kvzap {
namespace {

// 16 independent accumulators: the loop is bound by loads, not by the add latency, and GCC vectorises
// it at -O2 (each accumulator is its own lane, so no reassociation is needed).
double sum_slice(const float* x, size_t n) {
  float acc[16] = {0};
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; k++) acc[k] += x[i + k];
  double s = 0;
  for (; i < n; i++) s += x[i];
  for (float a : acc) s += a;
  return s;
}

}  // namespace

double sum_reference(const float* x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += x[i];
  return s;
}

ReadBandwidth measure_read_bandwidth(ThreadPool& pool, size_t bytes, int passes) {
  const size_t n = std::max<size_t>(bytes / sizeof(float), 16);
  std::unique_ptr<float[]> buf(new float[n]);
  for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 7);  // touched once: no page faults while timing
  const int T = pool.size();
  std::vector<double> part((size_t)T);
  ReadBandwidth r;
  double best = 1e30;
  for (int p = 0; p < std::max(passes, 1); p++) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(T, [&](int64_t t, int) {
      const size_t lo = n * (size_t)t / (size_t)T, hi = n * (size_t)(t + 1) / (size_t)T;
      part[(size_t)t] = sum_slice(buf.get() + lo, hi - lo);
    });
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    r.checksum = 0;
    for (double s : part) r.checksum += s;
  }
  r.gb_per_s = (double)(n * sizeof(float)) / best / 1e9;
  return r;
}

}  // namespace kvzap
