// Request parsing and validation for `kvzap serve` (pure functions: no model, no HTTP): every bad field
// is a 400 ApiError naming the field; good requests come out with the right values.
#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "server/prepare.h"
#include "server/request.h"

namespace {

using namespace kvzap::server;
using nlohmann::json;

RequestLimits limits() {
  RequestLimits l;
  l.n_vocab = 1000;
  l.max_tokens = 512;
  return l;
}

json chat(json extra = json::object()) {
  json b = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

// The status and a fragment of the message a bad chat body must give.
void expect_chat_error(const json& body, int status, const std::string& fragment) {
  try {
    parse_chat_request(body, limits());
    FAIL() << "accepted: " << body.dump();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), status) << body.dump();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_TRUE(e.body()["error"].contains("message"));
    EXPECT_TRUE(e.body()["error"].contains("type"));
    EXPECT_TRUE(e.body()["error"].contains("code"));
  }
}

TEST(ServerRequest, ChatDefaultsAndFields) {
  CompletionRequest r = parse_chat_request(chat({{"max_tokens", 7}, {"temperature", 0}, {"top_p", 0.5}, {"top_k", 3},
                                                 {"min_p", 0.1}, {"seed", 42}, {"stop", "END"}, {"stream", true},
                                                 {"stream_options", {{"include_usage", true}}}}),
                                           limits());
  EXPECT_EQ(r.endpoint, Endpoint::Chat);
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].role, "user");
  EXPECT_EQ(r.messages[0].content, "hi");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 3);
  EXPECT_TRUE(r.has_seed);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_FALSE(r.kv_compression.has_value());
  EXPECT_EQ(parse_chat_request(chat(), limits()).max_tokens, limits().default_max_tokens);
}

TEST(ServerRequest, ContentPartsAndDeveloperRole) {
  json b = {{"messages", {{{"role", "developer"}, {"content", "be brief"}},
                          {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}}};
  CompletionRequest r = parse_chat_request(b, limits());
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "ab");
}

TEST(ServerRequest, KvCompression) {
  CompletionRequest r = parse_chat_request(chat({{"kv_compression", {{"press", "kvzap-mlp"}, {"threshold", -4}, {"window", 64}, {"decoding", true}}}}), limits());
  ASSERT_TRUE(r.kv_compression);
  EXPECT_EQ(*r.kv_compression->press, "kvzap-mlp");
  EXPECT_EQ(*r.kv_compression->threshold, -4);
  EXPECT_EQ(*r.kv_compression->window, 64);
  EXPECT_TRUE(*r.kv_compression->decoding);
  EXPECT_FALSE(r.kv_compression->ratio);
}

// sliding_layers (prune Gemma 3's local layers too) reaches the press and the prefix-cache key.
TEST(ServerRequest, KvCompressionSlidingLayers) {
  CompletionRequest r = parse_chat_request(chat({{"kv_compression", {{"press", "knorm"}, {"ratio", 0.5}, {"sliding_layers", true}}}}), limits());
  ASSERT_TRUE(r.kv_compression && r.kv_compression->sliding_layers);
  EXPECT_TRUE(*r.kv_compression->sliding_layers);
  ServerDefaults d;
  kvzap::PressSpec with, without;
  ASSERT_TRUE(resolve_press(r.kv_compression, d, with));
  EXPECT_TRUE(with.sliding_layers);
  r.kv_compression->sliding_layers = false;
  ASSERT_TRUE(resolve_press(r.kv_compression, d, without));
  EXPECT_FALSE(without.sliding_layers);
  EXPECT_NE(press_settings_key(true, with), press_settings_key(true, without));
  expect_chat_error({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"kv_compression", {{"sliding_layers", 1}}}}, 400,
                    "sliding_layers");
  KvCompressionSpec none;
  none.press = "none";
  none.sliding_layers = true;
  EXPECT_THROW(resolve_press(none, d, with), ApiError);
}

// sink_tokens (never evict the first N positions) reaches the press and the prefix-cache key.
TEST(ServerRequest, KvCompressionSinkTokens) {
  CompletionRequest r =
      parse_chat_request(chat({{"kv_compression", {{"press", "kvzap-mlp"}, {"threshold", -2}, {"sink_tokens", 4}}}}), limits());
  ASSERT_TRUE(r.kv_compression && r.kv_compression->sink_tokens);
  EXPECT_EQ(*r.kv_compression->sink_tokens, 4);
  ServerDefaults d;
  kvzap::PressSpec with, without;
  ASSERT_TRUE(resolve_press(r.kv_compression, d, with));
  EXPECT_EQ(with.sink_tokens, 4);
  r.kv_compression->sink_tokens = 0;
  ASSERT_TRUE(resolve_press(r.kv_compression, d, without));
  EXPECT_EQ(without.sink_tokens, 0);
  EXPECT_NE(press_settings_key(true, with), press_settings_key(true, without));
  expect_chat_error({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"kv_compression", {{"sink_tokens", -1}}}}, 400,
                    "sink_tokens");
  expect_chat_error({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"kv_compression", {{"sink_tokens", "4"}}}}, 400,
                    "sink_tokens");
  KvCompressionSpec none;
  none.press = "none";
  none.sink_tokens = 1;
  EXPECT_THROW(resolve_press(none, d, with), ApiError);
}

TEST(ServerRequest, CompletionPrompts) {
  CompletionRequest a = parse_completion_request({{"prompt", "hello"}}, limits());
  EXPECT_EQ(*a.prompt_text, "hello");
  CompletionRequest b = parse_completion_request({{"prompt", {1, 2, 999}}}, limits());
  EXPECT_EQ(b.prompt_ids, (std::vector<int32_t>{1, 2, 999}));
  CompletionRequest c = parse_completion_request({{"prompt", {"one"}}}, limits());
  EXPECT_EQ(*c.prompt_text, "one");
}

// The catalogue of bad chat bodies: each must be refused with a message naming the problem.
TEST(ServerRequest, BadChatBodies) {
  expect_chat_error(json::array(), 400, "JSON object");
  expect_chat_error(json::object(), 400, "'messages' is required");
  expect_chat_error({{"messages", "hi"}}, 400, "'messages' must be an array");
  expect_chat_error({{"messages", json::array()}}, 400, "must not be empty");
  expect_chat_error({{"messages", {1}}}, 400, "'messages[0]' must be an object");
  expect_chat_error({{"messages", {{{"content", "x"}}}}}, 400, "role' is required");
  expect_chat_error({{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}, 400, "role' must be");
  expect_chat_error({{"messages", {{{"role", 3}, {"content", "x"}}}}}, 400, "must be a string");
  expect_chat_error({{"messages", {{{"role", "user"}}}}}, 400, "content' is required");
  expect_chat_error({{"messages", {{{"role", "user"}, {"content", 5}}}}}, 400, "content' must be");
  expect_chat_error({{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}, 400, "only text parts");
  expect_chat_error(chat({{"max_tokens", -1}}), 400, "'max_tokens' must be between");
  expect_chat_error(chat({{"max_tokens", 0}}), 400, "'max_tokens'");
  expect_chat_error(chat({{"max_tokens", 100000000}}), 400, "'max_tokens'");
  expect_chat_error(chat({{"max_tokens", 18446744073709551615ull}}), 400, "'max_tokens' must be at most");
  expect_chat_error(chat({{"max_tokens", 1.5}}), 400, "must be an integer");
  expect_chat_error(chat({{"max_tokens", "10"}}), 400, "must be an integer");
  expect_chat_error(chat({{"temperature", -0.5}}), 400, "'temperature'");
  expect_chat_error(chat({{"temperature", 1e300}}), 400, "'temperature'");
  expect_chat_error(chat({{"temperature", "hot"}}), 400, "'temperature' must be a number");
  expect_chat_error(chat({{"top_p", 2}}), 400, "'top_p'");
  expect_chat_error(chat({{"top_k", -3}}), 400, "'top_k'");
  expect_chat_error(chat({{"min_p", -0.1}}), 400, "'min_p'");
  expect_chat_error(chat({{"seed", "abc"}}), 400, "'seed'");
  expect_chat_error(chat({{"n", 2}}), 400, "'n' must be 1");
  expect_chat_error(chat({{"stop", 5}}), 400, "'stop' must be");
  expect_chat_error(chat({{"stop", json::array({"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q"})}}), 400, "at most 16");
  expect_chat_error(chat({{"stop", {""}}}), 400, "must not be empty");
  expect_chat_error(chat({{"stop", std::string(1000, 'x')}}), 400, "bytes");
  expect_chat_error(chat({{"stream", "yes"}}), 400, "'stream' must be a boolean");
  expect_chat_error(chat({{"stream_options", 1}}), 400, "'stream_options' must be an object");
  expect_chat_error(chat({{"logprobs", true}}), 400, "'logprobs' is not supported");
  expect_chat_error(chat({{"tools", {{{"type", "function"}}}}}), 400, "not supported");
  expect_chat_error(chat({{"model", 7}}), 400, "'model' must be a string");
}

TEST(ServerRequest, BadKvCompression) {
  expect_chat_error(chat({{"kv_compression", "kvzap"}}), 400, "'kv_compression' must be an object");
  expect_chat_error(chat({{"kv_compression", {{"press", 1}}}}), 400, "'kv_compression.press' must be a string");
  expect_chat_error(chat({{"kv_compression", {{"press", ""}}}}), 400, "must not be empty");
  expect_chat_error(chat({{"kv_compression", {{"threshold", "low"}}}}), 400, "must be a number");
  expect_chat_error(chat({{"kv_compression", {{"threshold", 1e300}}}}), 400, "threshold' must be between");
  expect_chat_error(chat({{"kv_compression", {{"ratio", -0.1}}}}), 400, "ratio' must be between");
  expect_chat_error(chat({{"kv_compression", {{"ratio", 1.0}}}}), 400, "must be below 1");
  expect_chat_error(chat({{"kv_compression", {{"ratio", 0.5}, {"threshold", 1}}}}), 400, "not both");
  expect_chat_error(chat({{"kv_compression", {{"window", -5}}}}), 400, "window' must be between");
  expect_chat_error(chat({{"kv_compression", {{"decoding", 1}}}}), 400, "must be a boolean");
  expect_chat_error(chat({{"kv_compression", {{"treshold", 1}}}}), 400, "unknown field 'kv_compression.treshold'");
}

TEST(ServerRequest, BadCompletionBodies) {
  auto bad = [](const json& b, const std::string& fragment) {
    try {
      parse_completion_request(b, limits());
      FAIL() << "accepted: " << b.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  bad(json::object(), "'prompt' is required");
  bad({{"prompt", 5}}, "'prompt' must be");
  bad({{"prompt", ""}}, "must not be empty");
  bad({{"prompt", json::array()}}, "must not be empty");
  bad({{"prompt", {-1}}}, "out of range");
  bad({{"prompt", {1000}}}, "out of range");
  bad({{"prompt", {1, "a"}}}, "token id");
  bad({{"prompt", {1.5}}}, "token id");
  bad({{"prompt", {"a", "b"}}}, "only one prompt");
  bad({{"prompt", {{1, 2}, {3}}}}, "only one prompt");
  bad({{"prompt", "x"}, {"echo", true}}, "'echo'");
}

TEST(ServerRequest, TokenizeDetokenizeAndSlotNames) {
  TokenizeRequest t = parse_tokenize_request({{"content", "hi"}, {"with_pieces", true}});
  EXPECT_EQ(t.content, "hi");
  EXPECT_TRUE(t.with_pieces);
  EXPECT_THROW(parse_tokenize_request({{"content", 1}}), ApiError);
  EXPECT_THROW(parse_tokenize_request(json::object()), ApiError);
  EXPECT_EQ(parse_detokenize_request({{"tokens", {1, 2}}}, 10), (std::vector<int32_t>{1, 2}));
  EXPECT_THROW(parse_detokenize_request({{"tokens", {10}}}, 10), ApiError);
  EXPECT_THROW(parse_detokenize_request({{"tokens", {-1}}}, 10), ApiError);
  EXPECT_THROW(parse_detokenize_request({{"tokens", "1"}}, 10), ApiError);
  EXPECT_EQ(parse_slot_filename({{"filename", "ctx-1.kvc"}}), "ctx-1.kvc");
  for (const char* name : {"../etc/passwd", "a/b", "..", ".hidden", "/abs", "a\\b", "", "x y"})
    EXPECT_THROW(parse_slot_filename({{"filename", name}}), ApiError) << name;
  EXPECT_THROW(parse_slot_filename({{"filename", std::string(200, 'a')}}), ApiError);
  EXPECT_THROW(parse_slot_filename({{"filename", 3}}), ApiError);
}

TEST(ServerRequest, MalformedJson) {
  for (const char* text : {"", "{", "{\"messages\": [}", "NaN", "{\"a\": NaN}", "{\"a\": \"\xff\xfe\"}", "{\"a\": 1,}"})
    EXPECT_THROW(parse_body(text), ApiError) << text;
  EXPECT_EQ(parse_body("{\"a\": 1}")["a"], 1);
}

// Found by fuzz_request (fuzz/regressions/request/number-overflow-1e309.json): a number too large for
// a double made nlohmann throw out_of_range, not parse_error, which escaped parse_body (a 500).
TEST(ServerRequest, NumberOverflowIsA400) {
  for (const char* text : {"1e309", "{\"temperature\": 1e400}", "[-1e99999]"}) {
    try {
      parse_body(text);
      ADD_FAILURE() << "accepted " << text;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << text;
      EXPECT_NE(std::string(e.what()).find("malformed JSON"), std::string::npos) << e.what();
    }
  }
}

TEST(ServerAuth, KeysMatchExactly) {
  ApiKeys keys({"secret-one", "secret-two"});
  EXPECT_TRUE(keys.enabled());
  EXPECT_EQ(keys.match("secret-one"), 0);
  EXPECT_EQ(keys.match("secret-two"), 1);
  EXPECT_EQ(keys.match("secret-on"), -1);
  EXPECT_EQ(keys.match("secret-one "), -1);
  EXPECT_EQ(keys.match(""), -1);
  EXPECT_EQ(ApiKeys::from_headers("Bearer abc", ""), "abc");
  EXPECT_EQ(ApiKeys::from_headers("", "xyz"), "xyz");
  EXPECT_EQ(ApiKeys::from_headers("Basic abc", ""), "");
  EXPECT_FALSE(ApiKeys().enabled());
}

TEST(ServerMetrics, PrometheusText) {
  Metrics m;
  m.kv_budget_bytes = 1000;
  m.kv_bytes_resident = 250;
  m.prompt_tokens_total = 12;
  m.time_to_first_token.observe(0.03);
  m.time_to_first_token.observe(100);
  const std::string text = m.render();
  EXPECT_NE(text.find("kvzap:kv_cache_usage_perc 0.25\n"), std::string::npos);
  EXPECT_NE(text.find("kvzap:prompt_tokens_total 12\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE kvzap:time_to_first_token_seconds histogram"), std::string::npos);
  EXPECT_NE(text.find("kvzap:time_to_first_token_seconds_bucket{le=\"0.04\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("kvzap:time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("kvzap:time_to_first_token_seconds_count 2\n"), std::string::npos);
  for (const char* name : {"kvzap:kv_bytes_resident", "kvzap:kv_bytes_full", "kvzap:kv_evicted_entries_total",
                           "kvzap:num_requests_running", "kvzap:num_requests_waiting", "kvzap:num_preemptions_total",
                           "kvzap:generation_tokens_total", "kvzap:prefix_cache_hits_total", "kvzap:inter_token_latency_seconds_count"})
    EXPECT_NE(text.find(name), std::string::npos) << name;
}

}  // namespace
