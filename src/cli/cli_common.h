// Options shared by the subcommands that run a model, and small helpers for reading user input.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "engine/session.h"
#include "model/model.h"
#include "press/press.h"

namespace kvzap::cli {

struct ModelArgs {
  std::string model;     // -m; empty = the default model
  int threads = 0;       // -t; 0 = physical cores
  int64_t ctx = 0;       // -c; 0 = the model's (capped at 8192)
  int64_t batch = 0;     // -b; 0 = whole prompt in one step
  std::string quantize;  // --quantize q8_0|q4_k (Hugging Face checkpoints); empty = as stored
  std::string kv_type = "f16";  // --kv-type: f16 | f32

  void add_to(CLI::App& sub);
  std::unique_ptr<Model> load_model() const;
  LoadOptions load_options() const;
  SessionOptions session_options() const;
  KvType cache_type() const { return parse_kv_type(kv_type); }
};

// Press selection shared by generate, eval and friends.
struct PressArgs {
  // The flags land in the PressSpec fields directly: one value type, no field copied by hand.
  PressSpec flags;
  CLI::Option* threshold_opt = nullptr;
  CLI::Option* ratio_opt = nullptr;
  std::vector<std::string> params;  // --press-param NAME=VALUE (the press's own parameters)
  std::string ratios;                // --press-ratios R0:R1:... (PressSpec::ratios: per_layer_<press>)

  // with_surrogate: also --surrogate (bench uses that name for its own option).
  void add_to(CLI::App& sub, bool with_surrogate = true);
  // The PressSpec these flags stand for (whether or not --press was given): flags with the policy set
  // by which of --threshold / --ratio was given.
  PressSpec spec() const;
  bool given_threshold() const { return threshold_opt && threshold_opt->count() > 0; }
  bool given_ratio() const { return ratio_opt && ratio_opt->count() > 0; }
  std::unique_ptr<Press> make(const Model& model) const;  // nullptr without --press
};

// Reads a whole file as text (throws kvzap::Error "<path>: ..."); checks UTF-8.
std::string read_text_file(const std::string& path);
// Prompt from -p or -f (exactly one); validates UTF-8.
std::string prompt_from(const std::string& text, const std::string& file);
// JSON dump that never throws on odd bytes (invalid UTF-8 is replaced by U+FFFD).
std::string json_dump(const nlohmann::json& j, int indent = -1);

}  // namespace kvzap::cli
