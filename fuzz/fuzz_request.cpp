// The server's request parsing (src/server/request.*): an HTTP body through parse_body and every
// endpoint's parser, as the HTTP layer calls them. Only ApiError may come out; anything else (a
// nlohmann type_error, std::out_of_range...) would be a 500 instead of a 400, and counts as a crash.
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "server/api_error.h"
#include "server/request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvzap::server;
  const std::string text(reinterpret_cast<const char*>(data), size);
  nlohmann::json body;
  try {
    body = parse_body(text);
  } catch (const ApiError& e) {
    if (e.status() != 400) __builtin_trap();
    return 0;
  }
  RequestLimits limits;
  limits.n_vocab = 49152;
  auto guarded = [](auto&& f) {
    try {
      f();
    } catch (const ApiError& e) {
      if (e.status() != 400) __builtin_trap();
      (void)dump_json(e.body());
    }
  };
  guarded([&] {
    const CompletionRequest r = parse_chat_request(body, limits);
    if (r.max_tokens < 1 || r.max_tokens > limits.max_tokens) __builtin_trap();
    if (r.stop.size() > limits.max_stop) __builtin_trap();
  });
  guarded([&] {
    const CompletionRequest r = parse_completion_request(body, limits);
    for (int32_t id : r.prompt_ids)
      if (id < 0 || id >= limits.n_vocab) __builtin_trap();
  });
  guarded([&] { (void)parse_tokenize_request(body); });
  guarded([&] {
    for (int32_t id : parse_detokenize_request(body, limits.n_vocab))
      if (id < 0 || id >= limits.n_vocab) __builtin_trap();
  });
  guarded([&] {
    const std::string name = parse_slot_filename(body);
    if (name.find('/') != std::string::npos || name[0] == '.') __builtin_trap();
  });
  guarded([&] {
    if (body.is_object() && body.contains("kv_compression")) (void)parse_kv_compression(body["kv_compression"]);
    else (void)parse_kv_compression(body);
  });
  (void)dump_json(body);
  return 0;
}
