// kvzap bench: prefill and decode throughput and the memory bandwidth decode achieves.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "cli/cli_common.h"
#include "kernels/matmul.h"

namespace kvzap::cli {
namespace {

struct BenchArgs {
  ModelArgs m;
  int64_t prefill = 512, decode = 128;
  int reps = 3;
  bool json = false;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_bench(BenchArgs a) {
  auto model = a.m.load_model();
  if (a.m.ctx == 0) a.m.ctx = a.prefill + a.decode + 8;
  Session s(*model, a.m.session_options());
  const int V = model->config().n_vocab;
  // A deterministic pseudo-text prompt: ordinary token ids, no special tokens.
  std::vector<int32_t> prompt((size_t)a.prefill);
  uint64_t x = 12345;
  for (auto& id : prompt) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id = (int32_t)(100 + (x >> 33) % (uint64_t)(V - 200));
  }
  double best_prefill = 1e30, best_decode = 1e30;
  for (int r = 0; r < a.reps; r++) {
    s.reset();
    auto t0 = std::chrono::steady_clock::now();
    s.feed(prompt);
    best_prefill = std::min(best_prefill, seconds_since(t0));
    int32_t id = Sampler::argmax(s.logits(), V);
    t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < a.decode; i++) {
      s.feed({id});
      id = Sampler::argmax(s.logits(), V);
    }
    best_decode = std::min(best_decode, seconds_since(t0));
  }
  const double pp = a.prefill / best_prefill, tg = a.decode / best_decode;
  // Bytes read per decoded token: every weight matrix plus the average KV prefix during the run.
  const double kv_avg = (double)model->config().kv_bytes_per_token() * (a.prefill + a.decode / 2.0);
  const double gbs = (model->weight_bytes() + kv_avg) * tg / 1e9;
  if (a.json) {
    nlohmann::json j{{"prefill_tokens", a.prefill}, {"decode_tokens", a.decode}, {"prefill_tok_s", pp},
                     {"decode_tok_s", tg}, {"bandwidth_gb_s", gbs}, {"threads", s.n_threads()},
                     {"isa", isa_name(active_isa())}, {"weight_bytes", model->weight_bytes()}, {"reps", a.reps}};
    std::printf("%s\n", json_dump(j).c_str());
  } else {
    std::printf("model: %s (%s)\nthreads: %d, isa: %s\n", model->config().name.c_str(), model->config().arch.c_str(),
                s.n_threads(), isa_name(active_isa()));
    std::printf("prefill %lld tokens: %.1f tok/s\n", (long long)a.prefill, pp);
    std::printf("decode  %lld tokens: %.1f tok/s  (%.2f GB/s of weights + KV)\n", (long long)a.decode, tg, gbs);
  }
  return 0;
}

RegisterCommand reg("bench", "measure prefill and decode speed", [](CLI::App& sub) {
  auto a = std::make_shared<BenchArgs>();
  a->m.add_to(sub);
  sub.add_option("--prefill", a->prefill, "prompt tokens")->check(CLI::Range((int64_t)1, (int64_t)1 << 20));
  sub.add_option("--decode", a->decode, "generated tokens")->check(CLI::Range((int64_t)1, (int64_t)1 << 20));
  sub.add_option("--reps", a->reps, "repetitions (best is reported)")->check(CLI::Range(1, 1000));
  sub.add_flag("--json", a->json, "print JSON");
  return [a]() { return run_bench(*a); };
});

}  // namespace
}  // namespace kvzap::cli
