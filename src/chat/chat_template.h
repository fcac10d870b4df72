// Chat templates: built-in formatters for the supported families, chosen from a model file's template
// text (detect_chat_format) or by name. The Jinja interpreter (jinja.h) renders a file's own template;
// chat_prompt.h turns messages into token ids with content kept as text.
#pragma once
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kvzap {

struct ChatMessage {
  std::string role;     // system | user | assistant
  std::string content;
};
enum class ChatFormat { ChatML_SmolLM2, Qwen3, Llama31, ChatML, Gemma };
ChatFormat detect_chat_format(const TokenizerVocab& v);
ChatFormat chat_format_from_name(const std::string& name);  // "smollm2" | "chatml" | "qwen3" | "llama3.1" | "gemma"
const char* chat_format_name(ChatFormat fmt);
struct ChatOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = true;         // Qwen3
  std::string date = "26 Jul 2024";    // Llama-3.1 "Today Date"
};
std::string apply_chat_template(ChatFormat fmt, const std::vector<ChatMessage>& msgs,
                                const ChatOptions& opt = {});

}  // namespace kvzap
