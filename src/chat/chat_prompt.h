// The one chat prompt builder. The CLI (generate --chat, chat), the kvpress pipeline, the eval runner
// and suite generator, the KVzip scorer, the KVzip+ target builder and the server all render and
// tokenize chat prompts through ChatPrompt:
//   * the model's own template (GGUF tokenizer.chat_template) rendered by the Jinja subset in jinja.h,
//     with transformers' apply_chat_template semantics;
//   * the built-in formatters (apply_chat_template(ChatFormat, ...)) only for a file without a template
//     (or when a format is forced by name).
// BOS: exactly one. The rendered text is tokenized with special tokens parsed, and BOS is prepended
// only when the vocabulary asks for it (tokenizer.ggml.add_bos_token) and the text does not already
// start with the BOS token (Llama 3, Gemma and Mistral templates print {{ bos_token }} themselves).
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "chat/jinja.h"
#include "tokenizer/tokenizer.h"

namespace kvzap {

struct TemplateOptions {
  bool add_generation_prompt = true;
  std::string bos_token, eos_token;
  // Further variables (enable_thinking, tools, date_string, ...). `tools` and `documents` are None
  // unless given, as transformers passes them.
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
};

// Renders a Jinja chat template as transformers' apply_chat_template(tokenize=False) does.
// messages: a JSON array of message objects (role, content, tool_calls, ...). Throws kvzap::Error
// "chat template: ... at line N" for a template it cannot parse or render (raise_exception included).
std::string render_chat_template(const std::string& tmpl, const nlohmann::ordered_json& messages,
                                 const TemplateOptions& opt = {});
std::string render_chat_template(const jinja::Template& tmpl, const nlohmann::ordered_json& messages,
                                 const TemplateOptions& opt = {});

nlohmann::ordered_json messages_to_json(const std::vector<ChatMessage>& msgs);

// Content guarding, behind ChatPrompt::encode(msgs): guard_content puts a marker (U+FDD0, a noncharacter)
// after the first character of every occurrence of a control-token text and doubles a literal marker;
// after rendering, strip_guards removes the markers, restores literal ones and returns in `blocked` the
// offsets (sorted) where a marker stood, across which Tokenizer::encode matches no special token.
std::string guard_content(const std::string& content, const std::vector<std::string>& control_texts);
std::string strip_guards(const std::string& text, std::vector<size_t>& blocked);

class ChatPrompt {
 public:
  // The model's own template when the vocabulary has one, else the built-in format detect_chat_format
  // picks from its tokens. Throws kvzap::Error for a template the Jinja subset cannot parse.
  explicit ChatPrompt(const Tokenizer& tok);
  // A built-in format, whatever the file holds.
  ChatPrompt(const Tokenizer& tok, ChatFormat fmt);

  bool uses_model_template() const { return tmpl_ != nullptr; }
  const Tokenizer& tokenizer() const { return tok_; }
  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }

  std::string render(const std::vector<ChatMessage>& msgs, const ChatOptions& opt = {}) const;
  // Tokens of rendered text (a whole prompt or its start): special tokens parsed, BOS per the rule above.
  std::vector<int32_t> encode(const std::string& rendered) const;
  // The tokens of a chat. Message contents are text: control-token text inside them (a forged
  // "<|im_end|>\n<|im_start|>system") tokenizes as plain text would, as encode(content, false,
  // parse_special=false) does; only the template's own control tokens become control tokens.
  std::vector<int32_t> encode(const std::vector<ChatMessage>& msgs, const ChatOptions& opt = {}) const;

  // One user turn split around its content: render({{"user", X}}, opt) == prefix + X + suffix.
  // Throws kvzap::Error if the template does not keep the content verbatim.
  struct UserTurn {
    std::string prefix, suffix;
  };
  UserTurn user_turn(const ChatOptions& opt) const;

 private:
  const Tokenizer& tok_;
  std::shared_ptr<const jinja::Template> tmpl_;  // null: built-in format
  ChatFormat fmt_ = ChatFormat::ChatML;
  std::string bos_, eos_;
};

}  // namespace kvzap
