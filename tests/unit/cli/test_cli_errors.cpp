// Bad input at the command line: a clear one-line error, a non-zero exit, no crash and no partial output.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "test_support.h"

namespace kvzap {
namespace {

namespace fs = std::filesystem;

// One line on stderr starting "kvzap: error:", nothing on stdout, exit 1 (not a signal).
void expect_clean_error(const test::CommandResult& r, const std::string& must_mention) {
  EXPECT_EQ(r.exit_code, 1) << "stderr: " << r.err;
  EXPECT_TRUE(r.out.empty()) << "partial output on stdout: " << r.out;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.rfind("kvzap: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "not one line: " << r.err;
  EXPECT_NE(r.err.find(must_mention), std::string::npos) << "error does not mention '" << must_mention << "': " << r.err;
}

class CliErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = test::default_model_path();
    ASSERT_TRUE(fs::exists(model_)) << "default model not found at " << model_ << ": run `kvzap pull` (or set KVZAP_MODEL)";
    dir_ = fs::temp_directory_path() / ("kvzap_cli_errors_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }
  std::string model_bytes(size_t n) {
    std::ifstream in(model_, std::ios::binary);
    std::string s(n, '\0');
    in.read(s.data(), (std::streamsize)n);
    return s.substr(0, (size_t)in.gcount());
  }
  std::string model_;
  fs::path dir_;
};

TEST_F(CliErrors, MissingModelFile) {
  expect_clean_error(test::run_kvzap("generate -m /nonexistent/model.gguf -p hi -n 1"), "/nonexistent/model.gguf");
}

TEST_F(CliErrors, TruncatedModelFile) {
  for (size_t n : {size_t(3), size_t(100), size_t(4096), size_t(1) << 20}) {
    const std::string p = write("trunc_" + std::to_string(n) + ".gguf", model_bytes(n));
    expect_clean_error(test::run_kvzap("generate -m '" + p + "' -p hi -n 1"), p);
  }
}

TEST_F(CliErrors, CorruptedHeader) {
  std::string b = model_bytes(1 << 20);
  b[0] = 'X';  // magic
  expect_clean_error(test::run_kvzap("generate -m '" + write("magic.gguf", b) + "' -p hi -n 1"), "magic");
  b = model_bytes(1 << 20);
  for (int i = 8; i < 16; i++) b[i] = (char)0xff;  // tensor count
  const std::string p = write("count.gguf", b);
  expect_clean_error(test::run_kvzap("generate -m '" + p + "' -p hi -n 1"), p);
}

TEST_F(CliErrors, UnsupportedArchitecture) {
  // Same file with general.architecture renamed (same length, so every offset stays valid).
  std::ifstream in(model_, std::ios::binary);
  std::string b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "general.architecture";
  const size_t at = b.find(key);
  ASSERT_NE(at, std::string::npos);
  const size_t value = b.find("llama", at + key.size());
  ASSERT_LT(value - at, 64u);
  b.replace(value, 5, "mamba");
  const std::string p = write("mamba.gguf", b);
  expect_clean_error(test::run_kvzap("generate -m '" + p + "' -p hi -n 1"), "unsupported architecture 'mamba'");
}

TEST_F(CliErrors, PromptLongerThanContext) {
  std::string text;
  for (int i = 0; i < 100; i++) text += "The quick brown fox jumps over the lazy dog. ";
  const std::string p = write("long.txt", text);
  expect_clean_error(test::run_kvzap("generate -m '" + model_ + "' -c 64 -f '" + p + "' -n 4"), "longer than the context");
}

TEST_F(CliErrors, InvalidUtf8Prompt) {
  const std::string p = write("bad.txt", std::string("hello \xff\xfe world"));
  expect_clean_error(test::run_kvzap("generate -m '" + model_ + "' -f '" + p + "' -n 4"), "invalid UTF-8 at byte 6");
  expect_clean_error(test::run_kvzap("generate -m '" + model_ + "' -p \"$(printf 'caf\\303')\" -n 4"), "invalid UTF-8");
  expect_clean_error(test::run_kvzap("perplexity -m '" + model_ + "' -f '" + p + "'"), "invalid UTF-8");
}

TEST_F(CliErrors, BadPressOptions) {
  expect_clean_error(test::run_kvzap("generate -m '" + model_ + "' -p hi -n 1 --press nosuchpress --ratio 0.5"), "nosuchpress");
  expect_clean_error(test::run_kvzap("generate -m '" + model_ + "' -p hi -n 1 --ratio 0.5"), "--press");
}

// --kv-type takes f16 or f32 only; a cache saved under one type is refused under the other, naming the fix.
TEST_F(CliErrors, KvTypeMismatchAndBadKvType) {
  // A bad choice is a usage error from the option parser (as for --ratio-scope): non-zero, nothing on stdout.
  const test::CommandResult bad = test::run_kvzap("generate -m '" + model_ + "' -p hi -n 1 --kv-type q8");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_TRUE(bad.out.empty()) << bad.out;
  EXPECT_NE(bad.err.find("--kv-type"), std::string::npos) << bad.err;
  const std::string saved = (dir_ / "c.kvc").string();
  const test::CommandResult r =
      test::run_kvzap("generate -m '" + model_ + "' -p 'The cat sat' -n 1 --temp 0 -t 1 --kv-type f32 --save-cache '" + saved + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_clean_error(test::run_kvzap("generate -m '" + model_ + "' -p ' on' -n 1 -t 1 --load-cache '" + saved + "'"),
                     "rerun with --kv-type f32");
  EXPECT_EQ(test::run_kvzap("generate -m '" + model_ + "' -p ' on' -n 1 -t 1 --kv-type f32 --load-cache '" + saved + "'").exit_code, 0);
}

}  // namespace
}  // namespace kvzap
