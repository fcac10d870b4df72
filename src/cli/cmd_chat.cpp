// kvzap chat: an interactive conversation in the terminal. Each turn feeds only the tokens the cache
// has not seen yet (the rendered conversation minus what was already processed), optionally under a
// press that keeps pruning as the conversation grows.
#include <cstdio>
#include <iostream>
#include <memory>

#include "chat/chat_prompt.h"
#include "cli/cli_common.h"

namespace kvzap::cli {
namespace {

struct ChatArgs {
  ModelArgs m;
  PressArgs press;
  std::string system;
  int n = 512;
  float temp = 0.7f, top_p = 0.95f, min_p = 0.05f;
  int top_k = 40;
  uint64_t seed = 0;
};

int run_chat(const ChatArgs& a) {
  auto model = a.m.load_model();
  const Tokenizer& tok = model->tokenizer();
  const ChatPrompt prompt(tok);
  std::unique_ptr<Press> press = a.press.make(*model);
  if (press && !press->prunes_decoding())
    throw Error("chat needs a press that prunes while decoding: use a threshold press with --decode-press");
  Session session(*model, a.m.session_options());
  // The whole conversation is one open context: the press judges every token (it prunes while decoding).
  session.sequence().attach_press(press.get());
  session.sequence().begin_context();
  GenerateOptions g;
  g.max_new_tokens = a.n;
  g.sampling = {a.temp, a.top_k, a.top_p, a.min_p, a.seed};

  std::vector<ChatMessage> history;
  if (!a.system.empty()) history.push_back({"system", a.system});
  std::vector<int32_t> fed;  // tokens already in the cache, in order
  std::fprintf(stderr, "kvzap chat — %s, %d threads. Empty line or Ctrl-D to quit, /reset to start over.\n",
               model->config().name.c_str(), session.n_threads());
  std::string line;
  while (true) {
    std::fprintf(stderr, "\n> ");
    if (!std::getline(std::cin, line) || line.empty()) break;
    if (line == "/reset") {
      history.resize(a.system.empty() ? 0 : 1);
      fed.clear();
      session.reset();
      session.sequence().begin_context();
      continue;
    }
    size_t bad = 0;
    if (!is_valid_utf8(line, &bad)) {
      std::fprintf(stderr, "kvzap: error: invalid UTF-8 at byte %zu; message ignored\n", bad);
      continue;
    }
    history.push_back({"user", line});
    const std::vector<int32_t> all = prompt.encode(history);
    size_t common = 0;
    while (common < fed.size() && common < all.size() && fed[common] == all[common]) common++;
    if (common < fed.size()) {  // the re-rendered history tokenizes differently from here on
      if (session.cache().can_truncate((int32_t)common)) {
        session.rewind((int64_t)common);
      } else {  // a sliding-window layer already freed what the rewound position needs: start over
        session.reset();
        session.sequence().begin_context();
        common = 0;
      }
      fed.resize(common);
    }
    std::vector<int32_t> delta(all.begin() + (int64_t)common, all.end());
    if ((int64_t)all.size() + a.n >= session.n_ctx()) {
      std::fprintf(stderr, "kvzap: error: the conversation (%zu tokens) no longer fits the context of %lld tokens; /reset to continue\n",
                   all.size(), (long long)session.n_ctx());
      history.pop_back();
      continue;
    }
    GenerateResult r = session.generate(delta, g, [](const std::string& piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::printf("\n");
    fed = all;
    fed.insert(fed.end(), r.tokens.begin(), r.tokens.end());
    history.push_back({"assistant", r.text});
    std::fprintf(stderr, "[%zu tokens, %.1f tok/s | KV %.2f MB of %.2f MB]\n", r.tokens.size(),
                 r.decode_seconds > 0 ? r.tokens.size() / r.decode_seconds : 0.0, session.cache().bytes_resident() / 1e6,
                 session.cache().bytes_full() / 1e6);
  }
  return 0;
}

RegisterCommand reg("chat", "interactive chat in the terminal", [](CLI::App& sub) {
  auto a = std::make_shared<ChatArgs>();
  a->m.add_to(sub);
  a->press.add_to(sub);
  sub.add_option("--system", a->system, "system message");
  sub.add_option("-n,--max-tokens", a->n, "maximum new tokens per answer")->check(CLI::Range(1, 1 << 20));
  sub.add_option("--temp", a->temp, "temperature; 0 = greedy")->check(CLI::Range(0.0f, 100.0f));
  sub.add_option("--top-k", a->top_k, "top-k filter (0 = off)");
  sub.add_option("--top-p", a->top_p, "top-p filter (1 = off)")->check(CLI::Range(0.0f, 1.0f));
  sub.add_option("--min-p", a->min_p, "min-p filter (0 = off)")->check(CLI::Range(0.0f, 1.0f));
  sub.add_option("--seed", a->seed, "sampling seed");
  return [a]() { return run_chat(*a); };
});

}  // namespace
}  // namespace kvzap::cli
