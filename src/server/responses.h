// OpenAI response bodies and SSE chunks (chat.completion / text_completion and their .chunk forms),
// with usage extended by prompt_tokens_details.cached_tokens and kv_compression.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "server/job.h"
#include "server/request.h"

namespace kvzap::server {

struct ResponseShape {
  Endpoint endpoint;
  std::string id;
  int64_t created;
  std::string model;
  bool include_usage;
};

nlohmann::json usage_json(const Usage& u);
nlohmann::json full_response(const ResponseShape& s, const std::string& text, const std::string& finish_reason, const Usage& u);
// Chat only: the first chunk, delta {"role": "assistant", "content": ""}.
nlohmann::json role_chunk(const ResponseShape& s);
// A content chunk (finish_reason null) or the final one (empty text, the reason).
nlohmann::json text_chunk(const ResponseShape& s, const std::string& text, const nlohmann::json& finish_reason);
// The usage chunk: choices [] and the full usage (stream_options.include_usage).
nlohmann::json usage_chunk(const ResponseShape& s, const Usage& u);
inline std::string sse_frame(const nlohmann::json& j) { return "data: " + dump_json(j) + "\n\n"; }

}  // namespace kvzap::server
