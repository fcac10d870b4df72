// kvzap generate: one prompt in, one answer out, streamed, with timings.
#include <cstdio>
#include <memory>

#include "cli/cli_common.h"

namespace kvzap::cli {
namespace {

struct GenerateArgs {
  ModelArgs m;
  std::string prompt, file, system;
  bool chat = false, json = false, no_stream = false;
  int n = 256;
  float temp = 0.8f, top_p = 0.95f, min_p = 0.05f;
  int top_k = 40;
  uint64_t seed = 0;
  std::vector<std::string> stop;
};

int run_generate(const GenerateArgs& a) {
  const std::string prompt = prompt_from(a.prompt, a.file);
  auto model = a.m.load_model();
  const Tokenizer& tok = model->tokenizer();
  std::vector<int32_t> ids;
  if (a.chat) {
    std::vector<ChatMessage> msgs;
    if (!a.system.empty()) msgs.push_back({"system", a.system});
    msgs.push_back({"user", prompt});
    ids = tok.encode(apply_chat_template(detect_chat_format(tok.vocab()), msgs), /*add_bos=*/false, /*parse_special=*/true);
  } else {
    ids = tok.encode(prompt, tok.vocab().add_bos, /*parse_special=*/true);
  }
  Session session(*model, a.m.session_options());
  if ((int64_t)ids.size() >= session.n_ctx())
    throw Error("prompt is " + std::to_string(ids.size()) + " tokens, longer than the context of " +
                std::to_string(session.n_ctx()) + " tokens (raise -c or shorten the prompt)");
  GenerateOptions g;
  g.max_new_tokens = a.n;
  g.sampling.temperature = a.temp;
  g.sampling.top_k = a.top_k;
  g.sampling.top_p = a.top_p;
  g.sampling.min_p = a.min_p;
  g.sampling.seed = a.seed;
  g.stop = a.stop;
  const bool stream = !a.json && !a.no_stream;
  GenerateResult r = session.generate(ids, g, [&](const std::string& piece) {
    if (stream) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  });
  const double prefill_tps = r.prefill_seconds > 0 ? r.n_prompt / r.prefill_seconds : 0;
  const double decode_tps = r.decode_seconds > 0 && !r.tokens.empty() ? r.tokens.size() / r.decode_seconds : 0;
  if (a.json) {
    nlohmann::json j;
    j["text"] = r.text;
    j["tokens"] = r.tokens;
    j["prompt_tokens"] = ids;
    j["n_prompt_tokens"] = r.n_prompt;
    j["n_generated"] = r.tokens.size();
    j["stop_reason"] = r.stop_reason;
    j["prefill_seconds"] = r.prefill_seconds;
    j["decode_seconds"] = r.decode_seconds;
    j["prefill_tok_s"] = prefill_tps;
    j["decode_tok_s"] = decode_tps;
    j["threads"] = session.n_threads();
    j["kv_bytes"] = session.cache().bytes_resident();
    j["kv_bytes_full"] = session.cache().bytes_full();
    j["evicted_fraction"] = session.cache().evicted_fraction();
    std::printf("%s\n", json_dump(j).c_str());
  } else {
    if (!stream) std::fwrite(r.text.data(), 1, r.text.size(), stdout);
    std::printf("\n");
    std::fprintf(stderr, "[prompt %lld tokens, %.1f tok/s | generated %zu tokens, %.1f tok/s | stop: %s | %d threads]\n",
                 (long long)r.n_prompt, prefill_tps, r.tokens.size(), decode_tps, r.stop_reason.c_str(),
                 session.n_threads());
  }
  return 0;
}

RegisterCommand reg("generate", "generate text from a prompt", [](CLI::App& sub) {
  auto a = std::make_shared<GenerateArgs>();
  a->m.add_to(sub);
  sub.add_option("-p,--prompt", a->prompt, "prompt text");
  sub.add_option("-f,--file", a->file, "read the prompt from a file");
  sub.add_flag("--chat", a->chat, "wrap the prompt in the model's chat template");
  sub.add_option("--system", a->system, "system message (with --chat)");
  sub.add_option("-n,--max-tokens", a->n, "maximum new tokens")->check(CLI::Range(0, 1 << 20));
  sub.add_option("--temp", a->temp, "temperature; 0 = greedy")->check(CLI::Range(0.0f, 100.0f));
  sub.add_option("--top-k", a->top_k, "top-k filter (0 = off)");
  sub.add_option("--top-p", a->top_p, "top-p filter (1 = off)")->check(CLI::Range(0.0f, 1.0f));
  sub.add_option("--min-p", a->min_p, "min-p filter (0 = off)")->check(CLI::Range(0.0f, 1.0f));
  sub.add_option("--seed", a->seed, "sampling seed");
  sub.add_option("--stop", a->stop, "stop string (repeatable)");
  sub.add_flag("--json", a->json, "print one JSON object with the text, tokens and timings");
  sub.add_flag("--no-stream", a->no_stream, "print the answer at the end instead of streaming");
  return [a]() { return run_generate(*a); };
});

}  // namespace
}  // namespace kvzap::cli
