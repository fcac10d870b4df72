// The kvpress pipeline: prefill a context once under a press (compressing it), then answer one or more
// questions on the same compressed cache. Question tokens come after compression.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "engine/session.h"
#include "press/press.h"

namespace kvzap {

struct ContextPrompt {
  std::vector<int32_t> context_ids;                // chat-template prefix + context
  std::vector<std::vector<int32_t>> question_ids;  // per question: separator + question + turn end + answer prefix
};

// With `chat`, the user turn is context + "\n\n" + question (kvpress's split: the context part ends
// where the question starts); without it, the raw text (BOS per the model) and "\n\n" + question + "\n".
ContextPrompt build_context_prompt(const Tokenizer& tok, const std::string& context,
                                   const std::vector<std::string>& questions, bool chat,
                                   const std::string& answer_prefix = "");

struct QaResult {
  std::vector<GenerateResult> answers;
  int64_t n_context = 0;
  double context_seconds = 0;      // prefill + compression
  double evicted_fraction = 0;     // after the context was compressed
  int64_t kv_bytes = 0, kv_bytes_full = 0;  // after the context was compressed
  std::vector<std::vector<int64_t>> kv_lengths;  // [layer][KV head] kept entries after compression
  // [layer][KV head] the positions kept after compression, ascending (filled when asked: the parity check)
  std::vector<std::vector<std::vector<int32_t>>> kept_positions;
  double evicted_fraction_end = 0; // after the last answer (differs with decoding pruning)
  int64_t kv_bytes_end = 0, kv_bytes_full_end = 0;
};

// on_text(question_index, piece) streams answers; return false to stop that answer.
QaResult answer_questions(Session& s, Press* press, const ContextPrompt& p, const GenerateOptions& g,
                          const std::function<bool(size_t, const std::string&)>& on_text = nullptr,
                          bool record_kept_positions = false);

}  // namespace kvzap
