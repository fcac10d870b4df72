// kvzap bench: prefill and decode throughput and the memory bandwidth decode achieves.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include "engine/engine.h"

#include "cli/cli_common.h"
#include "kernels/read_bandwidth.h"
#include "kernels/matmul.h"
#include "model/blocks.h"
#include "press/surrogate.h"

namespace kvzap::cli {
namespace {

struct BenchArgs {
  ModelArgs m;
  int64_t prefill = 512, decode = 128;
  int reps = 3;
  bool json = false;
  bool read_bandwidth = false;            // also measure the machine's read bandwidth: decode as a share of it
  std::vector<double> keep;               // decode speed with the cache cut to these fractions
  std::vector<std::string> surrogates;    // scorer overhead of these surrogate folders
  std::vector<int> parallel;              // aggregate throughput with this many concurrent sequences
  bool capacity = false;                  // how many sequences fit a KV budget (with --press or not)
  std::string kv_budget;                  // --kv-budget for --capacity
  std::string text_file;                  // --capacity: prompts are windows of this text (else random ids)
  int max_sequences = 256;
  PressArgs press;
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

// A deterministic pseudo-text prompt: ordinary token ids, no special tokens; `salt` makes it distinct.
std::vector<int32_t> bench_prompt(int64_t n, int V, uint64_t salt) {
  std::vector<int32_t> prompt((size_t)n);
  uint64_t x = 12345 + salt * 0x9E3779B97F4A7C15ull;
  for (auto& id : prompt) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id = (int32_t)(100 + (x >> 33) % (uint64_t)(V - 200));
  }
  return prompt;
}

// n_steps batched decode steps, one greedy token per sequence each; returns the segments the pool
// refused (OutOfKvMemory).
int64_t decode_together(Engine& engine, std::vector<std::unique_ptr<Sequence>>& seqs, int64_t n_steps) {
  const int V = engine.model().config().n_vocab;
  const size_t B = seqs.size();
  std::vector<int32_t> ids(B);
  std::vector<Segment> segs(B);
  int64_t refused = 0;
  for (int64_t i = 0; i < n_steps && B > 0; i++) {
    for (size_t b = 0; b < B; b++) {
      ids[b] = Sampler::argmax(seqs[b]->logits(), V);
      segs[b] = Segment{};
      segs[b].seq = seqs[b].get();
      segs[b].tokens = &ids[b];
      segs[b].n = 1;
    }
    engine.step(segs);
    for (const Segment& g : segs) refused += g.status != SegmentStatus::Ok;
  }
  return refused;
}

// Prefills B distinct prompts in steps of at most n_batch tokens (whole prompts or chunks, several
// sequences per step), then decodes one token per sequence per step: llama-batched-bench's shapes.
nlohmann::json parallel_run(const Model& model, const BenchArgs& a, int B) {
  const int V = model.config().n_vocab;
  EngineOptions eo;
  eo.n_threads = a.m.threads;
  eo.n_ctx = a.prefill + a.decode + 8;
  eo.n_batch = a.m.batch > 0 ? a.m.batch : std::max<int64_t>(512, a.prefill);
  eo.kv_type = a.m.cache_type();
  eo.kv_budget_bytes = (int64_t)B * (int64_t)model.config().n_layer * model.config().n_head_kv *
                       ((eo.n_ctx + 15) / 16 + 1) * KvCache::page_bytes_for(model.config().head_dim, eo.kv_type);
  Engine engine(model, eo);
  std::vector<std::vector<int32_t>> prompts;
  for (int b = 0; b < B; b++) prompts.push_back(bench_prompt(a.prefill, V, (uint64_t)b));
  double best_pp = 1e30, best_tg = 1e30;
  int64_t peak = 0;
  for (int r = 0; r < a.reps; r++) {
    std::vector<std::unique_ptr<Sequence>> seqs;
    for (int b = 0; b < B; b++) seqs.push_back(engine.new_sequence());
    std::vector<int64_t> fed((size_t)B, 0);
    std::vector<Segment> segs;
    auto t0 = std::chrono::steady_clock::now();
    for (int next = 0; next < B;) {
      segs.clear();
      int64_t room = engine.n_batch();
      for (int b = next; b < B && room > 0; b++) {
        const int64_t m = std::min(room, a.prefill - fed[b]);
        Segment g;
        g.seq = seqs[b].get();
        g.tokens = prompts[b].data() + fed[b];
        g.n = m;
        g.logits = fed[b] + m == a.prefill ? LogitsMode::Last : LogitsMode::None;
        segs.push_back(g);
        room -= m;
      }
      engine.step(segs);
      for (const Segment& g : segs) {
        if (g.status != SegmentStatus::Ok) throw Error("internal: the benchmark's KV budget is too small");
        const int b = (int)(std::find_if(seqs.begin(), seqs.end(), [&](auto& q) { return q.get() == g.seq; }) - seqs.begin());
        fed[b] += g.n;
        if (fed[b] == a.prefill) next = b + 1;
      }
    }
    best_pp = std::min(best_pp, seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    decode_together(engine, seqs, a.decode);
    best_tg = std::min(best_tg, seconds_since(t0));
    peak = std::max(peak, engine.pages().peak_bytes());
  }
  const int64_t pp_tokens = (int64_t)B * a.prefill, tg_tokens = (int64_t)B * a.decode;
  return {{"parallel", B},          {"prefill_tokens", pp_tokens},      {"prefill_seconds", best_pp},
          {"prefill_tok_s", pp_tokens / best_pp}, {"decode_tokens", tg_tokens}, {"decode_seconds", best_tg},
          {"decode_tok_s", tg_tokens / best_tg},  {"kv_bytes_peak", peak}};
}

// Capacity under a KV budget: sequences of --prefill tokens are admitted one by one while the pool can
// still hold the new one's whole prompt and its --decode tokens (the press evicts only after its context
// is in); then every admitted sequence decodes concurrently.
nlohmann::json capacity_run(const Model& model, const BenchArgs& a) {
  const int V = model.config().n_vocab;
  EngineOptions eo;
  eo.n_threads = a.m.threads;
  eo.n_ctx = a.prefill + a.decode + 8;
  eo.n_batch = a.m.batch > 0 ? a.m.batch : std::max<int64_t>(512, a.prefill);
  eo.kv_budget_bytes = a.kv_budget.empty() ? 0 : parse_byte_size(a.kv_budget);
  eo.kv_type = a.m.cache_type();
  Engine engine(model, eo);
  std::vector<std::unique_ptr<Sequence>> seqs;
  // Natural text prunes like real prompts do (random ids do not): windows of the file's tokens.
  std::vector<int32_t> text_ids;
  if (!a.text_file.empty()) {
    text_ids = model.tokenizer().encode(read_text_file(a.text_file), false, false);
    if ((int64_t)text_ids.size() < a.prefill + 1)
      throw Error(a.text_file + ": " + std::to_string(text_ids.size()) + " tokens, fewer than --prefill");
  }
  auto prompt_for = [&](size_t i) {
    if (text_ids.empty()) return bench_prompt(a.prefill, V, i);
    const size_t span = text_ids.size() - (size_t)a.prefill;
    const size_t at = (i * 1543) % (span + 1);
    return std::vector<int32_t>(text_ids.begin() + (long)at, text_ids.begin() + (long)at + a.prefill);
  };
  auto t0 = std::chrono::steady_clock::now();
  while ((int)seqs.size() < a.max_sequences) {
    auto seq = engine.new_sequence();
    if (seq->cache().pages_needed(a.prefill + a.decode) > engine.pages().pages_available()) break;
    seq->set_press(a.press.make(model));
    const std::vector<int32_t> p = prompt_for(seqs.size());
    seq->begin_context();
    engine.feed(*seq, p.data(), (int64_t)p.size(), LogitsMode::Last);
    seq->end_context(p);
    seqs.push_back(std::move(seq));
    std::fprintf(stderr, "\r[bench] admitted %zu sequences, KV %.1f of %.1f MiB", seqs.size(),
                 engine.pages().bytes_in_use() / 1048576.0, engine.pages().budget_bytes() / 1048576.0);
  }
  std::fprintf(stderr, "\n");
  const double prefill_s = seconds_since(t0);
  const int B = (int)seqs.size();
  double evicted = 0;
  for (auto& s : seqs) evicted += s->cache().evicted_fraction();
  t0 = std::chrono::steady_clock::now();
  const int64_t refused = decode_together(engine, seqs, a.decode);
  const double decode_s = seconds_since(t0);
  return {{"kv_budget_bytes", engine.pages().budget_bytes()},
          {"kv_type", kv_type_name(engine.kv_type())},
          {"press", seqs.empty() || !seqs[0]->press() ? "none" : seqs[0]->press()->name()},
          {"sequences", B},
          {"prefill_tokens_each", a.prefill},
          {"evicted_fraction", B ? evicted / B : 0.0},
          {"kv_bytes_in_use", engine.pages().bytes_in_use()},
          {"kv_bytes_peak", engine.pages().peak_bytes()},
          {"prefill_seconds", prefill_s},
          {"decode_tokens", (int64_t)B * a.decode - refused},
          {"decode_seconds", decode_s},
          {"decode_tok_s", ((int64_t)B * a.decode - refused) / decode_s},
          {"decode_steps_refused_for_memory", refused}};
}

int run_bench(BenchArgs a) {
  auto model = a.m.load_model();
  if (a.capacity) {
    const nlohmann::json j = capacity_run(*model, a);
    if (a.json) {
      std::printf("%s\n", json_dump(j).c_str());
    } else {
      std::printf("KV budget %.1f MiB (%s), press %s: %d concurrent sequences of %lld tokens (evicted %.1f%%), "
                  "aggregate decode %.1f tok/s\n",
                  j["kv_budget_bytes"].get<int64_t>() / 1048576.0, j["kv_type"].get<std::string>().c_str(),
                  j["press"].get<std::string>().c_str(),
                  j["sequences"].get<int>(), (long long)a.prefill, 100 * j["evicted_fraction"].get<double>(),
                  j["decode_tok_s"].get<double>());
    }
    return 0;
  }
  if (!a.parallel.empty()) {
    nlohmann::json rows = nlohmann::json::array();
    if (!a.json)
      std::printf("|    PP |     TG |    B |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s | KV peak MiB |\n"
                  "|-------|--------|------|----------|----------|----------|----------|-------------|\n");
    for (int B : a.parallel) {
      nlohmann::json r = parallel_run(*model, a, B);
      if (!a.json)
        std::printf("| %5lld | %6lld | %4d | %8.3f | %8.2f | %8.3f | %8.2f | %11.1f |\n", (long long)a.prefill,
                    (long long)a.decode, B, r["prefill_seconds"].get<double>(), r["prefill_tok_s"].get<double>(),
                    r["decode_seconds"].get<double>(), r["decode_tok_s"].get<double>(),
                    r["kv_bytes_peak"].get<int64_t>() / 1048576.0);
      std::fflush(stdout);
      rows.push_back(r);
    }
    if (a.json) {
      ThreadPool probe(a.m.threads > 0 ? a.m.threads : ThreadPool::default_threads());
      nlohmann::json j{{"model", model->config().name}, {"threads", probe.size()}, {"isa", isa_name(active_isa())},
                       {"kv_type", a.m.kv_type}, {"reps", a.reps}, {"results", rows}};
      std::printf("%s\n", json_dump(j).c_str());
    }
    return 0;
  }
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
  // Warm-up, untimed (as llama-bench's): one short step touches every weight page, so the first timed
  // repetition does not pay for faulting in the mmap'd model.
  s.feed(std::vector<int32_t>(prompt.begin(), prompt.begin() + std::min<int64_t>(a.prefill, 8)));
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
      // As the MLP press runs it: on the engine's threads, which idle while it scores.
      for (int l = 0; l < sur->n_layers(); l++) sur->predict_threaded(l, h.data(), n, out.data(), s.forward().pool(), scratch);
      best = std::min(best, seconds_since(t0));
    }
    nlohmann::json row{{"surrogate", dir}, {"kind", sur->is_mlp() ? "mlp" : "linear"}};
    if (!sur->is_mlp() && sur->input_dim() == model->config().n_embd) {
      // The linear press runs as a read-out fused with the attention norm (LayerObserver::h_readout): its
      // cost is what it adds to the norm pass, timed here as the forward runs both (best of the reps,
      // norm-only and norm + read-out alternating).
      const int64_t E = sur->input_dim(), H = sur->output_dim();
      std::vector<float> xn((size_t)(n * E));
      ThreadPool& pool = s.forward().pool();
      auto norm_pass = [&](bool readout) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int l = 0; l < sur->n_layers(); l++) {
          const float* gain = model->weights().layers[(size_t)l].attn_norm;
          pool.parallel_ranges(n, [&](int64_t t0, int64_t t1, int) {
            for (int64_t b0 = t0; b0 < t1; b0 += 8) {  // blocks of 8 rows, as Forward runs it
              const int64_t b1 = std::min(t1, b0 + 8);
              for (int64_t t = b0; t < b1; t++)
                rmsnorm(&h[(size_t)(t * E)], gain, &xn[(size_t)(t * E)], E, model->config().rms_eps);
              if (readout) sur->predict(l, &xn[(size_t)(b0 * E)], b1 - b0, &out[(size_t)(b0 * H)], nullptr);
            }
          });
        }
        return seconds_since(t0);
      };
      double plain = 1e30, fused = 1e30;
      for (int r = 0; r < std::max(a.reps, 3) * 4; r++) {
        plain = std::min(plain, norm_pass(false));
        fused = std::min(fused, norm_pass(true));
      }
      row["unfused_seconds"] = best;
      row["norm_pass_seconds"] = plain;
      row["norm_and_readout_seconds"] = fused;
      best = std::max(0.0, fused - plain);
    }
    row["seconds"] = best;
    row["share_of_prefill"] = best / best_prefill;
    sur_json.push_back(row);
  }
  // Bytes read per decoded token: every weight matrix plus the average KV prefix during the run.
  const double kv_avg = (double)s.engine().kv_bytes_per_token() * (a.prefill + a.decode / 2.0);
  const double gbs = (model->weight_bytes() + kv_avg) * tg / 1e9;
  // The roofline: 1 GiB (far past any last-level cache) summed by the same threads, best of 10 passes.
  ReadBandwidth bw;
  if (a.read_bandwidth) bw = measure_read_bandwidth(s.engine().threads(), (size_t)1 << 30, 10);
  if (a.json) {
    nlohmann::json j{{"prefill_tokens", a.prefill}, {"decode_tokens", a.decode}, {"prefill_tok_s", pp},
                     {"decode_tok_s", tg}, {"bandwidth_gb_s", gbs}, {"threads", s.n_threads()},
                     {"kv_type", kv_type_name(s.engine().kv_type())},
                     {"isa", isa_name(active_isa())}, {"weight_bytes", model->weight_bytes()}, {"reps", a.reps},
                     {"decode_with_smaller_cache", keep_json}, {"scorer_overhead", sur_json}};
    if (a.read_bandwidth) j["read_bandwidth_gb_s"] = bw.gb_per_s, j["decode_share_of_read_bandwidth"] = gbs / bw.gb_per_s;
    std::printf("%s\n", json_dump(j).c_str());
  } else {
    std::printf("model: %s (%s)\nthreads: %d, isa: %s, KV cache: %s\n", model->config().name.c_str(),
                model->config().arch.c_str(), s.n_threads(), isa_name(active_isa()), kv_type_name(s.engine().kv_type()));
    std::printf("prefill %lld tokens: %.1f tok/s\n", (long long)a.prefill, pp);
    std::printf("decode  %lld tokens: %.1f tok/s  (%.2f GB/s of weights + KV)\n", (long long)a.decode, tg, gbs);
    if (a.read_bandwidth)
      std::printf("read bandwidth (1 GiB, %d threads, best of 10): %.1f GB/s; decode reads %.0f%% of it\n", s.n_threads(),
                  bw.gb_per_s, 100 * gbs / bw.gb_per_s);
    for (const auto& k : keep_json)
      std::printf("decode with %.0f%% of the cache: %.1f tok/s (%.2fx the full cache; KV %.2f of %.2f MB)\n",
                  100 * k["keep"].get<double>(), k["decode_tok_s"].get<double>(), k["ratio_vs_full"].get<double>(),
                  k["kv_bytes"].get<int64_t>() / 1e6, k["kv_bytes_full"].get<int64_t>() / 1e6);
    for (const auto& o : sur_json)
      std::printf("scorer %s (%s): %.3f ms for %lld tokens x all layers = %.3f%% of prefill\n",
                  o["surrogate"].get<std::string>().c_str(), o["kind"].get<std::string>().c_str(),
                  1e3 * o["seconds"].get<double>(), (long long)a.prefill, 100 * o["share_of_prefill"].get<double>());
    for (const auto& o : sur_json)
      if (o.contains("unfused_seconds"))
        std::printf("  (%s: fused with the attention norm, which takes %.3f ms alone and %.3f ms with the read-out;"
                    " run apart over h it takes %.3f ms)\n",
                    o["kind"].get<std::string>().c_str(), 1e3 * o["norm_pass_seconds"].get<double>(),
                    1e3 * o["norm_and_readout_seconds"].get<double>(), 1e3 * o["unfused_seconds"].get<double>());
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
  sub.add_flag("--read-bandwidth", a->read_bandwidth,
               "also measure this machine's read bandwidth (STREAM-style, 1 GiB) and report decode as a share of it");
  sub.add_option("--keep", a->keep, "also time decoding after cutting the cache to these fractions (e.g. 0.5 0.25)")
      ->check(CLI::Range(0.0, 1.0));
  sub.add_option("--surrogate", a->surrogates, "also time these KVzap surrogate folders against the prefill");
  sub.add_option("--parallel", a->parallel, "aggregate prefill/decode tok/s with these many concurrent sequences "
                                            "(e.g. 1,4,16,64), like llama-batched-bench")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  sub.add_flag("--capacity", a->capacity, "admit --prefill-token sequences until the KV budget is full, then decode "
                                          "them all; with --press, under that press");
  sub.add_option("--kv-budget", a->kv_budget, "KV memory budget for --capacity (e.g. 512MiB)");
  sub.add_option("--text-file", a->text_file, "--capacity: prompts are windows of this text file's tokens");
  sub.add_option("--max-sequences", a->max_sequences, "upper bound for --capacity")->check(CLI::Range(1, 100000));
  a->press.add_to(sub, /*with_surrogate=*/false);
  return [a]() { return run_bench(*a); };
});

}  // namespace
}  // namespace kvzap::cli
