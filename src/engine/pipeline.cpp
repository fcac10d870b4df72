#include "engine/pipeline.h"

#include <chrono>

#include "chat/chat_prompt.h"

namespace kvzap {

ContextPrompt build_context_prompt(const Tokenizer& tok, const std::string& context,
                                   const std::vector<std::string>& questions, bool chat,
                                   const std::string& answer_prefix) {
  ContextPrompt p;
  if (chat) {
    const ChatPrompt prompt(tok);
    const ChatPrompt::UserTurn turn = prompt.user_turn(ChatOptions{true, false});
    p.context_ids = prompt.encode(turn.prefix + context);  // BOS as the one prompt builder decides
    for (const std::string& q : questions)
      p.question_ids.push_back(tok.encode("\n\n" + q + turn.suffix + answer_prefix, false, true));
  } else {
    p.context_ids = tok.encode(context, tok.vocab().add_bos, true);
    for (const std::string& q : questions) p.question_ids.push_back(tok.encode("\n\n" + q + "\n" + answer_prefix, false, true));
  }
  return p;
}

QaResult answer_questions(Session& s, Press* press, const ContextPrompt& p, const GenerateOptions& g,
                          const std::function<bool(size_t, const std::string&)>& on_text,
                          bool record_kept_positions) {
  QaResult r;
  r.n_context = (int64_t)p.context_ids.size();
  const auto t0 = std::chrono::steady_clock::now();
  s.prefill_context(p.context_ids, press);
  r.context_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const KvCache& c = s.cache();
  r.evicted_fraction = c.evicted_fraction();
  r.kv_bytes = c.bytes_resident();
  r.kv_bytes_full = c.bytes_full();
  r.kv_lengths.assign((size_t)c.n_layer(), std::vector<int64_t>((size_t)c.n_head_kv()));
  for (int l = 0; l < c.n_layer(); l++)
    for (int h = 0; h < c.n_head_kv(); h++) r.kv_lengths[l][h] = c.length(l, h);
  if (record_kept_positions) {
    r.kept_positions.assign((size_t)c.n_layer(), std::vector<std::vector<int32_t>>((size_t)c.n_head_kv()));
    for (int l = 0; l < c.n_layer(); l++)
      for (int h = 0; h < c.n_head_kv(); h++)
        for (int64_t i = 0; i < c.length(l, h); i++) r.kept_positions[l][h].push_back(c.position_at(l, h, i));
  }
  // One copy-on-write fork of the compressed context per question: pruning while answering one
  // question cannot change what the next one sees.
  for (size_t i = 0; i < p.question_ids.size(); i++) {
    std::unique_ptr<Sequence> fork = s.sequence().fork();
    std::function<bool(const std::string&)> cb;
    if (on_text) cb = [&, i](const std::string& piece) { return on_text(i, piece); };
    r.answers.push_back(Session::generate_on(*fork, p.question_ids[i], g, cb));
    if (i + 1 == p.question_ids.size()) {
      r.evicted_fraction_end = fork->cache().evicted_fraction();
      r.kv_bytes_end = fork->cache().bytes_resident();
      r.kv_bytes_full_end = fork->cache().bytes_full();
    }
  }
  if (p.question_ids.empty()) {
    r.evicted_fraction_end = r.evicted_fraction;
    r.kv_bytes_end = r.kv_bytes;
    r.kv_bytes_full_end = r.kv_bytes_full;
  }
  return r;
}

}  // namespace kvzap
