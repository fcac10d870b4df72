// `kvzap pull`: downloads the default model (SmolLM2-135M-Instruct Q4_1) into the model store and prints
// its path on stdout; progress and pip's own output go to stderr.
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "engine/model_store.h"

namespace kvzap::cli {
namespace {

RegisterCommand reg("pull", "Download the default model (SmolLM2-135M-Instruct Q4_1) and print its path",
                    [](CLI::App& sub) {
                      auto quiet = std::make_shared<bool>(false);
                      sub.add_flag("-q,--quiet", *quiet, "Only print the path");
                      return [=]() -> int {
                        const std::string path = pull_default_model(!*quiet);
                        std::printf("%s\n", path.c_str());
                        return 0;
                      };
                    });

}  // namespace
}  // namespace kvzap::cli
