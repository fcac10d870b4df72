// kvzap command-line entry point: builds the subcommand tree from the registry and dispatches.
#include <algorithm>
#include <cstdio>
#include <exception>

#include "cli/command.h"
#include "common/data_dir.h"
#include "kvzap/error.h"

namespace kvzap::cli {
std::vector<Command>& command_registry() {
  static std::vector<Command> registry;
  return registry;
}
}  // namespace kvzap::cli

int main(int argc, char** argv) {
  using namespace kvzap::cli;
  CLI::App app{"kvzap: a CPU inference engine for decoder-only LLMs with real, adaptive KV-cache pruning"};
  app.require_subcommand(1);
  // The data folder too (surrogates, eval sets): where an installed or moved binary finds it.
  app.set_version_flag("--version", [] { return "kvzap 0.1.0\ndata: " + kvzap::data_dir(); });
  auto& cmds = command_registry();
  std::sort(cmds.begin(), cmds.end(), [](const Command& a, const Command& b) { return a.name < b.name; });
  std::vector<std::pair<CLI::App*, std::function<int()>>> actions;
  for (auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    actions.emplace_back(sub, c.setup(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, action] : actions)
      if (sub->parsed()) return action();
  } catch (const kvzap::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kvzap: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "kvzap: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvzap: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
