// Micro-benchmark of decode attention over paged KV caches of each element type: one query block of
// 3 rows (SmolLM2-135M's 9 query heads over 3 KV heads) against every stream of a 30-layer x 3-head
// cache of `ctx` tokens, head size 64 — the attention work of one decode token, cold in cache (the
// 90 streams are 24 MB of f16 K/V at 4k). Select the ISA with KVZAP_ISA=scalar|avx2|avx512.
//   ./build/kvzap_microbench --benchmark_filter=Attend
// Counters: KVB/s = K/V page bytes read per second.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "cache/kv_cache.h"
#include "model/attention.h"

namespace {

using kvzap::KvCache;
using kvzap::KvType;

void BM_AttendDecode(benchmark::State& state, KvType type) {
  constexpr int L = 30, H = 3, D = 64, rows = 3;
  const int64_t ctx = state.range(0);
  KvCache cache(L, H, D, nullptr, type);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> k(D), v(D);
  for (int l = 0; l < L; l++)
    for (int h = 0; h < H; h++)
      for (int64_t i = 0; i < ctx; i++) {
        for (auto& x : k) x = nd(rng);
        for (auto& x : v) x = nd(rng);
        cache.append(l, h, k.data(), v.data(), (int32_t)i);
      }
  std::vector<float> q((size_t)rows * D), out((size_t)rows * D);  // [rows][D]
  for (auto& x : q) x = 0.2f * nd(rng);
  std::vector<int64_t> visible(rows, ctx);
  std::vector<float> scores((size_t)rows * ctx), page((size_t)KvCache::kPageTokens * D), partial((size_t)rows * D);
  const kvzap::AttentionBlock b{q.data(), D, rows, visible.data(), out.data(), D, type == KvType::F16};
  for (auto _ : state) {
    for (int l = 0; l < L; l++)
      for (int h = 0; h < H; h++) kvzap::attend(b, cache, l, h, scores.data(), page.data(), partial.data());
    benchmark::DoNotOptimize(out.data());
  }
  const double kv_bytes = (double)L * H * ((ctx + 15) / 16) * 2 * 16 * cache.row_bytes();
  state.counters["KVB/s"] = benchmark::Counter(kv_bytes * (double)state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_AttendDecode, f16, KvType::F16)->Arg(1024)->Arg(4096)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_AttendDecode, f32, KvType::F32)->Arg(1024)->Arg(4096)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_AttendDecode, q8_0, KvType::Q8_0)->Arg(1024)->Arg(4096)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_AttendDecode, q4_0, KvType::Q4_0)->Arg(1024)->Arg(4096)->Unit(benchmark::kMicrosecond);

}  // namespace
