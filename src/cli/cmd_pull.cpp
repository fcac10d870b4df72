// `kvzap pull [NAME]`: downloads a model of the catalogue (default: SmolLM2-135M-Instruct Q4_1) into the
// model store and prints its path on stdout; progress and pip's own output go to stderr.
// `kvzap pull --list` shows the catalogue and what is already downloaded.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/command.h"
#include "fetch/model_catalogue.h"
#include "fetch/model_store.h"

namespace kvzap::cli {
namespace {

struct PullArgs {
  std::string name;
  bool quiet = false, list = false;
};

int run_pull(const PullArgs& a) {
  if (a.list) {
    std::printf("%-20s %-10s %-11s %s\n", "name", "size", "downloaded", "description");
    for (const CatalogueEntry& e : model_catalogue()) {
      const std::string path = models_dir() + "/" + e.file;
      std::error_code ec;
      const bool have = std::filesystem::is_regular_file(path, ec) && std::filesystem::file_size(path, ec) == e.size;
      std::printf("%-20s %7.1f MB %-11s %s\n", e.name.c_str(), e.size / 1e6, have ? "yes" : "no", e.description.c_str());
    }
    return 0;
  }
  const std::string path =
      a.name.empty() || a.name == "smollm2-135m" ? pull_default_model(!a.quiet) : pull_model(a.name, !a.quiet);
  std::printf("%s\n", path.c_str());
  return 0;
}

RegisterCommand reg("pull", "Download a model of the catalogue (default: SmolLM2-135M-Instruct Q4_1) and print its path",
                    [](CLI::App& sub) {
                      auto a = std::make_shared<PullArgs>();
                      sub.add_option("name", a->name, "catalogue name (see --list); default smollm2-135m");
                      sub.add_flag("-q,--quiet", a->quiet, "Only print the path");
                      sub.add_flag("--list", a->list, "Show the catalogue and what is downloaded");
                      return [a]() { return run_pull(*a); };
                    });

}  // namespace
}  // namespace kvzap::cli
