// kvzap perplexity: teacher-forced scoring of a text, the base of every faithfulness check.
// The text is cut into consecutive non-overlapping windows of --ctx tokens; each window starts from an
// empty cache and every token after its first is predicted.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>

#include "cli/cli_common.h"
#include "model/blocks.h"

namespace kvzap::cli {
namespace {

struct PerplexityArgs {
  ModelArgs m;
  std::string file, jsonl, dump_logits;
  int64_t window = 2048;
  bool json = false;
};

int run_perplexity(PerplexityArgs a) {
  const std::string text = read_text_file(a.file);
  auto model = a.m.load_model();
  const Tokenizer& tok = model->tokenizer();
  const std::vector<int32_t> ids = tok.encode(text, tok.vocab().add_bos, /*parse_special=*/false);
  if (ids.size() < 2) throw Error(a.file + ": too short to score (needs at least 2 tokens)");
  if (a.m.ctx == 0) a.m.ctx = a.window;
  if (a.window > a.m.ctx) throw Error("--window must not exceed the context size");
  if (a.m.batch == 0) a.m.batch = 256;  // logits for every position: keep the buffer small
  Session session(*model, a.m.session_options());
  const int64_t V = model->config().n_vocab, B = session.forward().max_batch();
  std::vector<float> logits((size_t)(B * V));
  std::FILE* out = nullptr;
  if (!a.jsonl.empty()) {
    out = std::fopen(a.jsonl.c_str(), "w");
    if (!out) throw Error(a.jsonl + ": cannot open for writing");
  }
  std::FILE* dump = nullptr;
  if (!a.dump_logits.empty()) {
    dump = std::fopen(a.dump_logits.c_str(), "wb");
    if (!dump) throw Error(a.dump_logits + ": cannot open for writing");
  }
  double sum_lp = 0;
  int64_t n_scored = 0, n_top1_self = 0;
  const int64_t n = (int64_t)ids.size();
  for (int64_t w0 = 0; w0 < n; w0 += a.window) {
    const int64_t w1 = std::min(n, w0 + a.window);
    session.reset();
    for (int64_t c0 = w0; c0 < w1; c0 += B) {
      const int64_t c1 = std::min(w1, c0 + B);
      session.forward().run(&ids[c0], c1 - c0, session.cache(), LogitsMode::All, logits.data());
      if (dump) std::fwrite(logits.data(), sizeof(float), (size_t)((c1 - c0) * V), dump);
      for (int64_t t = c0; t < c1; t++) {
        const int64_t next = t + 1;
        if (next >= w1) break;
        int64_t top1 = 0;
        const double lp = log_softmax_at(&logits[(t - c0) * V], V, ids[next], &top1);
        sum_lp += lp;
        n_scored++;
        n_top1_self += top1 == ids[next];
        if (out)
          std::fprintf(out, "{\"pos\":%lld,\"token\":%d,\"logprob\":%.6f,\"top1\":%lld}\n", (long long)next, ids[next], lp,
                       (long long)top1);
      }
    }
    std::fprintf(stderr, "\rscored %lld / %lld tokens", (long long)n_scored, (long long)(n - 1));
  }
  std::fprintf(stderr, "\n");
  if (out) std::fclose(out);
  if (dump) std::fclose(dump);
  const double ppl = std::exp(-sum_lp / (double)n_scored);
  if (a.json) {
    nlohmann::json j{{"perplexity", ppl}, {"n_scored", n_scored}, {"mean_logprob", sum_lp / n_scored},
                     {"top1_accuracy", (double)n_top1_self / n_scored}, {"n_tokens", n}, {"window", a.window}};
    std::printf("%s\n", json_dump(j).c_str());
  } else {
    std::printf("perplexity: %.4f over %lld predicted tokens (windows of %lld)\n", ppl, (long long)n_scored, (long long)a.window);
  }
  return 0;
}

RegisterCommand reg("perplexity", "teacher-forced log-probabilities and perplexity of a text", [](CLI::App& sub) {
  auto a = std::make_shared<PerplexityArgs>();
  a->m.add_to(sub);
  sub.add_option("-f,--file", a->file, "text file to score")->required();
  sub.add_option("--jsonl", a->jsonl, "write one JSON object per predicted token {pos, token, logprob, top1}");
  sub.add_option("--window", a->window, "tokens per scoring window (each starts from an empty cache)")->check(CLI::Range((int64_t)2, (int64_t)1 << 20));
  sub.add_flag("--json", a->json, "print a JSON summary");
  sub.add_option("--dump-logits", a->dump_logits, "write every position's logits as raw float32 [n_tokens][n_vocab]");
  return [a]() { return run_perplexity(*a); };
});

}  // namespace
}  // namespace kvzap::cli
