// Built-in chat formatters that reproduce, for plain text conversations, what the models' own Jinja
// templates render. Tools and tool calls are out of scope.
#include <cstdio>

#include "chat/chat_template.h"
#include "kvzap/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_text.h"

namespace kvzap {
namespace {

constexpr const char* kSmolLM2DefaultSystem = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

bool contains(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }
bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

std::string strip_newlines(std::string s, bool left, bool right) {
  if (right) s.erase(s.find_last_not_of('\n') + 1);  // npos + 1 == 0 clears an all-newline string
  if (left) s.erase(0, std::min(s.find_first_not_of('\n'), s.size()));
  return s;
}

// Python's str.isspace(), which Jinja's |trim uses.
bool is_python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

std::string jinja_trim(const std::string& s) {
  tok::CodepointText t;
  t.assign(s);
  size_t b = 0, e = t.cps.size();
  while (b < e && is_python_space(t.cps[b])) ++b;
  while (e > b && is_python_space(t.cps[e - 1])) --e;
  return s.substr(t.byte_at[b], t.byte_at[e] - t.byte_at[b]);
}

// json.dumps(s, ensure_ascii=False), which the HF chat-template environment uses for |tojson.
std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += (char)c;
        }
    }
  }
  return out + "\"";
}

std::string chatml_turn(const std::string& role, const std::string& content) {
  return "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
}

std::string render_chatml(const std::vector<ChatMessage>& msgs, const ChatOptions& opt, bool smollm2_system) {
  std::string out;
  if (smollm2_system && !msgs.empty() && msgs[0].role != "system") out += chatml_turn("system", kSmolLM2DefaultSystem);
  for (const ChatMessage& m : msgs) out += chatml_turn(m.role, m.content);
  if (opt.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

bool is_tool_response(const ChatMessage& m) {
  return starts_with(m.content, "<tool_response>") && ends_with(m.content, "</tool_response>");
}

std::string render_qwen3(const std::vector<ChatMessage>& msgs, const ChatOptions& opt) {
  std::string out;
  const size_t n = msgs.size();
  if (n > 0 && msgs[0].role == "system") out += chatml_turn("system", msgs[0].content);
  // Reasoning is kept only for assistant turns after the last real user query.
  size_t last_query = n == 0 ? 0 : n - 1;
  for (size_t i = n; i-- > 0;) {
    if (msgs[i].role == "user" && !is_tool_response(msgs[i])) {
      last_query = i;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      out += chatml_turn(m.role, m.content);
    } else if (m.role == "assistant") {
      std::string content = m.content, reasoning;
      if (const size_t close = m.content.find("</think>"); close != std::string::npos) {
        content = strip_newlines(m.content.substr(m.content.rfind("</think>") + 8), true, false);
        std::string before = strip_newlines(m.content.substr(0, close), false, true);
        const size_t open = before.rfind("<think>");
        if (open != std::string::npos) before = before.substr(open + 7);
        reasoning = strip_newlines(before, true, false);
      }
      out += "<|im_start|>" + m.role + "\n";
      if (i > last_query && (i + 1 == n || !reasoning.empty()))
        out += "<think>\n" + strip_newlines(reasoning, true, true) + "\n</think>\n\n" +
               strip_newlines(content, true, false);
      else
        out += content;
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == n || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (opt.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!opt.enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

std::string render_llama31(const std::vector<ChatMessage>& msgs, const ChatOptions& opt) {
  std::string out = "<|begin_of_text|>";
  size_t first = 0;
  std::string system;
  if (!msgs.empty() && msgs[0].role == "system") {
    system = jinja_trim(msgs[0].content);
    first = 1;
  }
  out += "<|start_header_id|>system<|end_header_id|>\n\n";
  out += "Cutting Knowledge Date: December 2023\n";
  out += "Today Date: " + opt.date + "\n\n";
  out += system + "<|eot_id|>";
  for (size_t i = first; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "tool" || m.role == "ipython")  // a string is "iterable" to Jinja, so it is JSON-quoted
      out += "<|start_header_id|>ipython<|end_header_id|>\n\n" + json_quote(m.content) + "<|eot_id|>";
    else
      out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + jinja_trim(m.content) + "<|eot_id|>";
  }
  if (opt.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// Gemma's turn format (what Gemma 3's own template renders for plain text): BOS, a system message folded
// into the first user turn, assistant turns under the role "model", contents trimmed.
std::string render_gemma(const std::vector<ChatMessage>& msgs, const ChatOptions& opt) {
  std::string out = "<bos>";
  size_t first = 0;
  std::string prefix;
  if (!msgs.empty() && msgs[0].role == "system") {
    prefix = msgs[0].content + "\n\n";
    first = 1;
  }
  for (size_t i = first; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    const std::string role = m.role == "assistant" ? "model" : m.role;
    out += "<start_of_turn>" + role + "\n" + (i == first ? prefix : "") + jinja_trim(m.content) + "<end_of_turn>\n";
  }
  if (opt.add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

}  // namespace

ChatFormat detect_chat_format(const TokenizerVocab& v) {
  const std::string& t = v.chat_template;
  if (contains(t, "<|start_header_id|>")) return ChatFormat::Llama31;
  if (contains(t, "<|im_start|>")) {
    if (contains(t, "<think>")) return ChatFormat::Qwen3;
    if (contains(t, "SmolLM")) return ChatFormat::ChatML_SmolLM2;
    return ChatFormat::ChatML;
  }
  if (contains(t, "<start_of_turn>")) return ChatFormat::Gemma;
  // No (recognisable) template text: fall back on the vocabulary's turn markers.
  for (const std::string& tok : v.tokens) {
    if (tok == "<|start_header_id|>") return ChatFormat::Llama31;
  }
  for (const std::string& tok : v.tokens) {
    if (tok == "<|im_start|>") return ChatFormat::ChatML;
  }
  for (const std::string& tok : v.tokens) {
    if (tok == "<start_of_turn>") return ChatFormat::Gemma;
  }
  throw Error("no built-in chat format matches this model's chat template (choose one: smollm2, chatml, qwen3, llama3.1, gemma)");
}

ChatFormat chat_format_from_name(const std::string& name) {
  if (name == "smollm2") return ChatFormat::ChatML_SmolLM2;
  if (name == "chatml") return ChatFormat::ChatML;
  if (name == "qwen3") return ChatFormat::Qwen3;
  if (name == "llama3.1" || name == "llama3") return ChatFormat::Llama31;
  if (name == "gemma") return ChatFormat::Gemma;
  throw Error("unknown chat format '" + name + "' (choose one: smollm2, chatml, qwen3, llama3.1, gemma)");
}

const char* chat_format_name(ChatFormat fmt) {
  switch (fmt) {
    case ChatFormat::ChatML_SmolLM2: return "smollm2";
    case ChatFormat::ChatML: return "chatml";
    case ChatFormat::Qwen3: return "qwen3";
    case ChatFormat::Llama31: return "llama3.1";
    case ChatFormat::Gemma: return "gemma";
  }
  return "?";
}

std::string apply_chat_template(ChatFormat fmt, const std::vector<ChatMessage>& msgs, const ChatOptions& opt) {
  switch (fmt) {
    case ChatFormat::ChatML_SmolLM2: return render_chatml(msgs, opt, true);
    case ChatFormat::ChatML: return render_chatml(msgs, opt, false);
    case ChatFormat::Qwen3: return render_qwen3(msgs, opt);
    case ChatFormat::Llama31: return render_llama31(msgs, opt);
    case ChatFormat::Gemma: return render_gemma(msgs, opt);
  }
  throw Error("unknown chat format");
}

}  // namespace kvzap
