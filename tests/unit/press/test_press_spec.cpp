// PressSpec (press/press_spec.h): one press configuration for every front end. Each front end is shown to
// deliver every field: the JSON form (the C API and Python package), the server's kv_compression on top of
// its default press, and the CLI's flags (through the real binary's `generate --json`). The canonical key
// tells every field apart, so caches, slots and the prefix cache never mix two settings.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvzap/error.h"
#include "press/baselines.h"
#include "press/press.h"
#include "press/press_spec.h"
#include "server/api_error.h"
#include "server/prepare.h"
#include "server/request.h"
#include "test_support.h"

namespace kvzap {
namespace {

using nlohmann::json;

// A spec whose every field differs from PressSpec{}.
json every_field() {
  return {{"press", "random"},     {"threshold", 0.25},       {"ratio_scope", "layer"}, {"window", 7},
          {"sink_tokens", 3},      {"prefill_evict_every", 5}, {"decoding", true},       {"sliding_layers", true},
          {"surrogate", "/tmp/s"}, {"seed", 9}};
}

void expect_every_field(const PressSpec& s, bool with_surrogate = true) {
  EXPECT_EQ(s.name, "random");
  EXPECT_TRUE(s.has_threshold);
  EXPECT_FALSE(s.has_ratio);
  EXPECT_EQ(s.threshold, 0.25);
  EXPECT_EQ(s.ratio_scope, "layer");
  EXPECT_EQ(s.window, 7);
  EXPECT_EQ(s.sink_tokens, 3);
  EXPECT_EQ(s.prefill_evict_every, 5);
  EXPECT_TRUE(s.decoding);
  EXPECT_TRUE(s.sliding_layers);
  if (with_surrogate) EXPECT_EQ(s.surrogate_dir, "/tmp/s");
  EXPECT_EQ(s.seed, 9u);
}

TEST(PressSpec, JsonDeliversEveryFieldAndRoundTrips) {
  const PressSpec s = press_spec_from_json(every_field());
  expect_every_field(s);
  const PressSpec back = press_spec_from_json(press_spec_to_json(s));
  EXPECT_EQ(press_spec_key(&back), press_spec_key(&s));
  PressSpec r;
  r.name = "snapkv";
  r.has_ratio = true;
  r.ratio = 0.5;
  const PressSpec rb = press_spec_from_json(press_spec_to_json(r));
  EXPECT_TRUE(rb.has_ratio && !rb.has_threshold);
  EXPECT_EQ(press_spec_key(&rb), press_spec_key(&r));
}

TEST(PressSpec, KeyChangesWithEveryField) {
  const PressSpec base = press_spec_from_json(every_field());
  const std::vector<std::function<void(PressSpec&)>> changes = {
      [](PressSpec& s) { s.name = "knorm"; },          [](PressSpec& s) { s.threshold = 0.5; },
      [](PressSpec& s) { s.has_threshold = false; },   [](PressSpec& s) { s.has_ratio = true; },
      [](PressSpec& s) { s.ratio = 0.3; },             [](PressSpec& s) { s.ratio_scope = "head"; },
      [](PressSpec& s) { s.window = 8; },              [](PressSpec& s) { s.sink_tokens = 4; },
      [](PressSpec& s) { s.prefill_evict_every = 6; }, [](PressSpec& s) { s.decoding = false; },
      [](PressSpec& s) { s.sliding_layers = false; },  [](PressSpec& s) { s.surrogate_dir = "/tmp/t"; },
      [](PressSpec& s) { s.seed = 10; },              [](PressSpec& s) { s.ratios = {0.5}; },
  };
  for (size_t i = 0; i < changes.size(); i++) {
    PressSpec c = base;
    changes[i](c);
    EXPECT_NE(press_spec_key(&c), press_spec_key(&base)) << "change " << i;
  }
  EXPECT_EQ(press_spec_key(nullptr), "none");
  // A long surrogate path is not truncated away.
  PressSpec a = base, b = base;
  a.surrogate_dir = std::string(600, 'x') + "a";
  b.surrogate_dir = std::string(600, 'x') + "b";
  EXPECT_NE(press_spec_key(&a), press_spec_key(&b));
}

// press_spec_from_json's error message, or "no error".
std::string spec_error(const json& v) {
  try {
    press_spec_from_json(v);
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

TEST(PressSpec, JsonErrorsNameTheField) {
  EXPECT_NE(spec_error({{"threshold", 1}}).find("'press.press' is required"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "knorm"}, {"window", -1}}).find("press.window"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "knorm"}, {"ratio", 1.5}}).find("press.ratio"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "knorm"}, {"ratio", 0.5}, {"threshold", 1}}).find("either"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "knorm"}, {"ratio_scope", "planet"}}).find("press.ratio_scope"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "knorm"}, {"bogus", 1}}).find("unknown field 'press.bogus'"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "knorm"}, {"decoding", "yes"}}).find("press.decoding"), std::string::npos);
  EXPECT_NE(spec_error(json::array()).find("an object"), std::string::npos);
}

// A press's own parameters (kvpress argument names), declared by the registry: given ones are kept,
// checked against the press's range, part of the key and the JSON form; others are refused by name.
TEST(PressSpec, PressParametersAreDeclaredByTheRegistryAndChecked) {
  const PressSpec s = press_spec_from_json({{"press", "snapkv"}, {"ratio", 0.5}, {"window_size", 32}});
  EXPECT_EQ(s.params.at("window_size"), 32);
  EXPECT_EQ(press_param(s, "window_size"), 32);
  EXPECT_EQ(press_param(s, "kernel_size"), 5);  // the registry's default
  EXPECT_EQ(press_min_context(s), 32);
  EXPECT_EQ(press_min_context(press_spec_from_json({{"press", "snapkv"}, {"ratio", 0.5}})), 64);
  const PressSpec plain = press_spec_from_json({{"press", "snapkv"}, {"ratio", 0.5}});
  EXPECT_NE(press_spec_key(&s), press_spec_key(&plain));
  const PressSpec back = press_spec_from_json(press_spec_to_json(s));
  EXPECT_EQ(press_spec_key(&back), press_spec_key(&s));
  EXPECT_NE(spec_error({{"press", "snapkv"}, {"window_size", 0}}).find("'press.window_size' must be an integer in [1, 4096]"),
            std::string::npos);
  EXPECT_NE(spec_error({{"press", "snapkv"}, {"window_size", 2.5}}).find("press.window_size"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "knorm"}, {"window_size", 32}}).find("a parameter of press 'knorm': none"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "streaming_llm"}, {"window_size", 32}}).find("press 'streaming_llm': n_sink"), std::string::npos);
  // A server's kv_compression may set a parameter of its default press without naming it.
  PressSpec base = press_spec_from_json({{"press", "snapkv"}, {"ratio", 0.5}});
  const PressSpec patched = press_spec_apply(base, parse_press_spec_patch({{"kernel_size", 7}}, "kv_compression", false));
  EXPECT_EQ(press_param(patched, "kernel_size"), 7);
  EXPECT_THROW(press_spec_apply(press_spec_from_json({{"press", "knorm"}, {"ratio", 0.5}}),
                                parse_press_spec_patch({{"kernel_size", 7}}, "kv_compression", false)),
               Error);
  EXPECT_THROW(parse_press_spec_patch({{"kernel_sise", 7}}, "kv_compression", false), Error);  // no press takes it
}

// The other presses' kvpress arguments: declared with kvpress's names and defaults, ranges refused by
// name; AdaKV's alpha_safeguard for every AdaKV press, adakv_<any press> included.
TEST(PressSpec, KvpressArgumentsOfThePressesAreDeclared) {
  const PressSpec ea = press_spec_from_json({{"press", "expected_attention"}, {"ratio", 0.5}});
  EXPECT_EQ(press_param(ea, "n_future_positions"), 512);
  EXPECT_EQ(press_param(ea, "n_sink"), 4);
  EXPECT_EQ(press_param(ea, "use_covariance"), 1);
  EXPECT_EQ(press_param(ea, "use_vnorm"), 1);
  EXPECT_EQ(press_param(ea, "epsilon"), 1e-2);
  EXPECT_EQ(press_param(ea, "alpha_safeguard"), 0.2);
  const PressSpec ak = press_spec_from_json({{"press", "adakv_keydiff"}, {"ratio", 0.5}, {"alpha_safeguard", 0.5}});
  EXPECT_EQ(press_param(ak, "alpha_safeguard"), 0.5);
  EXPECT_EQ(press_param(press_spec_from_json({{"press", "adakv_lagkv"}, {"ratio", 0.5}, {"lag_size", 32}}), "lag_size"), 32);
  EXPECT_EQ(press_param(press_spec_from_json({{"press", "adakv_snapkv"}, {"ratio", 0.5}}), "window_size"), 64);
  EXPECT_EQ(press_param(press_spec_from_json({{"press", "block_keydiff"}, {"ratio", 0.5}}), "block_size"), 128);
  EXPECT_EQ(press_param(press_spec_from_json({{"press", "cur"}, {"ratio", 0.5}}), "local_window_size"), 16);
  EXPECT_EQ(press_param(press_spec_from_json({{"press", "compactor"}, {"ratio", 0.5}}), "chunk_size"), 256);
  EXPECT_EQ(press_param(press_spec_from_json({{"press", "non_causal_attn"}, {"ratio", 0.5}}), "chunk_size"), 256);
  EXPECT_EQ(press_param(press_spec_from_json({{"press", "leverage_score"}, {"ratio", 0.5}}), "sketch_dimension"), 48);
  // Out of range: refused with the range.
  EXPECT_NE(spec_error({{"press", "adakv_snapkv"}, {"alpha_safeguard", 1.5}}).find("'press.alpha_safeguard' must be a number in [0, 1]"),
            std::string::npos);
  EXPECT_NE(spec_error({{"press", "adakv_keydiff"}, {"alpha_safeguard", -0.1}}).find("press.alpha_safeguard"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "expected_attention"}, {"use_covariance", 2}}).find("an integer in [0, 1]"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "expected_attention_uniform"}, {"epsilon", -1}}).find("press.epsilon"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "expected_attention"}, {"n_future_positions", 0}}).find("press.n_future_positions"),
            std::string::npos);
  EXPECT_NE(spec_error({{"press", "lagkv"}, {"lag_size", 0}}).find("press.lag_size"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "block_keydiff"}, {"block_size", 0}}).find("press.block_size"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "cur"}, {"use_local_approximation", 0.5}}).find("press.use_local_approximation"),
            std::string::npos);
  EXPECT_NE(spec_error({{"press", "compactor"}, {"sketch_dimension", 0}}).find("press.sketch_dimension"), std::string::npos);
  // Not a parameter of the press: the message lists what it takes.
  EXPECT_NE(spec_error({{"press", "expected_attention_uniform"}, {"alpha_safeguard", 0.5}})
                .find("press 'expected_attention_uniform': n_future_positions, n_sink, use_covariance, use_vnorm, epsilon)"),
            std::string::npos);
  EXPECT_NE(spec_error({{"press", "knorm"}, {"alpha_safeguard", 0.5}}).find("press 'knorm': none"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "adakv_knorm"}, {"window_size", 8}}).find("press 'adakv_knorm': alpha_safeguard"),
            std::string::npos);
  EXPECT_NO_THROW(press_spec_from_json({{"press", "adakv_expected_attention"}, {"ratio", 0.5}, {"alpha_safeguard", 0.5}}));
  EXPECT_EQ(press_param(press_spec_from_json({{"press", "critical_snapkv"}, {"ratio", 0.5}}), "epsilon"), 1e-4);
  EXPECT_EQ(press_param(press_spec_from_json({{"press", "critical_adakv_snapkv"}, {"ratio", 0.5}}), "alpha_safeguard"), 0.2);
  EXPECT_EQ(press_param(press_spec_from_json({{"press", "cap"}, {"ratio", 0.5}}), "tau"), 5);
  EXPECT_EQ(press_param(press_spec_from_json({{"press", "entropy_gated_chunkkv"}, {"ratio", 0.5}}), "low_entropy_chunk_length"), 4);
  EXPECT_NE(spec_error({{"press", "critical_snapkv"}, {"first_stage_ratio", 1.5}}).find("press.first_stage_ratio"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "critical_snapkv"}, {"alpha_safeguard", 0.5}}).find("press 'critical_snapkv': epsilon, first_stage_ratio)"),
            std::string::npos);
  EXPECT_NE(spec_error({{"press", "cap"}, {"tau", -1}}).find("press.tau"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "entropy_gated_chunkkv"}, {"low_entropy_chunk_length", 0}}).find("press.low_entropy_chunk_length"),
            std::string::npos);
  // kvpress's booleans as JSON booleans (Python's use_vnorm=False): 0 / 1.
  const PressSpec b = press_spec_from_json({{"press", "expected_attention"}, {"ratio", 0.5}, {"use_vnorm", false}});
  EXPECT_EQ(press_param(b, "use_vnorm"), 0);
  EXPECT_EQ(press_param(press_spec_from_json({{"press", "cur"}, {"ratio", 0.5}, {"use_local_approximation", true}}),
                        "use_local_approximation"), 1);
  EXPECT_NE(spec_error({{"press", "knorm"}, {"use_vnorm", false}}).find("unknown field 'press.use_vnorm'"), std::string::npos);
}

// kvpress arguments given as words (CURPress leverage_type="key"): a choice parameter takes one of its words
// (or the word's index), names them when refused, and prints back as the word.
TEST(PressSpec, ChoiceParametersTakeTheirWords) {
  const PressSpec k = press_spec_from_json({{"press", "cur"}, {"ratio", 0.5}, {"leverage_type", "key"}});
  EXPECT_EQ(press_param(k, "leverage_type"), 0);
  EXPECT_EQ(press_param(press_spec_from_json({{"press", "cur"}, {"ratio", 0.5}}), "leverage_type"), 3);  // kv_product
  EXPECT_EQ(press_param(press_spec_from_json({{"press", "cur"}, {"ratio", 0.5}, {"leverage_type", 2}}), "leverage_type"), 2);
  EXPECT_EQ(press_spec_to_json(k)["leverage_type"], "key");
  EXPECT_EQ(press_spec_from_json(press_spec_to_json(k)).params, k.params);
  const PressSpec v = press_spec_from_json({{"press", "cur"}, {"ratio", 0.5}, {"leverage_type", "value"}});
  EXPECT_NE(press_spec_key(&k), press_spec_key(&v));
  EXPECT_NE(spec_error({{"press", "cur"}, {"leverage_type", "keys"}})
                .find("'press.leverage_type' must be one of key, value, kv_avg, kv_product"),
            std::string::npos);
  EXPECT_NE(spec_error({{"press", "cur"}, {"leverage_type", 4}}).find("press.leverage_type"), std::string::npos);
  // A long word is echoed cut short, on a UTF-8 boundary (the error goes back to a client as JSON).
  std::string long_word;
  for (int i = 0; i < 300; i++) long_word += "\xc3\xa9";  // U+00E9, two bytes each
  const std::string long_error = spec_error({{"press", "cur"}, {"leverage_type", long_word}});
  EXPECT_LT(long_error.size(), 400u) << long_error;
  EXPECT_NE(long_error.find("...\""), std::string::npos) << long_error;
  EXPECT_NO_THROW((void)json(long_error).dump());
  EXPECT_NE(spec_error({{"press", "cur"}, {"local_window_size", "sixteen"}}).find("'press.local_window_size' must be a number"),
            std::string::npos);
  EXPECT_NE(spec_error({{"press", "knorm"}, {"leverage_type", "key"}}).find("unknown field 'press.leverage_type'"),
            std::string::npos);
  const json params = press_params_json(press_traits("cur"));
  bool listed = false;
  for (const auto& p : params)
    if (p["name"] == "leverage_type") listed = p["default"] == "kv_product" && p["choices"].size() == 4;
  EXPECT_TRUE(listed) << params.dump();
  // LagKV's cross_scoring and Compactor's blending (kvpress's None: the compression ratio).
  EXPECT_EQ(press_param(press_spec_from_json({{"press", "lagkv"}, {"ratio", 0.5}, {"cross_scoring", true}}), "cross_scoring"), 1);
  const PressSpec c = press_spec_from_json({{"press", "compactor"}, {"ratio", 0.3}});
  EXPECT_EQ(compactor_blending(c), 0.3);
  EXPECT_EQ(compactor_blending(press_spec_from_json({{"press", "compactor"}, {"ratio", 0.3}, {"blending", 0.7}})), 0.7);
  EXPECT_EQ(compactor_blending(press_spec_from_json({{"press", "adakv_compactor"}, {"ratio", 0.3}, {"blending", 0.7}})), 0.7);
}

// The server: kv_compression reaches every field of the press, on top of the server's default, and a
// client cannot name a folder on the host.
TEST(PressSpec, ServerKvCompressionDeliversEveryFieldButHostPaths) {
  json kv = every_field();
  kv.erase("surrogate");
  const server::CompletionRequest r = server::parse_chat_request(
      {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"kv_compression", kv}}, server::RequestLimits{});
  server::ServerDefaults d;
  d.has_press = true;
  d.press.name = "random";
  d.press.surrogate_dir = "/srv/surrogates";  // the operator's, kept for the same press
  PressSpec out;
  ASSERT_TRUE(server::resolve_press(r.kv_compression, d, out));
  expect_every_field(out, /*with_surrogate=*/false);
  EXPECT_EQ(out.surrogate_dir, "/srv/surrogates");
  try {
    server::parse_chat_request({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"kv_compression", every_field()}},
                               server::RequestLimits{});
    ADD_FAILURE() << "a client named a surrogate folder";
  } catch (const server::ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("kv_compression.surrogate"), std::string::npos) << e.what();
  }
}

// The CLI: every press flag arrives in the spec the command runs (printed by `generate --json`).
TEST(PressSpec, CliFlagsDeliverEveryField) {
  const std::string model = test::default_model_path();
  ASSERT_TRUE(std::filesystem::exists(model)) << "run `kvzap pull`";
  const test::CommandResult r = test::run_kvzap(
      "generate -t 2 -p 'Hello there' -n 1 --json --press random --threshold 0.25 --ratio-scope layer --window 7 "
      "--sink-tokens 3 --prefill-evict-every 5 --decode-press --press-sliding-layers --surrogate /tmp/s --press-seed 9");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_TRUE(j.contains("press_spec")) << r.out;
  const PressSpec s = press_spec_from_json(j["press_spec"]);
  expect_every_field(s);
  EXPECT_EQ(j["press_key"].get<std::string>(), press_spec_key(&s));
}

// --press-param: kvpress's booleans as True / False (or 1 / 0), ranges refused with the parameter's name.
TEST(PressSpec, CliPressParamsTakeBooleansAndRefuseRanges) {
  const std::string model = test::default_model_path();
  ASSERT_TRUE(std::filesystem::exists(model)) << "run `kvzap pull`";
  const test::CommandResult r = test::run_kvzap(
      "generate -t 2 -p 'Hello there, how are you today?' -n 1 --json --press expected_attention --ratio 0.5 "
      "--press-param use_vnorm=False --press-param n_sink=3 --press-param alpha_safeguard=0.5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const PressSpec s = press_spec_from_json(json::parse(r.out)["press_spec"]);
  EXPECT_EQ(press_param(s, "use_vnorm"), 0);
  EXPECT_EQ(press_param(s, "n_sink"), 3);
  EXPECT_EQ(press_param(s, "alpha_safeguard"), 0.5);
  const test::CommandResult bad = test::run_kvzap(
      "generate -t 2 -p 'Hello there' -n 1 --press adakv_knorm --ratio 0.5 --press-param alpha_safeguard=2");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("'--press-param alpha_safeguard' must be a number in [0, 1]"), std::string::npos) << bad.err;
  // A word for a choice parameter.
  const test::CommandResult word = test::run_kvzap(
      "generate -t 2 -p 'Hello there, how are you today?' -n 1 --json --press cur --ratio 0.5 --press-param leverage_type=kv_avg");
  ASSERT_EQ(word.exit_code, 0) << word.err;
  EXPECT_EQ(json::parse(word.out)["press_spec"]["leverage_type"], "kv_avg");
  const test::CommandResult badword = test::run_kvzap(
      "generate -t 2 -p 'Hello there' -n 1 --press cur --ratio 0.5 --press-param leverage_type=both");
  EXPECT_NE(badword.exit_code, 0);
  EXPECT_NE(badword.err.find("must be one of key, value, kv_avg, kv_product"), std::string::npos) << badword.err;
}

}  // namespace
}  // namespace kvzap
