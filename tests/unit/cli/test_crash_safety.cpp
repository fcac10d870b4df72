// Crash safety of the long jobs (docs/RELIABILITY.md): `collect`, `train` and `generate --save-cache`
// are killed with SIGKILL at random points (on the tiny model fuzz/data/tiny_llama.gguf, so each run
// takes milliseconds); whatever they left must never be read as a valid but different result, and a
// rerun must finish with files byte-identical to an uninterrupted run.
// KVZAP_KILL_TRIALS (default 6) kill points per job; the seed is printed so a failure can be replayed
// (KVZAP_KILL_SEED).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/cache_file.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "press/surrogate.h"
#include "test_support.h"
#include "train/dataset.h"

namespace {

namespace fs = std::filesystem;
using namespace kvzap;

const std::string kTiny = KVZAP_SOURCE_DIR "/fuzz/data/tiny_llama.gguf";

int trials() {
  const char* t = std::getenv("KVZAP_KILL_TRIALS");
  return t && *t ? std::max(1, std::atoi(t)) : 6;
}

std::mt19937_64& rng() {
  static std::mt19937_64 r([] {
    const char* s = std::getenv("KVZAP_KILL_SEED");
    const uint64_t seed = s && *s ? std::strtoull(s, nullptr, 10) : std::random_device{}();
    std::fprintf(stderr, "[crash-safety] KVZAP_KILL_SEED=%llu\n", (unsigned long long)seed);
    return seed;
  }());
  return r;
}

// Runs kvzap with args in cwd; kills it with SIGKILL after kill_after_us (< 0: never). Returns true
// if it ran to the end with exit status 0.
bool run(const fs::path& cwd, const std::vector<std::string>& args, int64_t kill_after_us = -1) {
  const std::string bin = test::kvzap_bin();
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::chdir(cwd.c_str()) != 0) ::_exit(126);
    const int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
    std::vector<char*> argv{const_cast<char*>(bin.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  if (kill_after_us >= 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(kill_after_us));
    ::kill(pid, SIGKILL);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string slurp(const fs::path& p) { return test::slurp(p.string()); }

class CrashSafety : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("kvzap_crash_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    // Three small documents over the tiny vocabulary.
    std::mt19937 r(1);
    const char* words[] = {"ab", "a", "b", "c", "bc", "ca", "abc!"};
    std::ofstream list(root_ / "list.txt");
    for (int d = 0; d < 4; d++) {
      const fs::path p = root_ / ("doc" + std::to_string(d) + ".txt");
      std::ofstream f(p);
      for (int line = 0; line < 40; line++) {
        for (int w = 0; w < 12; w++) f << (w ? " " : "") << words[r() % 7];
        f << "\n";
      }
      list << p.string() << "\n";
    }
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path fresh(const std::string& name) {
    const fs::path d = root_ / name;
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
  }
  // Runs the reference once and returns its wall time in microseconds.
  int64_t timed(const fs::path& cwd, const std::vector<std::string>& args) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(run(cwd, args));
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  }
  int64_t kill_point(int64_t full_us) {
    return std::uniform_int_distribution<int64_t>(0, full_us + full_us / 5)(rng());
  }

  std::vector<std::string> collect_args() const {
    return {"collect", "-m", kTiny, "--files", (root_ / "list.txt").string(), "--out", "d.kvzd", "--windows", "24",
            "--tokens-per-window", "16", "--min-tokens", "40", "--max-tokens", "80", "-t", "1"};
  }

  fs::path root_;
};

TEST_F(CrashSafety, CollectKilledAtRandomResumesIdentically) {
  const fs::path ref = fresh("ref");
  const int64_t full = timed(ref, collect_args());
  const std::string want = slurp(ref / "d.kvzd");
  ASSERT_GT(want.size(), 64u);
  const Dataset want_ds = Dataset::open((ref / "d.kvzd").string());
  for (int t = 0; t < trials(); t++) {
    const fs::path dir = fresh("collect" + std::to_string(t));
    // Up to three kills, then a run to the end.
    for (int k = 0; k < 3; k++) {
      run(dir, collect_args(), kill_point(full));
      if (!fs::exists(dir / "d.kvzd")) continue;
      // Whatever is on disk reads as a prefix of the reference (or is refused), never as other data.
      try {
        const Dataset d = Dataset::open((dir / "d.kvzd").string());
        ASSERT_LE(d.size(), want_ds.size());
        const std::string got = slurp(dir / "d.kvzd");
        const size_t whole = 64 + (size_t)d.size() * d.shape().record_bytes();
        ASSERT_EQ(got.compare(64, whole - 64, want, 64, whole - 64), 0) << "trial " << t << " kill " << k;
      } catch (const Error&) {
      }
    }
    ASSERT_TRUE(run(dir, collect_args()));
    EXPECT_EQ(slurp(dir / "d.kvzd"), want) << "trial " << t;
    EXPECT_EQ(slurp(dir / "d.kvzd.json"), slurp(ref / "d.kvzd.json"));
    EXPECT_EQ(slurp(dir / "d.kvzd.windows.tsv"), slurp(ref / "d.kvzd.windows.tsv"));
  }
}

TEST_F(CrashSafety, TrainKilledAtRandomLeavesOldOrNewModels) {
  const fs::path ref = fresh("ref");
  ASSERT_TRUE(run(ref, collect_args()));
  const std::vector<std::string> train = {"train", "--data", (ref / "d.kvzd").string(), "--test",
                                          (ref / "d.kvzd").string(), "--out", "surr", "--kind", "both",
                                          "--epochs", "20", "-t", "1"};
  const int64_t full = timed(ref, train);
  const char* files[] = {"config.json", "model.safetensors", "true.npy", "pred.npy"};
  for (int t = 0; t < trials(); t++) {
    const fs::path dir = fresh("train" + std::to_string(t));
    for (int k = 0; k < 3; k++) {
      run(dir, train, kill_point(full));
      // A model folder that exists is complete and is the reference's.
      for (const char* kind : {"linear", "mlp"}) {
        const fs::path m = dir / "surr" / kind;
        if (!fs::exists(m)) continue;
        for (const char* f : files) ASSERT_EQ(slurp(m / f), slurp(ref / "surr" / kind / f)) << m / f;
        EXPECT_NO_THROW(Surrogate::load(m.string()));
      }
      if (fs::exists(dir / "surr" / "report.json")) {
        EXPECT_FALSE(nlohmann::json::parse(slurp(dir / "surr" / "report.json"), nullptr, false).is_discarded());
      }
    }
    ASSERT_TRUE(run(dir, train));
    for (const char* kind : {"linear", "mlp"})
      for (const char* f : files) EXPECT_EQ(slurp(dir / "surr" / kind / f), slurp(ref / "surr" / kind / f)) << kind << f;
  }
}

TEST_F(CrashSafety, CacheSaveKilledAtRandomIsAllOrNothing) {
  const fs::path ref = fresh("ref");
  const std::vector<std::string> gen = {"generate", "-m", kTiny, "-p", slurp(root_ / "doc0.txt").substr(0, 120), "-n", "1",
                                        "--temp", "0", "-t", "1", "--save-cache", "c.kvc"};
  const int64_t full = timed(ref, gen);
  const std::string want = slurp(ref / "c.kvc");
  ASSERT_GT(want.size(), 144u);
  const auto model = Model::load(kTiny);
  const ModelConfig& c = model->config();
  for (int t = 0; t < trials(); t++) {
    const fs::path dir = fresh("cache" + std::to_string(t));
    for (int k = 0; k < 3; k++) {
      run(dir, gen, kill_point(full));
      if (!fs::exists(dir / "c.kvc")) continue;
      EXPECT_EQ(slurp(dir / "c.kvc"), want) << "a torn cache file under the final name";
      KvCache cache(c.n_layer, c.n_head_kv, c.head_dim);
      EXPECT_NO_THROW(load_cache_file((dir / "c.kvc").string(), *model, cache));
    }
    ASSERT_TRUE(run(dir, gen));
    EXPECT_EQ(slurp(dir / "c.kvc"), want);
    for (const auto& e : fs::directory_iterator(dir)) {  // temporaries of killed runs aside, only c.kvc
      if (e.path().filename() != "c.kvc") {
        EXPECT_NE(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
      }
    }
  }
}

TEST_F(CrashSafety, SweepKilledAtRandomFinishesWithTheSameResults) {
  // Three cells x 2 tasks x 12 samples on the tiny model; killed up to three times at random points, then
  // run to the end: every file a later step reads (results.csv, each cell's summary / tasks / samples)
  // equals the uninterrupted run's, timings aside, and a cell with a summary is complete and final.
  const std::vector<std::string> sweep = {"sweep", "-m", kTiny, "--presses", "knorm,random", "--ratios", "0.5",
                                          "--length", "300", "--samples", "12", "--tasks",
                                          "niah_single_1,niah_single_2", "--out", "out", "-t", "1"};
  // JSON documents (one, or one per line) without their "timings" objects.
  auto without_timings = [](const fs::path& p) {
    std::string out;
    std::istringstream lines(slurp(p));
    const bool per_line = p.extension() == ".jsonl";
    std::string doc = per_line ? "" : lines.str(), line;
    auto strip = [&](const std::string& text) {
      nlohmann::json j = nlohmann::json::parse(text);
      j.erase("timings");
      out += j.dump() + "\n";
    };
    if (!per_line) {
      strip(doc);
    } else {
      while (std::getline(lines, line))
        if (!line.empty()) strip(line);
    }
    return out;
  };
  const fs::path ref = fresh("ref");
  const int64_t full = timed(ref, sweep);
  const char* cells[] = {"no_press", "knorm__ratio_0.5", "random__ratio_0.5"};
  ASSERT_GT(slurp(ref / "out" / "results.csv").size(), 40u);
  for (int t = 0; t < trials(); t++) {
    const fs::path dir = fresh("sweep" + std::to_string(t));
    for (int k = 0; k < 3; k++) {
      run(dir, sweep, kill_point(full));
      for (const char* c : cells)  // the summary is written last: its cell is complete
        if (fs::exists(dir / "out" / c / "summary.json")) {
          EXPECT_EQ(without_timings(dir / "out" / c / "summary.json"), without_timings(ref / "out" / c / "summary.json"))
              << c;
          EXPECT_EQ(slurp(dir / "out" / c / "tasks.csv"), slurp(ref / "out" / c / "tasks.csv")) << c;
        }
    }
    ASSERT_TRUE(run(dir, sweep));
    EXPECT_EQ(slurp(dir / "out" / "results.csv"), slurp(ref / "out" / "results.csv")) << "trial " << t;
    for (const char* c : cells) {
      EXPECT_EQ(without_timings(dir / "out" / c / "summary.json"), without_timings(ref / "out" / c / "summary.json"))
          << "trial " << t << " " << c;
      EXPECT_EQ(without_timings(dir / "out" / c / "samples.jsonl"), without_timings(ref / "out" / c / "samples.jsonl"))
          << "trial " << t << " " << c;
      EXPECT_EQ(slurp(dir / "out" / c / "tasks.csv"), slurp(ref / "out" / c / "tasks.csv")) << "trial " << t << " " << c;
      EXPECT_EQ(slurp(dir / "out" / c / "tasks.json"), slurp(ref / "out" / c / "tasks.json")) << "trial " << t << " " << c;
    }
  }
}

}  // namespace
