// Chat-template rendering: the built-in formatters (ChatML/SmolLM2, Qwen3, Llama 3.1, ChatML) on
// arbitrary messages, and the format detection on an arbitrary template text.
// Input: byte 0 picks the format and the options; the rest is split at "--8<--" lines into the
// template text, then role, content, role, content...
// (The Jinja template engine, src/tokenizer/jinja.*, gets its own harness once it lands.)
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_template.h"
#include "fuzz_common.h"
#include "kvzap/error.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvzap;
  if (size == 0) return 0;
  const uint8_t sel = data[0];
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  TokenizerVocab v;
  v.tokens = {"a"};
  v.chat_template = std::string(fuzz::next_part(rest));
  std::vector<ChatMessage> msgs;
  while (!rest.empty() && msgs.size() < 64) {
    ChatMessage m;
    m.role = std::string(fuzz::next_part(rest));
    m.content = std::string(fuzz::next_part(rest));
    msgs.push_back(std::move(m));
  }
  ChatOptions opt;
  opt.add_generation_prompt = sel & 4;
  opt.enable_thinking = sel & 8;
  if (sel & 16) opt.date = "";
  const ChatFormat formats[] = {ChatFormat::ChatML_SmolLM2, ChatFormat::Qwen3, ChatFormat::Llama31, ChatFormat::ChatML};
  try {
    (void)apply_chat_template(detect_chat_format(v), msgs, opt);
  } catch (const Error&) {
  }
  try {
    const std::string out = apply_chat_template(formats[sel & 3], msgs, opt);
    // Every message's content must appear in the rendering unless the format drops it (Qwen3 strips
    // an assistant turn's thinking; formatters trim whitespace), so only check the size bound.
    size_t total = 0;
    for (const ChatMessage& m : msgs) total += m.role.size() + m.content.size();
    if (out.size() > 64 * 1024 + 4 * total + 512 * (msgs.size() + 1)) __builtin_trap();
  } catch (const Error&) {
  }
  try {
    (void)chat_format_from_name(v.chat_template);
  } catch (const Error&) {
  }
  return 0;
}
