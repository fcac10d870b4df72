// Shared helpers for tests: where the default model and the kvzap binary are, and running the CLI.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "cache/kv_cache.h"
#include "kernels/matmul.h"
#include "model/model.h"
#include "press/press.h"

namespace kvzap::test {

// Every ISA this CPU can run, scalar first; tests loop over them with set_active_isa().
inline std::vector<Isa> available_isas() {
  std::vector<Isa> v{Isa::Scalar};
  if (detected_isa() >= Isa::Avx2) v.push_back(Isa::Avx2);
  if (detected_isa() >= Isa::Avx512) v.push_back(Isa::Avx512);
  return v;
}

struct IsaGuard {  // restores the active ISA after a test changes it
  Isa saved = active_isa();
  ~IsaGuard() { set_active_isa(saved); }
};

// $KVZAP_MODEL, else $KVZAP_MODELS/<file>, else ${XDG_CACHE_HOME:-$HOME/.cache}/kvzap/models/<file>.
// Where `kvzap pull` puts a model file: $KVZAP_MODELS, else $XDG_CACHE_HOME or ~/.cache, + /kvzap/models.
inline std::string pulled_model_path(const std::string& file) {
  if (const char* d = std::getenv("KVZAP_MODELS"); d && *d) return std::string(d) + "/" + file;
  std::string cache;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) cache = x;
  else cache = std::string(std::getenv("HOME") ? std::getenv("HOME") : "/root") + "/.cache";
  return cache + "/kvzap/models/" + file;
}

inline std::string default_model_path() {
  if (const char* m = std::getenv("KVZAP_MODEL"); m && *m) return m;
  return pulled_model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
}

// $KVZAP_BIN (ctest sets it), else the kvzap next to the test binary.
inline std::string kvzap_bin() {
  if (const char* b = std::getenv("KVZAP_BIN"); b && *b) return b;
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "kvzap").string();
}

struct CommandResult {
  int exit_code = -1;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `args` (already shell-quoted) through /bin/sh with stdout and stderr captured separately.
inline CommandResult run_kvzap(const std::string& args) {
  static int counter = 0;
  const std::string base = (std::filesystem::temp_directory_path() /
                            ("kvzap_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++))).string();
  const std::string cmd = "'" + kvzap_bin() + "' " + args + " >'" + base + ".out' 2>'" + base + ".err' </dev/null";
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  std::filesystem::remove(base + ".out");
  std::filesystem::remove(base + ".err");
  return r;
}

// Kept positions of every (layer, KV head) stream of a cache, stream order layer-major.
using KeptSet = std::vector<std::vector<int32_t>>;
inline KeptSet kept_positions(const KvCache& c) {
  KeptSet r;
  for (int l = 0; l < c.n_layer(); l++)
    for (int h = 0; h < c.n_head_kv(); h++) {
      std::vector<int32_t> p;
      for (int64_t i = 0; i < c.length(l, h); i++) p.push_back(c.position_at(l, h, i));
      r.push_back(std::move(p));
    }
  return r;
}

// A suite whose tests share the default pulled model, loaded once per suite: model_. A missing model
// fails each test (run `kvzap pull`), never skips it.
class DefaultModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = default_model_path();
    if (std::filesystem::exists(path)) model_ = Model::load(path);
  }
  static void TearDownTestSuite() { model_.reset(); }
  void SetUp() override {
    if (!model_) FAIL() << "model not found at " << default_model_path() << " (run `kvzap pull`)";
  }
  static inline std::unique_ptr<Model> model_;
};

inline bool every_press_under_test() {
  const char* env = std::getenv("KVZAP_TEST_PRESSES");
  return !env || !*env;
}

// The registry's presses a test runs one by one: all of them, or the subset named by KVZAP_TEST_PRESSES
// ("a,b,c"; scripts/test_sanitizers.sh names one press of each kind, since a sanitized build runs every
// press several times slower). A name the registry lacks fails the test; the subset is printed.
inline std::vector<const ScorerEntry*> presses_under_test() {
  std::vector<const ScorerEntry*> out;
  if (every_press_under_test()) {
    // Presses reading query statistics (`kvzap query-stats`) need a file computed for the model:
    // tests/unit/press/test_query_stats_presses.cpp runs them.
    for (const ScorerEntry& e : scorer_registry())
      if (!e.traits.needs_query_stats) out.push_back(&e);
    return out;
  }
  const char* env = std::getenv("KVZAP_TEST_PRESSES");
  std::stringstream names(env);
  std::string name;
  while (std::getline(names, name, ',')) {
    if (name.empty()) continue;
    const ScorerEntry* found = nullptr;
    for (const ScorerEntry& e : scorer_registry())
      if (e.name == name) found = &e;
    if (!found) ADD_FAILURE() << "KVZAP_TEST_PRESSES names '" << name << "', which the registry lacks";
    else out.push_back(found);
  }
  std::printf("[presses] KVZAP_TEST_PRESSES: %zu of the registry's %zu presses (%s)\n", out.size(),
              scorer_registry().size(), env);
  return out;
}

// Gives a press that runs under the ratio policy its setting in a test of every press: `ratio`, or for a
// press that sets its own budget (PressTraits::own_budget, no ratio) the registry's demo parameters, under
// which it prunes a short context.
inline void give_budget(PressSpec& s, double ratio) {
  const PressTraits& t = press_traits(s.name);
  if (t.own_budget) {
    for (const auto& [k, v] : t.demo_params) s.params[k] = v;
    s.has_ratio = false;
    return;
  }
  s.has_ratio = true;
  s.ratio = ratio;
}

// Whether a test that names its presses runs `name`: always without KVZAP_TEST_PRESSES, else when listed.
inline bool press_selected(const std::string& name) {
  if (every_press_under_test()) return true;
  const char* env = std::getenv("KVZAP_TEST_PRESSES");
  return ("," + std::string(env) + ",").find("," + name + ",") != std::string::npos;
}

}  // namespace kvzap::test
