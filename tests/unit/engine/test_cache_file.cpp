// Saved compressed caches (src/engine/cache_file.h): a pruned cache round-trips exactly (entries,
// positions, n_past, tokens, logits); a truncated, corrupt, other-version or foreign-model file is
// refused with a one-line error and leaves nothing behind.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "engine/cache_file.h"
#include "common/sha256.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "test_support.h"

namespace {

using namespace kvzap;

class CacheFile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = test::default_model_path();
    if (std::filesystem::exists(path)) model_ = Model::load(path).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "default model not downloaded (kvzap pull)";
    dir_ = std::filesystem::temp_directory_path() / ("kvzap_cache_file_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // A cache of n tokens with every third entry of head 0 evicted in every layer.
  std::unique_ptr<KvCache> make_cache(int n, KvType type = KvType::F16) {
    const ModelConfig& c = model_->config();
    auto cache = std::make_unique<KvCache>(c.n_layer, c.n_head_kv, c.head_dim, nullptr, type);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-2, 2);
    std::vector<float> k((size_t)n * c.n_head_kv * c.head_dim), v(k.size());  // [n][H][D]
    std::vector<int32_t> pos(n);
    for (int i = 0; i < n; i++) pos[i] = i;
    for (int l = 0; l < c.n_layer; l++) {
      for (auto& x : k) x = u(rng);
      for (auto& x : v) x = u(rng);
      cache->append_layer(l, n, k.data(), v.data(), pos.data());
      std::vector<uint8_t> drop((size_t)n, 0);
      for (int i = 0; i < n; i += 3) drop[i] = 1;
      cache->evict(l, 0, drop);
    }
    cache->set_n_past(n);
    return cache;
  }

  CacheFileMeta meta(int n) {
    CacheFileMeta m;
    m.press = "kvzap-mlp|t=1:-4";
    for (int i = 0; i < n; i++) m.tokens.push_back(i % 100 + 1);
    m.logits.assign(model_->config().n_vocab, 0.5f);
    m.logits[3] = 9;
    return m;
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string read(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  void write(const std::string& p, const std::string& data) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(data.data(), (std::streamsize)data.size());
  }
  // Rewrites the header checksum after a deliberate header change (so a later check is what fails).
  static void reseal_header(std::string& data, uint32_t version = 2) {
    const size_t used = 8 + 4 + 4 + 32 + 4 * 4 + 8 + 8 + 4 + 4 + (version >= 2 ? 4 : 0) + 8 + 32;
    const std::string hex = sha256_hex(data.data(), used);
    for (size_t i = 0; i < 8; i++) data[used + i] = (char)std::stoi(hex.substr(2 * i, 2), nullptr, 16);
  }

  void expect_refused(const std::string& p, const std::string& fragment, KvType type = KvType::F16) {
    const ModelConfig& c = model_->config();
    KvCache fresh(c.n_layer, c.n_head_kv, c.head_dim, nullptr, type);
    try {
      load_cache_file(p, *model_, fresh);
      FAIL() << "accepted " << p;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
    EXPECT_EQ(fresh.n_past(), 0);
    EXPECT_EQ(fresh.entries_kept(), 0);
  }

  void expect_round_trip(KvType type);

  static Model* model_;
  std::filesystem::path dir_;
};

Model* CacheFile::model_ = nullptr;

// Found by fuzz_cache_file (fuzz/regressions/cache_file/zero-tokens-null-memcpy): a file with no
// context tokens made the loader memcpy from a null vector (UB, caught by UBSan).
TEST_F(CacheFile, EmptyContextRoundTrips) {
  const ModelConfig& c = model_->config();
  KvCache empty(c.n_layer, c.n_head_kv, c.head_dim);
  CacheFileMeta m;
  m.press = "none";
  save_cache_file(path("empty.kvc"), *model_, empty, m);
  KvCache back(c.n_layer, c.n_head_kv, c.head_dim);
  const CacheFileMeta got = load_cache_file(path("empty.kvc"), *model_, back);
  EXPECT_TRUE(got.tokens.empty());
  EXPECT_TRUE(got.logits.empty());
  EXPECT_EQ(got.press, "none");
  EXPECT_EQ(back.n_past(), 0);
  EXPECT_EQ(back.entries_kept(), 0);
}

// Both KV types: the file holds the cache's own element type, byte for byte.
void CacheFile::expect_round_trip(KvType type) {
  const int n = 37;
  auto cache = make_cache(n, type);
  save_cache_file(path("a.kvc"), *model_, *cache, meta(n));
  const ModelConfig& c = model_->config();
  KvCache back(c.n_layer, c.n_head_kv, c.head_dim, nullptr, type);
  CacheFileMeta m = load_cache_file(path("a.kvc"), *model_, back);
  EXPECT_EQ(m.press, meta(n).press);
  EXPECT_EQ(m.tokens, meta(n).tokens);
  EXPECT_EQ(m.logits, meta(n).logits);
  EXPECT_EQ(back.n_past(), n);
  EXPECT_EQ(back.entries_kept(), cache->entries_kept());
  EXPECT_DOUBLE_EQ(back.evicted_fraction(), cache->evicted_fraction());
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++) {
      ASSERT_EQ(back.length(l, h), cache->length(l, h));
      for (int64_t i = 0; i < back.length(l, h); i++) {
        ASSERT_EQ(back.position_at(l, h, i), cache->position_at(l, h, i));
        std::vector<float> a((size_t)c.head_dim), b((size_t)c.head_dim);
        back.key_row(l, h, i, a.data());
        cache->key_row(l, h, i, b.data());
        ASSERT_EQ(a, b);
        back.value_row(l, h, i, a.data());
        cache->value_row(l, h, i, b.data());
        ASSERT_EQ(a, b);
      }
    }
  for (const auto& e : std::filesystem::directory_iterator(dir_))  // no temporary left behind
    EXPECT_EQ(e.path().filename(), "a.kvc") << e.path();
}

TEST_F(CacheFile, RoundTripIsExact) { expect_round_trip(KvType::F16); }
TEST_F(CacheFile, RoundTripIsExactF32) {
  expect_round_trip(KvType::F32);
  // The f32 file really holds f32 rows: twice the K/V bytes of the f16 file of the same cache.
  save_cache_file(path("h.kvc"), *model_, *make_cache(37, KvType::F16), meta(37));
  save_cache_file(path("f.kvc"), *model_, *make_cache(37, KvType::F32), meta(37));
  const ModelConfig& c = model_->config();
  const int64_t entries = make_cache(37)->entries_kept();
  EXPECT_EQ(read(path("f.kvc")).size() - read(path("h.kvc")).size(), (size_t)(entries * 2 * c.head_dim * 2));
}

// q8_0 / q4_0 caches (one row = head_dim / 32 ggml blocks): the quantised rows and their scales come
// back byte for byte, the files hold the quantised row sizes, and a file of another type is refused.
TEST_F(CacheFile, RoundTripIsExactQuantised) {
  expect_round_trip(KvType::Q8_0);
  expect_round_trip(KvType::Q4_0);
  save_cache_file(path("h.kvc"), *model_, *make_cache(37, KvType::F16), meta(37));
  save_cache_file(path("q8.kvc"), *model_, *make_cache(37, KvType::Q8_0), meta(37));
  save_cache_file(path("q4.kvc"), *model_, *make_cache(37, KvType::Q4_0), meta(37));
  const ModelConfig& c = model_->config();
  const int64_t entries = make_cache(37)->entries_kept();
  const size_t f16_row = (size_t)c.head_dim * 2, q8_row = (size_t)c.head_dim / 32 * 34, q4_row = (size_t)c.head_dim / 32 * 18;
  EXPECT_EQ(read(path("h.kvc")).size() - read(path("q8.kvc")).size(), (size_t)entries * 2 * (f16_row - q8_row));
  EXPECT_EQ(read(path("h.kvc")).size() - read(path("q4.kvc")).size(), (size_t)entries * 2 * (f16_row - q4_row));
  expect_refused(path("q8.kvc"), "holds q8_0 keys and values, but this run uses f16 (rerun with --kv-type q8_0)", KvType::F16);
  expect_refused(path("q8.kvc"), "holds q8_0 keys and values, but this run uses q4_0 (rerun with --kv-type q8_0)", KvType::Q4_0);
  expect_refused(path("q4.kvc"), "holds q4_0 keys and values, but this run uses q8_0 (rerun with --kv-type q4_0)", KvType::Q8_0);
  expect_refused(path("h.kvc"), "holds f16 keys and values, but this run uses q8_0 (rerun with --kv-type f16)", KvType::Q8_0);
}

// A file of the other KV type is refused with a one-line error that names both types and the fix
// (no silent conversion), and leaves the cache empty.
TEST_F(CacheFile, OtherKvTypeIsRefused) {
  save_cache_file(path("h.kvc"), *model_, *make_cache(20, KvType::F16), meta(20));
  save_cache_file(path("f.kvc"), *model_, *make_cache(20, KvType::F32), meta(20));
  expect_refused(path("h.kvc"), "holds f16 keys and values, but this run uses f32 (rerun with --kv-type f16)", KvType::F32);
  expect_refused(path("f.kvc"), "holds f32 keys and values, but this run uses f16 (rerun with --kv-type f32)", KvType::F16);
  std::string bad = read(path("f.kvc"));
  bad[88] = 7;  // the KV type field
  reseal_header(bad);
  write(path("bad.kvc"), bad);
  expect_refused(path("bad.kvc"), "unknown KV type 7", KvType::F32);
}

// Files written before the KV type existed (version 1: no type field, f16 rows) still load.
TEST_F(CacheFile, Version1FilesLoadAsF16) {
  auto cache = make_cache(20);
  save_cache_file(path("v2.kvc"), *model_, *cache, meta(20));
  std::string v1 = read(path("v2.kvc"));
  ASSERT_EQ(v1[88], 0);  // f16
  v1.erase(88, 4);       // drop the KV type field ...
  v1.insert(136, 4, '\0');  // ... keeping the 144-byte header
  const uint32_t one = 1;
  std::memcpy(&v1[8], &one, 4);
  reseal_header(v1, 1);
  write(path("v1.kvc"), v1);
  const ModelConfig& c = model_->config();
  KvCache back(c.n_layer, c.n_head_kv, c.head_dim);
  const CacheFileMeta m = load_cache_file(path("v1.kvc"), *model_, back);
  EXPECT_EQ(m.tokens, meta(20).tokens);
  ASSERT_EQ(back.entries_kept(), cache->entries_kept());
  for (int64_t i = 0; i < back.length(1, 0); i++)
    ASSERT_EQ(std::memcmp(back.key_at(1, 0, i), cache->key_at(1, 0, i), c.head_dim * 2), 0);
  expect_refused(path("v1.kvc"), "holds f16 keys and values", KvType::F32);
}

// A failed write (the file size limit stands in for a full disk) is a one-line error, leaves the
// previous good file byte for byte, and no temporary.
TEST_F(CacheFile, FailedWriteKeepsThePreviousFile) {
  auto small = make_cache(5);
  save_cache_file(path("a.kvc"), *model_, *small, meta(5));
  const std::string before = read(path("a.kvc"));
  auto big = make_cache(300);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // child: a file size limit below the new file's size; SIGXFSZ ignored -> EFBIG
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim {};
    lim.rlim_cur = lim.rlim_max = (rlim_t)before.size() + 4096;
    ::setrlimit(RLIMIT_FSIZE, &lim);
    try {
      save_cache_file(path("a.kvc"), *model_, *big, meta(300));
    } catch (const Error& e) {
      const std::string what = e.what();
      ::_exit(what.find("write failed") != std::string::npos && what.find('\n') == std::string::npos ? 42 : 1);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 42) << "the write did not fail with a clear error";
  EXPECT_EQ(read(path("a.kvc")), before);
  for (const auto& e : std::filesystem::directory_iterator(dir_)) EXPECT_EQ(e.path().filename(), "a.kvc") << e.path();
}

TEST_F(CacheFile, BadFilesAreRefused) {
  auto cache = make_cache(20);
  save_cache_file(path("good.kvc"), *model_, *cache, meta(20));
  const std::string good = read(path("good.kvc"));

  write(path("empty.kvc"), "");
  expect_refused(path("empty.kvc"), "truncated");
  write(path("short.kvc"), good.substr(0, 100));
  expect_refused(path("short.kvc"), "truncated");
  write(path("cut.kvc"), good.substr(0, good.size() - 10));
  expect_refused(path("cut.kvc"), "truncated");
  write(path("magic.kvc"), "NOTACACHE" + good.substr(9));
  expect_refused(path("magic.kvc"), "not a kvzap cache file");

  std::string version = good;
  version[8] = 99;
  write(path("version.kvc"), version);
  expect_refused(path("version.kvc"), "unsupported cache file version 99");

  std::string header = good;
  header[60] ^= 1;  // n_vocab, without resealing
  write(path("header.kvc"), header);
  expect_refused(path("header.kvc"), "header checksum");

  std::string foreign = good;
  foreign[16] ^= 0x55;  // the model fingerprint
  reseal_header(foreign);
  write(path("foreign.kvc"), foreign);
  expect_refused(path("foreign.kvc"), "another model");

  std::string corrupt = good;
  corrupt[corrupt.size() - 5] ^= 0x10;
  write(path("corrupt.kvc"), corrupt);
  expect_refused(path("corrupt.kvc"), "checksum");

  expect_refused(path("missing.kvc"), "cannot open");
}

TEST_F(CacheFile, FingerprintIsStable) {
  EXPECT_EQ(model_fingerprint(*model_), model_fingerprint(*model_));
  EXPECT_EQ(model_fingerprint(*model_).size(), 64u);
}

}  // namespace
