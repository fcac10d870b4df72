#include "server/request.h"

#include <cctype>
#include <cmath>
#include <limits>

#include "common/json_fields.h"
#include "kvzap/error.h"
#include "server/api_error.h"

namespace kvzap::server {
namespace {

using nlohmann::json;

// The shared field readers (common/json_fields.h), their errors as 400s.
template <class F>
auto as_400(F&& read) -> decltype(read()) {
  try {
    return read();
  } catch (const Error& e) {
    throw invalid_request(e.what());
  }
}
[[noreturn]] void wrong_type(const std::string& field, const char* expected, const json& v) {
  as_400([&] { json_fields::wrong_type(field, expected, v); });
  throw invalid_request(field);  // not reached: wrong_type always throws
}
bool get_bool(const json& v, const std::string& f) { return as_400([&] { return json_fields::get_bool(v, f); }); }
std::string get_string(const json& v, const std::string& f) { return as_400([&] { return json_fields::get_string(v, f); }); }
double get_number(const json& v, const std::string& f, double lo, double hi) {
  return as_400([&] { return json_fields::get_number(v, f, lo, hi); });
}
int64_t get_integer(const json& v, const std::string& f, int64_t lo, int64_t hi) {
  return as_400([&] { return json_fields::get_integer(v, f, lo, hi); });
}

int32_t get_token_id(const json& v, const std::string& field, int32_t n_vocab) {
  if (!v.is_number_integer() && !v.is_number_unsigned()) wrong_type(field, "a token id (integer)", v);
  const bool neg = v.is_number_integer() && v.get<int64_t>() < 0;
  if (neg || v.get<uint64_t>() >= (uint64_t)n_vocab)
    throw invalid_request("'" + field + "': token id " + v.dump() + " is out of range [0, " + std::to_string(n_vocab) + ")");
  return (int32_t)v.get<int64_t>();
}

const json* find(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() ? nullptr : &*it;
}

// Message content: a string, or an array of {"type": "text", "text": ...} parts (concatenated).
std::string message_content(const json& v, const std::string& field) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) wrong_type(field, "a string or an array of text parts", v);
  std::string out;
  for (size_t i = 0; i < v.size(); i++) {
    const json& part = v[i];
    const std::string pf = field + "[" + std::to_string(i) + "]";
    if (!part.is_object()) wrong_type(pf, "an object", part);
    const json* type = find(part, "type");
    if (!type) throw invalid_request("'" + pf + ".type' is required");
    const std::string t = get_string(*type, pf + ".type");
    if (t != "text") throw not_supported("'" + pf + ".type' = \"" + t + "\": only text parts are supported");
    const json* text = find(part, "text");
    if (!text) throw invalid_request("'" + pf + ".text' is required");
    out += get_string(*text, pf + ".text");
  }
  return out;
}

// Fields shared by both endpoints: sampling, limits, stop strings, streaming, kv_compression.
void parse_common(const json& body, const RequestLimits& limits, CompletionRequest& r) {
  if (const json* v = find(body, "model"); v && !v->is_null()) r.model = get_string(*v, "model");
  r.max_tokens = limits.default_max_tokens;
  for (const char* key : {"max_tokens", "max_completion_tokens"})
    if (const json* v = find(body, key); v && !v->is_null()) r.max_tokens = (int)get_integer(*v, key, 1, limits.max_tokens);
  if (const json* v = find(body, "n"); v && !v->is_null()) {
    if (get_integer(*v, "n", 1, std::numeric_limits<int64_t>::max()) != 1)
      throw not_supported("'n' must be 1: this server returns one choice per request");
  }
  if (const json* v = find(body, "temperature"); v && !v->is_null())
    r.sampling.temperature = (float)get_number(*v, "temperature", 0, 2);
  if (const json* v = find(body, "top_p"); v && !v->is_null()) r.sampling.top_p = (float)get_number(*v, "top_p", 0, 1);
  if (const json* v = find(body, "min_p"); v && !v->is_null()) r.sampling.min_p = (float)get_number(*v, "min_p", 0, 1);
  if (const json* v = find(body, "top_k"); v && !v->is_null())
    r.sampling.top_k = (int)get_integer(*v, "top_k", 0, std::numeric_limits<int32_t>::max());
  if (const json* v = find(body, "seed"); v && !v->is_null()) {
    r.sampling.seed = (uint64_t)get_integer(*v, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
    r.has_seed = true;
  }
  if (const json* v = find(body, "stop"); v && !v->is_null()) {
    if (v->is_string()) {
      r.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (v->size() > limits.max_stop)
        throw invalid_request("'stop' has " + std::to_string(v->size()) + " strings; at most " + std::to_string(limits.max_stop) + " are allowed");
      for (size_t i = 0; i < v->size(); i++) r.stop.push_back(get_string((*v)[i], "stop[" + std::to_string(i) + "]"));
    } else {
      wrong_type("stop", "a string or an array of strings", *v);
    }
    for (const auto& s : r.stop) {
      if (s.empty()) throw invalid_request("'stop' strings must not be empty");
      if (s.size() > limits.max_stop_bytes)
        throw invalid_request("a 'stop' string is " + std::to_string(s.size()) + " bytes; at most " + std::to_string(limits.max_stop_bytes) + " are allowed");
    }
  }
  if (const json* v = find(body, "ignore_eos"); v && !v->is_null()) r.ignore_eos = get_bool(*v, "ignore_eos");
  if (const json* v = find(body, "stream"); v && !v->is_null()) r.stream = get_bool(*v, "stream");
  if (const json* v = find(body, "stream_options"); v && !v->is_null()) {
    if (!v->is_object()) wrong_type("stream_options", "an object", *v);
    if (const json* u = find(*v, "include_usage"); u && !u->is_null()) r.include_usage = get_bool(*u, "stream_options.include_usage");
  }
  if (const json* v = find(body, "logprobs"); v && !v->is_null()) {
    const bool wants = v->is_boolean() ? v->get<bool>() : (v->is_number() ? v->get<double>() != 0 : (wrong_type("logprobs", "a boolean", *v), false));
    if (wants) throw not_supported("'logprobs' is not supported by this server");
  }
  if (const json* v = find(body, "tools"); v && !v->is_null()) {
    if (!v->is_array()) wrong_type("tools", "an array", *v);
    if (!v->empty()) throw not_supported("'tools' (function calling) is not supported by this server");
  }
  // Accepted by OpenAI but not implemented here: refused rather than silently ignored.
  if (const json* v = find(body, "logit_bias"); v && !v->is_null()) {
    if (!v->is_object()) wrong_type("logit_bias", "an object", *v);
    if (!v->empty()) throw not_supported("'logit_bias' is not supported by this server");
  }
  if (const json* v = find(body, "top_logprobs"); v && !v->is_null()) {
    if (get_integer(*v, "top_logprobs", 0, 20) != 0) throw not_supported("'top_logprobs' is not supported by this server");
  }
  if (const json* v = find(body, "tool_choice"); v && !v->is_null()) {
    // Without tools, "none" and "auto" mean the same as no tool_choice.
    if (!v->is_string() || (v->get<std::string>() != "none" && v->get<std::string>() != "auto"))
      throw not_supported("'tool_choice' other than \"none\" or \"auto\" is not supported by this server (no function calling)");
  }
  if (const json* v = find(body, "response_format"); v && !v->is_null()) {
    if (!v->is_object()) wrong_type("response_format", "an object", *v);
    const json* t = find(*v, "type");
    if (t && get_string(*t, "response_format.type") != "text")
      throw not_supported("'response_format' other than {\"type\": \"text\"} is not supported by this server");
  }
  if (const json* v = find(body, "kv_compression"); v && !v->is_null()) r.kv_compression = parse_kv_compression(*v);
}

}  // namespace

KvCompressionSpec parse_kv_compression(const json& v) {
  try {
    return parse_press_spec_patch(v, "kv_compression", /*allow_host_paths=*/false);
  } catch (const Error& e) {
    throw invalid_request(e.what());
  }
}

CompletionRequest parse_chat_request(const json& body, const RequestLimits& limits) {
  if (!body.is_object()) wrong_type("request body", "a JSON object", body);
  CompletionRequest r;
  r.endpoint = Endpoint::Chat;
  const json* msgs = find(body, "messages");
  if (!msgs) throw invalid_request("'messages' is required");
  if (!msgs->is_array()) wrong_type("messages", "an array", *msgs);
  if (msgs->empty()) throw invalid_request("'messages' must not be empty");
  if (msgs->size() > limits.max_messages)
    throw invalid_request("'messages' has " + std::to_string(msgs->size()) + " entries; at most " + std::to_string(limits.max_messages) + " are allowed");
  for (size_t i = 0; i < msgs->size(); i++) {
    const json& m = (*msgs)[i];
    const std::string f = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) wrong_type(f, "an object", m);
    const json* role = find(m, "role");
    if (!role) throw invalid_request("'" + f + ".role' is required");
    std::string rs = get_string(*role, f + ".role");
    if (rs == "developer") rs = "system";  // OpenAI's newer name for the system role
    if (rs != "system" && rs != "user" && rs != "assistant")
      throw invalid_request("'" + f + ".role' must be system, developer, user or assistant, got \"" + rs + "\"");
    const json* content = find(m, "content");
    if (!content) throw invalid_request("'" + f + ".content' is required");
    r.messages.push_back({rs, message_content(*content, f + ".content")});
  }
  parse_common(body, limits, r);
  return r;
}

CompletionRequest parse_completion_request(const json& body, const RequestLimits& limits) {
  if (!body.is_object()) wrong_type("request body", "a JSON object", body);
  CompletionRequest r;
  r.endpoint = Endpoint::Completion;
  const json* p = find(body, "prompt");
  if (!p) throw invalid_request("'prompt' is required");
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
  } else if (p->is_array()) {
    if (p->empty()) throw invalid_request("'prompt' must not be empty");
    if ((*p)[0].is_string()) {
      if (p->size() != 1) throw not_supported("'prompt' holds " + std::to_string(p->size()) + " prompts: only one prompt per request is supported");
      r.prompt_text = (*p)[0].get<std::string>();
    } else {
      if (p->size() > limits.max_prompt_ids) throw invalid_request("'prompt' has too many token ids");
      for (size_t i = 0; i < p->size(); i++) {
        const json& t = (*p)[i];
        if (t.is_array()) throw not_supported("'prompt' holds several token lists: only one prompt per request is supported");
        r.prompt_ids.push_back(get_token_id(t, "prompt[" + std::to_string(i) + "]", limits.n_vocab));
      }
    }
  } else {
    wrong_type("prompt", "a string, an array of token ids or an array of one string", *p);
  }
  if (r.prompt_text && r.prompt_text->empty()) throw invalid_request("'prompt' must not be empty");
  if (const json* v = find(body, "echo"); v && !v->is_null() && get_bool(*v, "echo"))
    throw not_supported("'echo' is not supported by this server");
  if (const json* v = find(body, "suffix"); v && !v->is_null()) throw not_supported("'suffix' is not supported by this server");
  if (const json* v = find(body, "best_of"); v && !v->is_null() && get_integer(*v, "best_of", 1, 1 << 20) != 1)
    throw not_supported("'best_of' must be 1");
  parse_common(body, limits, r);
  return r;
}

TokenizeRequest parse_tokenize_request(const json& body) {
  if (!body.is_object()) wrong_type("request body", "a JSON object", body);
  TokenizeRequest r;
  const json* c = find(body, "content");
  if (!c) throw invalid_request("'content' is required");
  r.content = get_string(*c, "content");
  if (const json* v = find(body, "add_special"); v && !v->is_null()) r.add_special = get_bool(*v, "add_special");
  if (const json* v = find(body, "parse_special"); v && !v->is_null()) r.parse_special = get_bool(*v, "parse_special");
  if (const json* v = find(body, "with_pieces"); v && !v->is_null()) r.with_pieces = get_bool(*v, "with_pieces");
  return r;
}

std::vector<int32_t> parse_detokenize_request(const json& body, int32_t n_vocab) {
  if (!body.is_object()) wrong_type("request body", "a JSON object", body);
  const json* t = find(body, "tokens");
  if (!t) throw invalid_request("'tokens' is required");
  if (!t->is_array()) wrong_type("tokens", "an array of token ids", *t);
  std::vector<int32_t> ids;
  ids.reserve(t->size());
  for (size_t i = 0; i < t->size(); i++) ids.push_back(get_token_id((*t)[i], "tokens[" + std::to_string(i) + "]", n_vocab));
  return ids;
}

std::string parse_slot_filename(const json& body) {
  if (!body.is_object()) wrong_type("request body", "a JSON object", body);
  const json* f = find(body, "filename");
  if (!f) throw invalid_request("'filename' is required");
  const std::string name = get_string(*f, "filename");
  if (name.empty() || name.size() > 128) throw invalid_request("'filename' must be 1 to 128 bytes");
  if (name == "." || name == ".." || name[0] == '.')
    throw invalid_request("'filename' must not start with '.'");
  for (unsigned char c : name)
    if (!(std::isalnum(c) || c == '-' || c == '_' || c == '.'))
      throw invalid_request("'filename' may only hold letters, digits, '-', '_' and '.' (a file name, not a path)");
  return name;
}

json parse_body(const std::string& text) {
  if (text.empty()) throw invalid_request("the request body is empty: expected a JSON object");
  try {
    return json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number such as 1e309
    std::string what = e.what();
    // nlohmann's message starts with "[json.exception.parse_error.101] "; keep the readable part.
    if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    throw invalid_request("malformed JSON: " + what);
  }
}

}  // namespace kvzap::server
