// Parsing and validation of OpenAI-style request bodies, as pure functions (no model, no HTTP), so every
// rule is unit-testable. Each violation throws ApiError (400) naming the field and what was expected.
// Tokenizing and the context-length check come later (prepare.h): they need the model.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "press/press_spec.h"

#include "chat/chat_template.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

namespace kvzap::server {

struct RequestLimits {
  int32_t n_vocab = 0;            // token ids must be in [0, n_vocab)
  int max_tokens = 4096;          // largest max_tokens accepted
  int default_max_tokens = 256;   // when the request gives none
  size_t max_stop = 16;           // stop strings per request
  size_t max_stop_bytes = 512;    // bytes per stop string
  size_t max_messages = 4096;
  size_t max_prompt_ids = 1 << 20;  // token ids in a token-array prompt
};

// The per-request `kv_compression` object: a PressSpecPatch (press/press_spec.h); fields not given fall
// back to the server's default press.
using KvCompressionSpec = PressSpecPatch;

enum class Endpoint { Chat, Completion };

struct CompletionRequest {
  Endpoint endpoint = Endpoint::Chat;
  std::string model;
  std::vector<ChatMessage> messages;   // chat
  std::optional<std::string> prompt_text;  // completion: a string prompt...
  std::vector<int32_t> prompt_ids;         // ...or token ids
  int max_tokens = 256;
  SamplerOptions sampling;
  bool has_seed = false;
  std::vector<std::string> stop;
  bool ignore_eos = false;  // llama.cpp's extension: generate past end-of-generation tokens (benchmarks)
  bool stream = false;
  bool include_usage = false;
  std::optional<KvCompressionSpec> kv_compression;
};

CompletionRequest parse_chat_request(const nlohmann::json& body, const RequestLimits& limits);
CompletionRequest parse_completion_request(const nlohmann::json& body, const RequestLimits& limits);
KvCompressionSpec parse_kv_compression(const nlohmann::json& v);

struct TokenizeRequest {
  std::string content;
  bool add_special = false, parse_special = true, with_pieces = false;
};
TokenizeRequest parse_tokenize_request(const nlohmann::json& body);
std::vector<int32_t> parse_detokenize_request(const nlohmann::json& body, int32_t n_vocab);

// A slot file name: plain file name characters only, no directories, no "..", at most 128 bytes.
std::string parse_slot_filename(const nlohmann::json& body);

// Parses a request body; malformed JSON (including invalid UTF-8 in strings) -> 400.
nlohmann::json parse_body(const std::string& text);

}  // namespace kvzap::server
