// kvzap bench: prefill and decode throughput and the memory bandwidth decode achieves.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "cli/cli_common.h"
#include "kernels/matmul.h"
#include "press/surrogate.h"

namespace kvzap::cli {
namespace {

struct BenchArgs {
  ModelArgs m;
  int64_t prefill = 512, decode = 128;
  int reps = 3;
  bool json = false;
  std::vector<double> keep;               // decode speed with the cache cut to these fractions
  std::vector<std::string> surrogates;    // scorer overhead of these surrogate folders
};

// Keeps `keep` of every stream's entries, evenly spread (first and last kept): a stand-in for a press
// that measures only what a smaller cache does to decode speed.
void thin_cache(KvCache& cache, double keep) {
  std::vector<uint8_t> drop;
  for (int l = 0; l < cache.n_layer(); l++)
    for (int h = 0; h < cache.n_head_kv(); h++) {
      const int64_t n = cache.length(l, h), want = std::max<int64_t>(1, (int64_t)(n * keep + 0.5));
      drop.assign((size_t)n, 1);
      for (int64_t i = 0; i < want; i++) drop[(size_t)(want == 1 ? n - 1 : i * (n - 1) / (want - 1))] = 0;
      cache.evict(l, h, drop);
    }
}

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

  // Decode speed at the same context length with a smaller cache, measured in this same run.
  nlohmann::json keep_json = nlohmann::json::array();
  for (double keep : a.keep) {
    double best = 1e30;
    int64_t kv_bytes = 0, kv_full = 0;
    for (int r = 0; r < a.reps; r++) {
      s.reset();
      s.feed(prompt);
      thin_cache(s.cache(), keep);
      s.cache().release_pool();
      kv_bytes = s.cache().bytes_resident();
      kv_full = s.cache().bytes_full();
      int32_t id = Sampler::argmax(s.logits(), V);
      auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < a.decode; i++) {
        s.feed({id});
        id = Sampler::argmax(s.logits(), V);
      }
      best = std::min(best, seconds_since(t0));
    }
    const double tps = a.decode / best;
    keep_json.push_back({{"keep", keep}, {"decode_tok_s", tps}, {"ratio_vs_full", tps / tg}, {"kv_bytes", kv_bytes},
                         {"kv_bytes_full", kv_full}});
  }

  // Surrogate cost against the prefill it rides on: every layer scores every prompt token once.
  nlohmann::json sur_json = nlohmann::json::array();
  for (const std::string& dir : a.surrogates) {
    auto sur = Surrogate::load(dir);
    const int64_t n = a.prefill;
    std::vector<float> h((size_t)(n * sur->input_dim())), out((size_t)(n * sur->output_dim()));
    std::vector<std::vector<float>> scratch;
    uint64_t z = 7;
    for (float& x : h) {
      z = z * 6364136223846793005ull + 1;
      x = (float)((int64_t)(z >> 40) % 2001 - 1000) / 1000.0f;
    }
    double best = 1e30;
    for (int r = 0; r < std::max(a.reps, 3); r++) {
      auto t0 = std::chrono::steady_clock::now();
      // As the press runs it: on the engine's threads, which idle while it scores.
      for (int l = 0; l < sur->n_layers(); l++) sur->predict_threaded(l, h.data(), n, out.data(), s.forward().pool(), scratch);
      best = std::min(best, seconds_since(t0));
    }
    sur_json.push_back({{"surrogate", dir}, {"kind", sur->is_mlp() ? "mlp" : "linear"}, {"seconds", best},
                        {"share_of_prefill", best / best_prefill}});
  }
  // Bytes read per decoded token: every weight matrix plus the average KV prefix during the run.
  const double kv_avg = (double)model->config().kv_bytes_per_token() * (a.prefill + a.decode / 2.0);
  const double gbs = (model->weight_bytes() + kv_avg) * tg / 1e9;
  if (a.json) {
    nlohmann::json j{{"prefill_tokens", a.prefill}, {"decode_tokens", a.decode}, {"prefill_tok_s", pp},
                     {"decode_tok_s", tg}, {"bandwidth_gb_s", gbs}, {"threads", s.n_threads()},
                     {"isa", isa_name(active_isa())}, {"weight_bytes", model->weight_bytes()}, {"reps", a.reps},
                     {"decode_with_smaller_cache", keep_json}, {"scorer_overhead", sur_json}};
    std::printf("%s\n", json_dump(j).c_str());
  } else {
    std::printf("model: %s (%s)\nthreads: %d, isa: %s\n", model->config().name.c_str(), model->config().arch.c_str(),
                s.n_threads(), isa_name(active_isa()));
    std::printf("prefill %lld tokens: %.1f tok/s\n", (long long)a.prefill, pp);
    std::printf("decode  %lld tokens: %.1f tok/s  (%.2f GB/s of weights + KV)\n", (long long)a.decode, tg, gbs);
    for (const auto& k : keep_json)
      std::printf("decode with %.0f%% of the cache: %.1f tok/s (%.2fx the full cache; KV %.2f of %.2f MB)\n",
                  100 * k["keep"].get<double>(), k["decode_tok_s"].get<double>(), k["ratio_vs_full"].get<double>(),
                  k["kv_bytes"].get<int64_t>() / 1e6, k["kv_bytes_full"].get<int64_t>() / 1e6);
    for (const auto& o : sur_json)
      std::printf("scorer %s (%s): %.3f ms for %lld tokens x all layers = %.3f%% of prefill\n",
                  o["surrogate"].get<std::string>().c_str(), o["kind"].get<std::string>().c_str(),
                  1e3 * o["seconds"].get<double>(), (long long)a.prefill, 100 * o["share_of_prefill"].get<double>());
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
  sub.add_option("--keep", a->keep, "also time decoding after cutting the cache to these fractions (e.g. 0.5 0.25)")
      ->check(CLI::Range(0.0, 1.0));
  sub.add_option("--surrogate", a->surrogates, "also time these KVzap surrogate folders against the prefill");
  return [a]() { return run_bench(*a); };
});

}  // namespace
}  // namespace kvzap::cli
