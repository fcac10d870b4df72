#include "server/responses.h"

namespace kvzap::server {

using nlohmann::json;

namespace {

json envelope(const ResponseShape& s, bool chunk) {
  const char* object = s.endpoint == Endpoint::Chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                    : "text_completion";
  return {{"id", s.id}, {"object", object}, {"created", s.created}, {"model", s.model}, {"system_fingerprint", "kvzap"}};
}

}  // namespace

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"kv_compression",
           {{"press", u.kv.press}, {"evicted_fraction", u.kv.evicted_fraction}, {"kv_bytes", u.kv.kv_bytes}, {"kv_bytes_full", u.kv.kv_bytes_full}}}};
}

json full_response(const ResponseShape& s, const std::string& text, const std::string& finish_reason, const Usage& u) {
  json r = envelope(s, false);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
  if (s.endpoint == Endpoint::Chat) choice["message"] = {{"role", "assistant"}, {"content", text}};
  else choice["text"] = text;
  r["choices"] = json::array({choice});
  r["usage"] = usage_json(u);
  return r;
}

json role_chunk(const ResponseShape& s) {
  json r = envelope(s, true);
  r["choices"] = json::array({{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
  return r;
}

json text_chunk(const ResponseShape& s, const std::string& text, const json& finish_reason) {
  json r = envelope(s, true);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
  if (s.endpoint == Endpoint::Chat) choice["delta"] = text.empty() && !finish_reason.is_null() ? json::object() : json{{"content", text}};
  else choice["text"] = text;
  r["choices"] = json::array({choice});
  return r;
}

json usage_chunk(const ResponseShape& s, const Usage& u) {
  json r = envelope(s, true);
  r["choices"] = json::array();
  r["usage"] = usage_json(u);
  return r;
}

}  // namespace kvzap::server
