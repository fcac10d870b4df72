// Micro-benchmarks of the matmul kernels on SmolLM2-135M shapes (GEMV = decode, GEMM = prefill) and of
// the thread pool's per-job overhead. Select the ISA with KVZAP_ISA=scalar|avx2|avx512.
//   cmake -S . -B build-bench -DKVZAP_BUILD_BENCH=ON && cmake --build build-bench --target kvzap_microbench
//   ./build-bench/kvzap_microbench --benchmark_filter=Matmul
// Counters: GFLOP/s = 2 * n_in * n_out * n_tok per second; WGB/s = weight bytes streamed per second.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/thread_pool.h"

namespace {

using kvzap::GgmlType;

struct Fixture {
  std::vector<uint8_t> weights;
  kvzap::WeightMatrix w;
  std::vector<float> x, y;
  kvzap::MatmulScratch scratch;
};

Fixture make_fixture(GgmlType type, int64_t n_in, int64_t n_out, int64_t n_tok) {
  Fixture f;
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> row((size_t)n_in);
  const size_t rb = (size_t)kvzap::row_bytes(type, n_in);
  f.weights.resize(rb * (size_t)n_out);
  for (int64_t o = 0; o < n_out; ++o) {
    for (auto& v : row) v = nd(rng) * 0.05f;
    kvzap::quantize_row(type, row.data(), f.weights.data() + rb * (size_t)o, n_in);
  }
  f.w = {type, f.weights.data(), n_in, n_out, rb};
  f.x.resize((size_t)(n_in * n_tok));
  for (auto& v : f.x) v = nd(rng);
  f.y.resize((size_t)(n_out * n_tok));
  f.scratch.reserve(n_tok, n_in);
  return f;
}

void run_matmul(benchmark::State& state, GgmlType type, int64_t n_in, int64_t n_out) {
  const int64_t n_tok = state.range(0);
  const int threads = (int)state.range(1);
  Fixture f = make_fixture(type, n_in, n_out, n_tok);
  kvzap::ThreadPool pool(threads);
  for (auto _ : state) {
    kvzap::matmul(f.w, f.x.data(), n_tok, f.y.data(), pool, f.scratch);
    benchmark::DoNotOptimize(f.y.data());
  }
  const double flops = 2.0 * (double)n_in * (double)n_out * (double)n_tok;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["WGB/s"] = benchmark::Counter((double)f.weights.size() * 1e-9,
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(kvzap::isa_name(kvzap::active_isa()));
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int threads : {1, 2})
    for (int n_tok : {1, 512}) b->Args({n_tok, threads});
  b->ArgNames({"tok", "thr"})->UseRealTime()->Unit(benchmark::kMicrosecond);
}

void BM_Matmul_Q4_1_576x1536(benchmark::State& s) { run_matmul(s, GgmlType::Q4_1, 576, 1536); }
void BM_Matmul_Q4_1_1536x576(benchmark::State& s) { run_matmul(s, GgmlType::Q4_1, 1536, 576); }
void BM_Matmul_Q4_1_576x576(benchmark::State& s) { run_matmul(s, GgmlType::Q4_1, 576, 576); }
void BM_Matmul_Q8_0_576x49152(benchmark::State& s) { run_matmul(s, GgmlType::Q8_0, 576, 49152); }
void BM_Matmul_Q8_0_576x1536(benchmark::State& s) { run_matmul(s, GgmlType::Q8_0, 576, 1536); }
void BM_Matmul_Q4_0_576x1536(benchmark::State& s) { run_matmul(s, GgmlType::Q4_0, 576, 1536); }
// Qwen2.5-Coder-0.5B's K-quant matrices: ffn_down 4864 -> 896 (Q4_K or Q6_K).
void BM_Matmul_Q4_K_4864x896(benchmark::State& s) { run_matmul(s, GgmlType::Q4_K, 4864, 896); }
void BM_Matmul_Q6_K_4864x896(benchmark::State& s) { run_matmul(s, GgmlType::Q6_K, 4864, 896); }
void BM_Matmul_Q5_0_896x4864(benchmark::State& s) { run_matmul(s, GgmlType::Q5_0, 896, 4864); }
// The same ffn_down as a Hugging Face checkpoint keeps it (safetensors F16 / BF16, used zero-copy).
void BM_Matmul_F16_4864x896(benchmark::State& s) { run_matmul(s, GgmlType::F16, 4864, 896); }
void BM_Matmul_BF16_4864x896(benchmark::State& s) { run_matmul(s, GgmlType::BF16, 4864, 896); }
void BM_Matmul_F32_4864x896(benchmark::State& s) { run_matmul(s, GgmlType::F32, 4864, 896); }
BENCHMARK(BM_Matmul_Q4_K_4864x896)->Apply(shapes);
BENCHMARK(BM_Matmul_Q6_K_4864x896)->Apply(shapes);
BENCHMARK(BM_Matmul_Q5_0_896x4864)->Apply(shapes);
BENCHMARK(BM_Matmul_F16_4864x896)->Apply(shapes);
BENCHMARK(BM_Matmul_BF16_4864x896)->Apply(shapes);
BENCHMARK(BM_Matmul_F32_4864x896)->Apply(shapes);
BENCHMARK(BM_Matmul_Q4_1_576x1536)->Apply(shapes);
BENCHMARK(BM_Matmul_Q4_1_1536x576)->Apply(shapes);
BENCHMARK(BM_Matmul_Q4_1_576x576)->Apply(shapes);
BENCHMARK(BM_Matmul_Q8_0_576x1536)->Apply(shapes);
BENCHMARK(BM_Matmul_Q4_0_576x1536)->Apply(shapes);
BENCHMARK(BM_Matmul_Q8_0_576x49152)->Apply([](benchmark::internal::Benchmark* b) {
  for (int threads : {1, 2})
    for (int n_tok : {1, 64}) b->Args({n_tok, threads});
  b->ArgNames({"tok", "thr"})->UseRealTime()->Unit(benchmark::kMicrosecond);
});

// Decode streams weights from DRAM (the model is larger than L3): each call reads the next of `copies`
// copies of the matrix, enough of them to exceed L3.
void run_gemv_streaming(benchmark::State& state, GgmlType type, int64_t n_in, int64_t n_out, int copies_n) {
  const int threads = (int)state.range(0);
  const int kCopies = copies_n;
  Fixture f = make_fixture(type, n_in, n_out, 1);
  std::vector<std::vector<uint8_t>> copies(kCopies, f.weights);
  kvzap::ThreadPool pool(threads);
  size_t i = 0;
  for (auto _ : state) {
    kvzap::WeightMatrix w = f.w;
    w.data = copies[i++ % kCopies].data();
    kvzap::matmul(w, f.x.data(), 1, f.y.data(), pool, f.scratch);
    benchmark::DoNotOptimize(f.y.data());
  }
  state.counters["WGB/s"] = benchmark::Counter((double)f.weights.size() * 1e-9,
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(kvzap::isa_name(kvzap::active_isa()));
}
// Q4_1 576 -> 1536: 64 copies (~35 MB).
void BM_Gemv_Q4_1_576x1536_Streaming(benchmark::State& s) { run_gemv_streaming(s, GgmlType::Q4_1, 576, 1536, 64); }
BENCHMARK(BM_Gemv_Q4_1_576x1536_Streaming)->Arg(1)->Arg(2)->ArgName("thr")->UseRealTime()->Unit(benchmark::kMicrosecond);

// F16 / BF16 ffn_down (8.7 MB a copy): 8 copies (~70 MB).
void BM_Gemv_F16_4864x896_Streaming(benchmark::State& s) { run_gemv_streaming(s, GgmlType::F16, 4864, 896, 8); }
void BM_Gemv_BF16_4864x896_Streaming(benchmark::State& s) { run_gemv_streaming(s, GgmlType::BF16, 4864, 896, 8); }
BENCHMARK(BM_Gemv_F16_4864x896_Streaming)->Arg(1)->Arg(2)->ArgName("thr")->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Gemv_BF16_4864x896_Streaming)->Arg(1)->Arg(2)->ArgName("thr")->UseRealTime()->Unit(benchmark::kMicrosecond);

// Qwen2.5-Coder-0.5B decode matrices from DRAM: ffn_gate/up Q5_0 896 -> 4864 (3.0 MB a copy, 24 copies),
// ffn_down Q6_K 4864 -> 896 (3.6 MB, 20 copies), and the Q8_0 LM head 896 -> 151936 (145 MB, one copy).
void BM_Gemv_Q5_0_896x4864_Streaming(benchmark::State& s) { run_gemv_streaming(s, GgmlType::Q5_0, 896, 4864, 24); }
void BM_Gemv_Q6_K_4864x896_Streaming(benchmark::State& s) { run_gemv_streaming(s, GgmlType::Q6_K, 4864, 896, 20); }
void BM_Gemv_Q8_0_896x151936_Streaming(benchmark::State& s) { run_gemv_streaming(s, GgmlType::Q8_0, 896, 151936, 1); }
BENCHMARK(BM_Gemv_Q5_0_896x4864_Streaming)->Arg(1)->Arg(2)->ArgName("thr")->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Gemv_Q6_K_4864x896_Streaming)->Arg(1)->Arg(2)->ArgName("thr")->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Gemv_Q8_0_896x151936_Streaming)->Arg(1)->Arg(2)->ArgName("thr")->UseRealTime()->Unit(benchmark::kMicrosecond);

// Cost of one parallel_for with trivial work: the per-op overhead decode pays ~300 times per token.
void BM_ThreadPoolJob(benchmark::State& state) {
  kvzap::ThreadPool pool((int)state.range(0));
  std::vector<int64_t> sink(64);
  for (auto _ : state) {
    pool.parallel_for(8, [&](int64_t i, int) { sink[(size_t)i * 8] += i; });
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_ThreadPoolJob)->Arg(1)->Arg(2)->UseRealTime();

}  // namespace
