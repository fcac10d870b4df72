// Subcommand registry: each src/cli/cmd_*.cpp registers itself with one static line;
// main.cpp only dispatches.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace kvzap::cli {

struct Command {
  std::string name;
  std::string help;
  // Adds options to `sub` and returns the action to run when the subcommand is chosen.
  std::function<std::function<int()>(CLI::App& sub)> setup;
};

std::vector<Command>& command_registry();

struct RegisterCommand {
  RegisterCommand(std::string name, std::string help,
                  std::function<std::function<int()>(CLI::App&)> setup) {
    command_registry().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

}  // namespace kvzap::cli
