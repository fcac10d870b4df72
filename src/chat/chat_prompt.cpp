#include "chat/chat_prompt.h"

#include <algorithm>

#include "kvzap/error.h"

namespace kvzap {

namespace {

// transformers fills `reasoning_content` (and `thinking`) from whichever of the reasoning fields a
// message has, so that every template finds the reasoning under the name it reads.
jinja::Value alias_reasoning_fields(jinja::Value messages) {
  if (!messages.is_array()) return messages;
  jinja::Array out;
  for (const jinja::Value& m : messages.arr()) {
    if (!m.is_object()) {
      out.push_back(m);
      continue;
    }
    const jinja::Value* reasoning = nullptr;
    for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
      const jinja::Value* v = m.obj().find(key);
      if (v && !v->is_none()) {
        reasoning = v;
        break;
      }
    }
    if (!reasoning) {
      out.push_back(m);
      continue;
    }
    jinja::Object o;
    o.set("thinking", *reasoning);
    for (const auto& kv : m.obj().items) o.set(kv.first, kv.second);
    o.set("reasoning_content", *reasoning);
    out.push_back(jinja::Value::object(std::move(o)));
  }
  return jinja::Value::array(std::move(out));
}

}  // namespace

std::string render_chat_template(const jinja::Template& tmpl, const nlohmann::ordered_json& messages,
                                 const TemplateOptions& opt) {
  if (!messages.is_array()) throw Error("chat template: messages must be a JSON array");
  jinja::Object vars;
  vars.set("messages", alias_reasoning_fields(jinja::from_json(messages)));
  vars.set("tools", jinja::Value::none());
  vars.set("documents", jinja::Value::none());
  vars.set("add_generation_prompt", jinja::Value(opt.add_generation_prompt));
  vars.set("bos_token", jinja::Value(opt.bos_token));
  vars.set("eos_token", jinja::Value(opt.eos_token));
  if (!opt.vars.is_null()) {
    if (!opt.vars.is_object()) throw Error("chat template: the extra variables must be a JSON object");
    for (auto it = opt.vars.begin(); it != opt.vars.end(); ++it) vars.set(it.key(), jinja::from_json(it.value()));
  }
  return tmpl.render(vars);
}

std::string render_chat_template(const std::string& tmpl, const nlohmann::ordered_json& messages,
                                 const TemplateOptions& opt) {
  return render_chat_template(jinja::Template(tmpl), messages, opt);
}

nlohmann::ordered_json messages_to_json(const std::vector<ChatMessage>& msgs) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const ChatMessage& m : msgs) a.push_back({{"role", m.role}, {"content", m.content}});
  return a;
}

namespace {

std::string special_text(const Tokenizer& tok, int32_t id) {
  if (id < 0 || id >= tok.n_vocab()) return "";
  return tok.token_bytes(id);
}

}  // namespace

ChatPrompt::ChatPrompt(const Tokenizer& tok) : tok_(tok) {
  bos_ = special_text(tok, tok.vocab().bos_id);
  eos_ = special_text(tok, tok.vocab().eos_id);
  if (!tok.vocab().chat_template.empty())
    tmpl_ = std::make_shared<const jinja::Template>(tok.vocab().chat_template);
  else
    fmt_ = detect_chat_format(tok.vocab());
}

ChatPrompt::ChatPrompt(const Tokenizer& tok, ChatFormat fmt) : tok_(tok), fmt_(fmt) {
  bos_ = special_text(tok, tok.vocab().bos_id);
  eos_ = special_text(tok, tok.vocab().eos_id);
}

std::string ChatPrompt::render(const std::vector<ChatMessage>& msgs, const ChatOptions& opt) const {
  if (!tmpl_) return apply_chat_template(fmt_, msgs, opt);
  TemplateOptions t;
  t.add_generation_prompt = opt.add_generation_prompt;
  t.bos_token = bos_;
  t.eos_token = eos_;
  // Only what differs from a template's own default is passed, as a caller of transformers would.
  if (!opt.enable_thinking) t.vars["enable_thinking"] = false;
  if (!opt.date.empty()) t.vars["date_string"] = opt.date;
  return render_chat_template(*tmpl_, messages_to_json(msgs), t);
}

std::vector<int32_t> ChatPrompt::encode(const std::string& rendered) const {
  const TokenizerVocab& v = tok_.vocab();
  const bool has_bos = !bos_.empty() && rendered.compare(0, bos_.size(), bos_) == 0;
  return tok_.encode(rendered, v.add_bos && v.bos_id >= 0 && !has_bos, /*parse_special=*/true);
}

namespace {
constexpr char kGuard[] = "\xEF\xB7\x90";  // U+FDD0
constexpr size_t kGuardLen = 3;

size_t utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }
}  // namespace

std::string guard_content(const std::string& content, const std::vector<std::string>& control_texts) {
  std::vector<uint8_t> mark(content.size() + 1, 0);  // mark[i]: a marker goes before byte i
  bool any = content.find(kGuard) != std::string::npos;
  for (const std::string& t : control_texts) {
    if (t.empty()) continue;
    const size_t first = utf8_len((unsigned char)t[0]);
    if (first >= t.size()) continue;  // a one-character token has no inside to mark (none known)
    for (size_t at = content.find(t); at != std::string::npos; at = content.find(t, at + 1)) {
      mark[at + first] = 1;
      any = true;
    }
  }
  if (!any) return content;
  std::string out;
  out.reserve(content.size() + 16);
  for (size_t i = 0; i < content.size();) {
    if (mark[i]) out += kGuard;
    if (content.compare(i, kGuardLen, kGuard) == 0) {
      out += kGuard;
      out += kGuard;
      i += kGuardLen;
      continue;
    }
    out += content[i++];
  }
  if (mark[content.size()]) out += kGuard;
  return out;
}

std::string strip_guards(const std::string& text, std::vector<size_t>& blocked) {
  blocked.clear();
  if (text.find(kGuard) == std::string::npos) return text;
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, kGuardLen, kGuard) != 0) {
      out += text[i++];
      continue;
    }
    if (text.compare(i + kGuardLen, kGuardLen, kGuard) == 0) {  // a doubled marker: the client's own character
      out += kGuard;
      i += 2 * kGuardLen;
      continue;
    }
    if (blocked.empty() || blocked.back() != out.size()) blocked.push_back(out.size());
    i += kGuardLen;
  }
  return out;
}

std::vector<int32_t> ChatPrompt::encode(const std::vector<ChatMessage>& msgs, const ChatOptions& opt) const {
  const std::vector<std::string> controls = tok_.control_texts();
  std::vector<ChatMessage> guarded = msgs;
  for (ChatMessage& m : guarded) m.content = guard_content(m.content, controls);
  std::vector<size_t> blocked;
  const std::string rendered = strip_guards(render(guarded, opt), blocked);
  const TokenizerVocab& v = tok_.vocab();
  const bool has_bos = !bos_.empty() && rendered.compare(0, bos_.size(), bos_) == 0;
  return tok_.encode(rendered, v.add_bos && v.bos_id >= 0 && !has_bos, /*parse_special=*/true, blocked);
}

ChatPrompt::UserTurn ChatPrompt::user_turn(const ChatOptions& opt) const {
  const std::string sentinel = "@@KVZAP-CONTEXT@@";
  const std::string rendered = render({{"user", sentinel}}, opt);
  const size_t at = rendered.find(sentinel);
  if (at == std::string::npos || rendered.find(sentinel, at + 1) != std::string::npos)
    throw Error("chat template does not keep the user message verbatim (cannot split the prompt around it)");
  return {rendered.substr(0, at), rendered.substr(at + sentinel.size())};
}

}  // namespace kvzap
