// kvzap generate: a prompt (or a context plus questions) in, answers out, streamed, with timings and,
// under a press, the cache's real size.
#include <cstdio>
#include <memory>

#include "chat/chat_prompt.h"
#include "cli/cli_common.h"
#include "cli/generate_cache.h"
#include "engine/pipeline.h"

namespace kvzap::cli {
namespace {

struct GenerateArgs {
  ModelArgs m;
  PressArgs press;
  std::string prompt, file, system, context_file, answer_prefix, kv_trace;
  std::vector<std::string> questions;
  bool chat = false, json = false, no_stream = false, kept_positions = false;
  int n = 256;
  float temp = 0.8f, top_p = 0.95f, min_p = 0.05f;
  int top_k = 40;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  std::string save_cache, load_cache;  // saved compressed contexts (cli/generate_cache.h)
};

nlohmann::json answer_json(const GenerateResult& r) {
  const double pp = r.prefill_seconds > 0 ? r.n_prompt / r.prefill_seconds : 0;
  const double tg = r.decode_seconds > 0 && !r.tokens.empty() ? r.tokens.size() / r.decode_seconds : 0;
  return {{"text", r.text}, {"tokens", r.tokens}, {"n_prompt_tokens", r.n_prompt}, {"n_generated", r.tokens.size()},
          {"stop_reason", r.stop_reason}, {"prefill_seconds", r.prefill_seconds}, {"decode_seconds", r.decode_seconds},
          {"prefill_tok_s", pp}, {"decode_tok_s", tg}};
}

int run_generate(const GenerateArgs& a) {
  auto model = a.m.load_model();
  const Tokenizer& tok = model->tokenizer();
  std::unique_ptr<Press> press = a.press.make(*model);
  Session session(*model, a.m.session_options());
  GenerateOptions g;
  g.max_new_tokens = a.n;
  g.sampling = {a.temp, a.top_k, a.top_p, a.min_p, a.seed};
  g.stop = a.stop;
  const bool stream = !a.json && !a.no_stream;
  std::FILE* trace = nullptr;
  if (!a.kv_trace.empty()) {
    trace = std::fopen(a.kv_trace.c_str(), "w");
    if (!trace) throw Error(a.kv_trace + ": cannot open for writing");
    std::fprintf(trace, "step,n_past,kv_bytes,kv_bytes_full,evicted_fraction\n");
    g.on_token = [&](int step) {
      const KvCache& c = session.cache();
      std::fprintf(trace, "%d,%lld,%lld,%lld,%.6f\n", step, (long long)c.n_past(), (long long)c.bytes_resident(),
                   (long long)c.bytes_full(), c.evicted_fraction());
    };
  }

  if (!a.load_cache.empty()) {  // a saved compressed context replaces the prefill
    if (press) throw Error("--load-cache: the saved context is already compressed; --press applies when saving it");
    if (!a.questions.empty() || !a.context_file.empty() || !a.save_cache.empty())
      throw Error("--load-cache continues a saved context with -p/-f (no --context-file, --question or --save-cache)");
    return generate_from_saved_cache(a.load_cache, session, {a.file.empty() ? a.prompt : read_text_file(a.file), g, a.json, stream});
  }
  ContextPrompt cp;
  bool qa_mode = !a.context_file.empty();
  if (qa_mode) {
    if (!a.prompt.empty() || !a.file.empty()) throw Error("--context-file replaces -p/-f: ask with --question");
    if (a.questions.empty()) throw Error("--context-file needs at least one --question");
    cp = build_context_prompt(tok, read_text_file(a.context_file), a.questions, a.chat, a.answer_prefix);
  } else {
    if (!a.questions.empty()) throw Error("--question needs --context-file");
    const std::string prompt = prompt_from(a.prompt, a.file);
    if (a.chat) {
      std::vector<ChatMessage> msgs;
      if (!a.system.empty()) msgs.push_back({"system", a.system});
      msgs.push_back({"user", prompt});
      cp.context_ids = ChatPrompt(tok).encode(msgs);
    } else {
      cp.context_ids = tok.encode(prompt, tok.vocab().add_bos, true);
    }
    cp.question_ids.push_back({});  // generate straight after the prompt
  }
  int64_t longest_q = 0;
  for (const auto& q : cp.question_ids) longest_q = std::max<int64_t>(longest_q, (int64_t)q.size());
  if ((int64_t)cp.context_ids.size() + longest_q >= session.n_ctx())
    throw Error("prompt is " + std::to_string(cp.context_ids.size() + longest_q) + " tokens, longer than the context of " +
                std::to_string(session.n_ctx()) + " tokens (raise -c or shorten the prompt)");
  if (cp.context_ids.empty()) throw Error("the prompt is empty");

  QaResult r = answer_questions(session, press.get(), cp, g, [&](size_t qi, const std::string& piece) {
    if (stream) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  }, a.kept_positions);
  if (trace) std::fclose(trace);
  if (!a.save_cache.empty()) save_context_cache(a.save_cache, session, cp.context_ids, a.press);
  if (a.json) {
    nlohmann::json j;
    if (!qa_mode) {
      j = answer_json(r.answers[0]);
      j["n_prompt_tokens"] = r.n_context;
      j["prompt_tokens"] = cp.context_ids;
      j["prefill_seconds"] = r.context_seconds;
      j["prefill_tok_s"] = r.context_seconds > 0 ? r.n_context / r.context_seconds : 0;
    } else {
      j["answers"] = nlohmann::json::array();
      for (size_t i = 0; i < r.answers.size(); i++) {
        nlohmann::json aj = answer_json(r.answers[i]);
        aj["question"] = a.questions[i];
        j["answers"].push_back(aj);
      }
      j["n_context_tokens"] = r.n_context;
      j["context_seconds"] = r.context_seconds;
    }
    j["press"] = press ? press->name() : "none";
    if (press) {  // the settings as given, in the form every front end shares (press/press_spec.h)
      const PressSpec spec = a.press.spec();
      j["press_spec"] = press_spec_to_json(spec);
      j["press_key"] = press_spec_key(&spec);
    }
    j["threads"] = session.n_threads();
    j["evicted_fraction"] = r.evicted_fraction;
    j["kv_bytes"] = r.kv_bytes;
    j["kv_bytes_full"] = r.kv_bytes_full;
    j["kv_lengths"] = r.kv_lengths;  // [layer][KV head] kept entries after the context
    if (a.kept_positions) {
      j["kept_positions"] = r.kept_positions;  // [layer][KV head][positions]
      j["context_tokens"] = cp.context_ids;    // the positions' tokens (with --context-file: template + context)
    }
    j["evicted_fraction_end"] = r.evicted_fraction_end;
    j["kv_bytes_end"] = r.kv_bytes_end;
    j["kv_bytes_full_end"] = r.kv_bytes_full_end;
    // Entries freed by sliding-window layers (Gemma 3's local layers), not counted as evicted.
    j["kv_window_dropped_end"] = session.cache().entries_window_dropped();
    std::printf("%s\n", json_dump(j).c_str());
    return 0;
  }
  for (size_t i = 0; i < r.answers.size(); i++) {
    const GenerateResult& ans = r.answers[i];
    if (!stream) std::fwrite(ans.text.data(), 1, ans.text.size(), stdout);
    std::printf("\n");
    const double tg = ans.decode_seconds > 0 && !ans.tokens.empty() ? ans.tokens.size() / ans.decode_seconds : 0;
    std::fprintf(stderr, "[%sgenerated %zu tokens, %.1f tok/s, stop: %s]\n",
                 qa_mode ? ("question " + std::to_string(i + 1) + ": ").c_str() : "", ans.tokens.size(), tg,
                 ans.stop_reason.c_str());
  }
  std::fprintf(stderr, "[prompt %lld tokens, %.1f tok/s | KV cache %.2f MB of %.2f MB (evicted %.1f%%) | press %s | %d threads]\n",
               (long long)r.n_context, r.context_seconds > 0 ? r.n_context / r.context_seconds : 0.0, r.kv_bytes_end / 1e6,
               r.kv_bytes_full_end / 1e6, 100 * r.evicted_fraction_end, press ? press->name().c_str() : "none",
               session.n_threads());
  return 0;
}

RegisterCommand reg("generate", "generate text from a prompt, or answer questions about a compressed context", [](CLI::App& sub) {
  auto a = std::make_shared<GenerateArgs>();
  a->m.add_to(sub);
  a->press.add_to(sub);
  sub.add_option("-p,--prompt", a->prompt, "prompt text");
  sub.add_option("-f,--file", a->file, "read the prompt from a file");
  sub.add_option("--context-file", a->context_file, "a context to compress once, then ask each --question on it");
  sub.add_option("--question", a->questions, "a question about --context-file (repeatable)");
  sub.add_option("--answer-prefix", a->answer_prefix, "text the answer starts with (after each --question)");
  sub.add_option("--kv-trace", a->kv_trace, "write the cache size after every generated token (CSV)");
  sub.add_flag("--chat", a->chat, "wrap the prompt in the model's chat template");
  sub.add_option("--system", a->system, "system message (with --chat)");
  sub.add_option("-n,--max-tokens", a->n, "maximum new tokens")->check(CLI::Range(0, 1 << 20));
  sub.add_option("--temp", a->temp, "temperature; 0 = greedy")->check(CLI::Range(0.0f, 100.0f));
  sub.add_option("--top-k", a->top_k, "top-k filter (0 = off)");
  sub.add_option("--top-p", a->top_p, "top-p filter (1 = off)")->check(CLI::Range(0.0f, 1.0f));
  sub.add_option("--min-p", a->min_p, "min-p filter (0 = off)")->check(CLI::Range(0.0f, 1.0f));
  sub.add_option("--seed", a->seed, "sampling seed");
  sub.add_option("--stop", a->stop, "stop string (repeatable)");
  sub.add_option("--save-cache", a->save_cache, "save the compressed context (the prompt, or --context-file) to a file");
  sub.add_option("--load-cache", a->load_cache, "start from a context saved with --save-cache (or /slots/save); -p continues it");
  sub.add_flag("--json", a->json, "print one JSON object with the text, tokens, timings and cache size");
  sub.add_flag("--kept-positions", a->kept_positions,
               "with --json: also list the positions kept after the context, per layer and KV head");
  sub.add_flag("--no-stream", a->no_stream, "print the answer at the end instead of streaming");
  return [a]() { return run_generate(*a); };
});

}  // namespace
}  // namespace kvzap::cli
