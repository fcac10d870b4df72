// Options shared by the subcommands that run a model, and small helpers for reading user input.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "engine/session.h"
#include "model/model.h"

namespace kvzap::cli {

struct ModelArgs {
  std::string model;     // -m; empty = the default model
  int threads = 0;       // -t; 0 = physical cores
  int64_t ctx = 0;       // -c; 0 = the model's (capped at 8192)
  int64_t batch = 0;     // -b; 0 = whole prompt in one step

  void add_to(CLI::App& sub);
  std::unique_ptr<Model> load_model() const;
  SessionOptions session_options() const;
};

// Reads a whole file as text (throws kvzap::Error "<path>: ..."); checks UTF-8.
std::string read_text_file(const std::string& path);
// Prompt from -p or -f (exactly one); validates UTF-8.
std::string prompt_from(const std::string& text, const std::string& file);
// JSON dump that never throws on odd bytes (invalid UTF-8 is replaced by U+FFFD).
std::string json_dump(const nlohmann::json& j, int indent = -1);

}  // namespace kvzap::cli
