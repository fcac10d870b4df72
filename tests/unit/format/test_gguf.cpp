// GGUF reader tests: a tiny GGUF writer builds valid files, which are then read back and corrupted in
// every way the reader must reject (truncation at every length, bad counts, bad types, bad offsets...).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "test_support.h"

namespace {

using kvzap::GgmlType;
using kvzap::gguf::File;

// ---- a minimal GGUF writer (independent of the reader under test) ----

struct Bytes {
  std::string b;
  Bytes& u8(uint8_t v) { b.push_back((char)v); return *this; }
  Bytes& u32(uint32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); return *this; }
  Bytes& u64(uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); return *this; }
  Bytes& i32(int32_t v) { return u32((uint32_t)v); }
  Bytes& f32(float v) { b.append(reinterpret_cast<const char*>(&v), 4); return *this; }
  Bytes& f64(double v) { b.append(reinterpret_cast<const char*>(&v), 8); return *this; }
  Bytes& str(const std::string& s) { u64(s.size()); b += s; return *this; }
};

// A metadata entry: value type id followed by the encoded value.
struct KV {
  std::string key;
  std::string typed_value;
};
KV kv_u32(const std::string& k, uint32_t v) { return {k, Bytes().u32(4).u32(v).b}; }
KV kv_i32(const std::string& k, int32_t v) { return {k, Bytes().u32(5).i32(v).b}; }
KV kv_u8(const std::string& k, uint8_t v) { return {k, Bytes().u32(0).u8(v).b}; }
KV kv_u64(const std::string& k, uint64_t v) { return {k, Bytes().u32(10).u64(v).b}; }
KV kv_f32(const std::string& k, float v) { return {k, Bytes().u32(6).f32(v).b}; }
KV kv_f64(const std::string& k, double v) { return {k, Bytes().u32(12).f64(v).b}; }
KV kv_bool(const std::string& k, bool v) { return {k, Bytes().u32(7).u8(v ? 1 : 0).b}; }
KV kv_str(const std::string& k, const std::string& v) { return {k, Bytes().u32(8).str(v).b}; }
KV kv_str_array(const std::string& k, const std::vector<std::string>& v) {
  Bytes b;
  b.u32(9).u32(8).u64(v.size());
  for (auto& s : v) b.str(s);
  return {k, b.b};
}
KV kv_i32_array(const std::string& k, const std::vector<int32_t>& v) {
  Bytes b;
  b.u32(9).u32(5).u64(v.size());
  for (int32_t x : v) b.i32(x);
  return {k, b.b};
}
KV kv_f32_array(const std::string& k, const std::vector<float>& v) {
  Bytes b;
  b.u32(9).u32(6).u64(v.size());
  for (float x : v) b.f32(x);
  return {k, b.b};
}

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type = 0;
  std::optional<uint64_t> offset;  // automatic (packed, aligned) when absent
};

struct Spec {
  std::string magic = "GGUF";
  uint32_t version = 3;
  std::vector<KV> kv;
  std::vector<TensorSpec> tensors;
  uint64_t alignment = 32;
  std::optional<uint64_t> n_kv, n_tensors;  // override the written counts
};

// Block geometry written out here independently from the reader's table (ggml docs).
uint64_t test_tensor_bytes(uint32_t type, const std::vector<uint64_t>& ne) {
  uint64_t n = 1;
  for (uint64_t d : ne) n *= d;
  switch (type) {
    case 0: return n * 4;          // F32
    case 1: case 30: return n * 2;  // F16, BF16
    case 2: return n / 32 * 18;     // Q4_0
    case 3: return n / 32 * 20;     // Q4_1
    case 8: return n / 32 * 34;     // Q8_0
    case 12: return n / 256 * 144;  // Q4_K
    case 14: return n / 256 * 210;  // Q6_K
    default: return 0;
  }
}

uint8_t data_pattern(size_t tensor, uint64_t i) { return (uint8_t)(tensor * 37 + i * 7 + 1); }

// Builds the file; the last tensor ends exactly at the end of the file (no trailing padding).
std::string build(const Spec& s) {
  Bytes b;
  b.b += s.magic;
  b.u32(s.version).u64(s.n_tensors.value_or(s.tensors.size())).u64(s.n_kv.value_or(s.kv.size()));
  for (const KV& kv : s.kv) {
    b.str(kv.key);
    b.b += kv.typed_value;
  }
  const uint64_t al = s.alignment;
  std::vector<uint64_t> offsets;
  uint64_t next = 0;
  for (const TensorSpec& t : s.tensors) {
    const uint64_t off = t.offset.value_or(next);
    offsets.push_back(off);
    next = (off + test_tensor_bytes(t.type, t.ne) + al - 1) / al * al;
  }
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    const TensorSpec& t = s.tensors[i];
    b.str(t.name).u32((uint32_t)t.ne.size());
    for (uint64_t d : t.ne) b.u64(d);
    b.u32(t.type).u64(offsets[i]);
  }
  if (s.tensors.empty()) return b.b;
  while (b.b.size() % al) b.u8(0);
  const size_t data_start = b.b.size();
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    const uint64_t n = test_tensor_bytes(s.tensors[i].type, s.tensors[i].ne);
    if (n > (1u << 20) || offsets[i] > (1u << 20)) continue;  // absurd test sizes/offsets: leave no data
    if (b.b.size() < data_start + offsets[i] + n) b.b.resize(data_start + offsets[i] + n, '\0');
    for (uint64_t j = 0; j < n; ++j) b.b[data_start + offsets[i] + j] = (char)data_pattern(i, j);
  }
  return b.b;
}

Spec valid_spec() {
  Spec s;
  s.kv = {kv_str("general.architecture", "llama"),
          kv_u32("llama.block_count", 2),
          kv_i32("llama.signed", -7),
          kv_u8("small", 200),
          kv_u64("big", 1ull << 40),
          kv_f32("llama.rope.freq_base", 10000.5f),
          kv_f64("f64", 0.125),
          kv_bool("tokenizer.ggml.add_bos_token", true),
          kv_str_array("tokenizer.ggml.tokens", {"a", "b", "<|x|>"}),
          kv_i32_array("per_layer", {4, 5}),
          kv_f32_array("floats", {1.5f, -2.0f})};
  s.tensors = {{"token_embd.weight", {64, 3}, 8, {}},  // Q8_0
               {"norm.weight", {64}, 0, {}},           // F32
               {"blk.0.attn_q.weight", {32, 2}, 3, {}}, // Q4_1
               {"half", {5}, 1, {}}};                   // F16 (last; ends the file unpadded)
  return s;
}

class GgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvzap_gguf_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& bytes, const std::string& name = "t.gguf") {
    const std::string p = dir_ + "/" + name;
    std::ofstream(p, std::ios::binary).write(bytes.data(), (std::streamsize)bytes.size());
    return p;
  }
  // Expects open() to throw kvzap::Error whose message starts with the path and contains `needle`.
  void expect_reject(const std::string& bytes, const std::string& needle) {
    const std::string p = write(bytes);
    try {
      File::open(p);
      ADD_FAILURE() << "accepted a corrupt file; expected error containing '" << needle << "'";
    } catch (const kvzap::Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << "message must be one line: " << msg;
    }
  }
  std::string dir_;
};

TEST_F(GgufTest, ReadsValidFile) {
  const Spec s = valid_spec();
  const std::string bytes = build(s);
  const auto f = File::open(write(bytes));
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->file_size(), bytes.size());
  ASSERT_EQ(f->metadata().size(), s.kv.size());
  EXPECT_EQ(f->metadata()[0].first, "general.architecture");  // file order is kept

  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.block_count"), 2);
  EXPECT_EQ(f->get_int("llama.signed"), -7);
  EXPECT_EQ(f->get_int("small"), 200);
  EXPECT_EQ(f->get_int("big"), 1ll << 40);
  EXPECT_FLOAT_EQ((float)f->get_float("llama.rope.freq_base"), 10000.5f);
  EXPECT_EQ(f->get_float("f64"), 0.125);
  EXPECT_EQ(f->get_float("llama.block_count"), 2.0);  // integers widen to float
  EXPECT_TRUE(f->get_bool_opt("tokenizer.ggml.add_bos_token", false));
  EXPECT_FALSE(f->get_bool_opt("absent", false));
  EXPECT_TRUE(f->get_bool_opt("absent", true));
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens"), (std::vector<std::string>{"a", "b", "<|x|>"}));
  EXPECT_EQ(f->get_int_array("per_layer"), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(f->get_int_array("llama.block_count"), (std::vector<int64_t>{2}));  // scalar -> {x}
  EXPECT_EQ(f->get_float_array("floats"), (std::vector<double>{1.5, -2.0}));
  EXPECT_FALSE(f->get_int_opt("absent").has_value());
  EXPECT_FALSE(f->get_string_opt("absent").has_value());
  EXPECT_FALSE(f->get_float_opt("absent").has_value());
  EXPECT_TRUE(f->has("floats"));
  EXPECT_FALSE(f->has("absent"));

  ASSERT_EQ(f->tensors().size(), 4u);
  const auto& emb = f->tensor("token_embd.weight", {64, 3});
  EXPECT_EQ(emb.type, GgmlType::Q8_0);
  EXPECT_EQ(emb.n_elements(), 192);
  EXPECT_EQ(emb.n_bytes, 192u / 32 * 34);
  EXPECT_EQ(emb.offset, 0u);
  const auto* q = f->find_tensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, GgmlType::Q4_1);
  EXPECT_EQ(q->n_bytes, 40u);
  EXPECT_EQ(q->offset % 32, 0u);
  EXPECT_EQ(f->find_tensor("nope"), nullptr);
  // Data pointers land on the bytes the writer put there, aligned in memory too.
  for (size_t i = 0; i < f->tensors().size(); ++i) {
    const auto& t = f->tensors()[i];
    ASSERT_NE(t.data, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 32, 0u) << t.name;
    for (uint64_t j = 0; j < t.n_bytes; ++j) ASSERT_EQ(t.data[j], data_pattern(i, j)) << t.name << " byte " << j;
  }
}

TEST_F(GgufTest, GetterErrorsNameKeyAndType) {
  const std::string p = write(build(valid_spec()));
  const auto f = File::open(p);
  try {
    f->get_int("missing.key");
    FAIL() << "no throw";
  } catch (const kvzap::Error& e) {
    EXPECT_EQ(std::string(e.what()), p + ": missing metadata key 'missing.key'");
  }
  try {
    f->get_int("general.architecture");
    FAIL() << "no throw";
  } catch (const kvzap::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'general.architecture' has wrong type"), std::string::npos) << e.what();
  }
  EXPECT_THROW(f->get_string("llama.block_count"), kvzap::Error);
  EXPECT_THROW(f->get_float("general.architecture"), kvzap::Error);
  EXPECT_THROW(f->get_bool_opt("llama.block_count", false), kvzap::Error);
  EXPECT_THROW(f->get_string_array("per_layer"), kvzap::Error);
  EXPECT_THROW(f->get_int_array("tokenizer.ggml.tokens"), kvzap::Error);
  EXPECT_THROW(f->get_int_array("floats"), kvzap::Error);
  EXPECT_THROW(f->get_float_array("tokenizer.ggml.tokens"), kvzap::Error);
  EXPECT_THROW(f->get_int_opt("general.architecture"), kvzap::Error);
  try {
    f->tensor("token_embd.weight", {64, 4});
    FAIL() << "no throw";
  } catch (const kvzap::Error& e) {
    EXPECT_EQ(std::string(e.what()), p + ": tensor 'token_embd.weight' has shape [64, 3], expected [64, 4]");
  }
  try {
    f->tensor("output.weight", {64, 3});
    FAIL() << "no throw";
  } catch (const kvzap::Error& e) {
    EXPECT_EQ(std::string(e.what()), p + ": missing tensor 'output.weight'");
  }
}

TEST_F(GgufTest, ValueToStringAbbreviatesArrays) {
  const auto f = File::open(write(build(valid_spec())));
  EXPECT_EQ(f->value_to_string(*f->find("tokenizer.ggml.tokens"), 2), "[\"a\", \"b\", ... (3 items)]");
  EXPECT_EQ(f->value_to_string(*f->find("tokenizer.ggml.tokens"), 8), "[\"a\", \"b\", \"<|x|>\"]");
  EXPECT_EQ(f->value_to_string(*f->find("llama.block_count")), "2");
  EXPECT_EQ(f->value_to_string(*f->find("tokenizer.ggml.add_bos_token")), "true");
  EXPECT_EQ(f->value_to_string(*f->find("f64")), "0.125");
  EXPECT_EQ(f->value_to_string(*f->find("llama.rope.freq_base")), "10000.5");
}

TEST_F(GgufTest, CustomAlignment) {
  Spec s = valid_spec();
  s.alignment = 64;
  s.kv.push_back(kv_u32("general.alignment", 64));
  const auto f = File::open(write(build(s)));
  EXPECT_EQ(f->alignment(), 64u);
  for (const auto& t : f->tensors()) EXPECT_EQ(t.offset % 64, 0u);
  EXPECT_EQ(f->tensors()[2].data[0], data_pattern(2, 0));
}

TEST_F(GgufTest, NoTensorsIsValid) {
  Spec s;
  s.kv = {kv_str("general.architecture", "x")};
  const auto f = File::open(write(build(s)));
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->get_string("general.architecture"), "x");
}

TEST_F(GgufTest, VersionTwoAccepted) {
  Spec s = valid_spec();
  s.version = 2;
  EXPECT_EQ(File::open(write(build(s)))->version(), 2u);
}

TEST_F(GgufTest, EveryTruncationIsRejected) {
  const std::string bytes = build(valid_spec());
  ASSERT_GT(bytes.size(), 300u);
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::string p = write(bytes.substr(0, n));
    try {
      File::open(p);
      ADD_FAILURE() << "accepted a file truncated to " << n << " of " << bytes.size() << " bytes";
    } catch (const kvzap::Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(p + ": ", 0), 0u) << e.what();
    }
  }
}

// Every single-byte corruption either parses or throws kvzap::Error (never crashes or throws anything else).
TEST_F(GgufTest, ByteFlipsNeverCrash) {
  const std::string bytes = build(valid_spec());
  int rejected = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t v : {(uint8_t)(bytes[i] ^ 0xff), (uint8_t)(bytes[i] + 1)}) {
      std::string c = bytes;
      c[i] = (char)v;
      try {
        File::open(write(c));
      } catch (const kvzap::Error&) {
        ++rejected;
      }
    }
  }
  EXPECT_GT(rejected, 0);
}

TEST_F(GgufTest, MissingFile) {
  try {
    File::open(dir_ + "/absent.gguf");
    FAIL() << "no throw";
  } catch (const kvzap::Error& e) {
    EXPECT_EQ(std::string(e.what()), dir_ + "/absent.gguf: no such file");
  }
  EXPECT_THROW(File::open(dir_), kvzap::Error);  // a directory
}

TEST_F(GgufTest, RejectsBadMagic) {
  Spec s = valid_spec();
  s.magic = "GGUX";
  expect_reject(build(s), "bad magic");
  expect_reject("", "not a GGUF file");
}

TEST_F(GgufTest, RejectsBadVersions) {
  Spec s = valid_spec();
  for (uint32_t v : {0u, 1u, 4u, 1000u}) {
    s.version = v;
    expect_reject(build(s), "version");
  }
  s.version = 0x03000000;  // a big-endian v3 file read as little-endian
  expect_reject(build(s), "big-endian");
}

TEST_F(GgufTest, RejectsHugeCounts) {
  Spec s = valid_spec();
  s.n_kv = 1ull << 62;
  expect_reject(build(s), "metadata count");
  s = valid_spec();
  s.n_tensors = 1ull << 40;
  expect_reject(build(s), "tensor count");
  s = valid_spec();
  s.n_kv = s.kv.size() + 1;  // one more than present: runs into the tensor infos
  EXPECT_THROW(File::open(write(build(s))), kvzap::Error);
}

TEST_F(GgufTest, RejectsHugeStringAndArrayLengths) {
  Spec s = valid_spec();
  s.kv.push_back({"bad.string", Bytes().u32(8).u64(1ull << 60).b});
  expect_reject(build(s), "claims");
  s = valid_spec();
  s.kv.push_back({"bad.array", Bytes().u32(9).u32(4).u64(1ull << 61).b});
  expect_reject(build(s), "cannot fit");
  s = valid_spec();
  s.kv.push_back({"bad.string_array", Bytes().u32(9).u32(8).u64(~0ull).b});
  expect_reject(build(s), "cannot fit");
  // A huge key length.
  std::string bytes = build(valid_spec());
  const uint64_t huge = ~0ull - 3;
  std::memcpy(&bytes[24], &huge, 8);  // first key's length
  expect_reject(bytes, "metadata key");
}

TEST_F(GgufTest, RejectsBadValues) {
  Spec s = valid_spec();
  s.kv.push_back({"bad.type", Bytes().u32(13).u32(0).b});
  expect_reject(build(s), "unknown value type 13");
  s = valid_spec();
  s.kv.push_back({"bad.elem", Bytes().u32(9).u32(77).u64(1).u32(0).b});
  expect_reject(build(s), "unknown array element type");
  s = valid_spec();
  s.kv.push_back({"bad.bool", Bytes().u32(7).u8(2).b});
  expect_reject(build(s), "bool");
  s = valid_spec();
  s.kv.push_back(kv_u64("bad.u64", ~0ull));
  expect_reject(build(s), "too large");
  s = valid_spec();
  s.kv.push_back(kv_str("", "empty key"));
  expect_reject(build(s), "empty metadata key");
}

TEST_F(GgufTest, NestedArraysAreBounded) {
  // Depth 2 (array of arrays of u32) is fine.
  Spec s = valid_spec();
  s.kv.push_back({"nested", Bytes().u32(9).u32(9).u64(2).u32(4).u64(1).u32(7).u32(4).u64(0).b});
  const auto f = File::open(write(build(s)));
  EXPECT_EQ(f->value_to_string(*f->find("nested")), "[[7], []]");
  // A chain of 64 nested arrays is not sane.
  Bytes deep;
  deep.u32(9);
  for (int i = 0; i < 64; ++i) deep.u32(9).u64(1);
  deep.u32(4).u64(0);
  s = valid_spec();
  s.kv.push_back({"deep", deep.b});
  expect_reject(build(s), "nested too deeply");
}

TEST_F(GgufTest, RejectsDuplicates) {
  Spec s = valid_spec();
  s.kv.push_back(kv_u32("llama.block_count", 3));
  expect_reject(build(s), "duplicate metadata key 'llama.block_count'");
  s = valid_spec();
  s.tensors.push_back({"norm.weight", {64}, 0, {}});
  expect_reject(build(s), "duplicate tensor 'norm.weight'");
}

TEST_F(GgufTest, RejectsBadTensorTypes) {
  Spec s = valid_spec();
  s.tensors[1].type = 4;  // removed Q4_2
  expect_reject(build(s), "unknown ggml type 4");
  s.tensors[1].type = 99;
  expect_reject(build(s), "unknown ggml type 99");
  s.tensors[1].type = 10;  // Q2_K: known but not supported
  s.tensors[1].ne = {256};
  expect_reject(build(s), "unsupported type Q2_K");
}

TEST_F(GgufTest, RejectsBadShapes) {
  Spec s = valid_spec();
  s.tensors[2].ne = {48, 2};  // Q4_1 rows must be a multiple of 32
  expect_reject(build(s), "not a multiple of the Q4_1 block size 32");
  s = valid_spec();
  s.tensors[1].ne = {};
  expect_reject(build(s), "0 dimensions");
  s.tensors[1].ne = {1, 1, 1, 1, 64};
  expect_reject(build(s), "5 dimensions");
  s.tensors[1].ne = {64, 0};
  expect_reject(build(s), "invalid dimension 0");
  s.tensors[1].ne = {1ull << 32, 1ull << 32, 1ull << 32};
  expect_reject(build(s), "overflows");
  s.tensors[1].ne = {1ull << 31, 1ull << 31};  // fits in int64 but far larger than the file
  expect_reject(build(s), "larger than the file");
  s.tensors[1].ne = {1ull << 63};
  expect_reject(build(s), "invalid dimension");
}

TEST_F(GgufTest, RejectsBadOffsets) {
  Spec s = valid_spec();
  s.tensors[3].offset = 1ull << 40;  // past EOF
  expect_reject(build(s), "outside the file");
  s = valid_spec();
  s.tensors[3].offset = ~0ull & ~31ull;  // offset + size wraps around
  expect_reject(build(s), "outside the file");
  s = valid_spec();
  s.tensors[1].offset = 8;  // misaligned
  expect_reject(build(s), "not a multiple of the alignment");
  s = valid_spec();
  s.tensors[2].offset = 0;  // overlaps token_embd.weight
  expect_reject(build(s), "overlap");
}

TEST_F(GgufTest, RejectsBadAlignment) {
  for (uint32_t al : {0u, 48u, 3u}) {
    Spec s = valid_spec();
    s.kv.push_back(kv_u32("general.alignment", al));
    expect_reject(build(s), "general.alignment");
  }
  Spec s = valid_spec();
  s.kv.push_back(kv_str("general.alignment", "32"));
  expect_reject(build(s), "general.alignment");
}

// ---- the real model file ----

std::string find_model() {
  return kvzap::test::default_model_path();
}

TEST(GgufModel, SmolLM2Q4_1) {
  const std::string path = find_model();
  ASSERT_TRUE(std::filesystem::exists(path))
      << "default model not found at " << path << ": run `kvzap pull` (or set KVZAP_MODEL)";
  const auto f = File::open(path);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.block_count"), 30);
  EXPECT_EQ(f->get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 49152u);
  const auto& emb = f->tensor("token_embd.weight", {576, 49152});
  EXPECT_EQ(emb.type, GgmlType::Q8_0);
  EXPECT_EQ(emb.n_bytes, 576u / 32 * 34 * 49152);
  const auto& q = f->tensor("blk.0.attn_q.weight", {576, 576});
  EXPECT_EQ(q.type, GgmlType::Q4_1);
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);  // tied embeddings
  EXPECT_EQ(f->tensors().size(), 272u);                  // 30 * 9 + token_embd + output_norm
  size_t total = 0;
  for (const auto& t : f->tensors()) total += t.n_bytes;
  EXPECT_LT(total, f->file_size());
  EXPECT_GT(total, f->file_size() * 9 / 10);
}

// ---- `kvzap inspect` ----

// The CLI binary: $KVZAP_BIN (set by ctest), else `kvzap` next to this test binary.
std::string kvzap_bin() {
  if (const char* b = getenv("KVZAP_BIN"); b && *b) return b;
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "kvzap").string();
}

struct RunResult {
  int status;
  std::string out;
};
// Runs a shell command line and captures its stdout.
RunResult run_capture(const std::string& cmd) {
  RunResult r{-1, ""};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

TEST(InspectCli, JsonAndTextOnTheRealModel) {
  const std::string bin = kvzap_bin();
  ASSERT_TRUE(std::filesystem::exists(bin)) << "kvzap binary not found at " << bin << " (set KVZAP_BIN)";
  const std::string path = find_model();
  ASSERT_TRUE(std::filesystem::exists(path)) << "default model not found at " << path << ": run `kvzap pull`";

  const RunResult json = run_capture("'" + bin + "' inspect '" + path + "' --json --max-items 3");
  ASSERT_EQ(json.status, 0) << json.out;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["tensors"].size(), 272u);
  bool saw_arch = false, saw_tokens = false;
  for (const auto& kv : j["metadata"]) {
    if (kv["key"] == "general.architecture") saw_arch = kv["value"] == "llama";
    if (kv["key"] == "tokenizer.ggml.tokens") {
      saw_tokens = kv["length"] == 49152 && kv["value"].size() == 3;  // abbreviated to --max-items
      EXPECT_EQ(kv["type"], "array[string]");
    }
  }
  EXPECT_TRUE(saw_arch);
  EXPECT_TRUE(saw_tokens);
  // The totals agree with the tensor table and with the reader.
  const auto f = File::open(path);
  size_t sum = 0;
  for (const auto& t : j["tensors"]) sum += t["n_bytes"].get<size_t>();
  EXPECT_EQ(j["totals"]["n_bytes"].get<size_t>(), sum);
  size_t reader_sum = 0;
  for (const auto& t : f->tensors()) reader_sum += t.n_bytes;
  EXPECT_EQ(sum, reader_sum);
  EXPECT_EQ(j["tensors"][0]["name"], f->tensors()[0].name);
  EXPECT_EQ(j["tensors"][0]["ne"], nlohmann::json(f->tensors()[0].ne));

  const RunResult text = run_capture("'" + bin + "' inspect '" + path + "'");
  ASSERT_EQ(text.status, 0);
  EXPECT_NE(text.out.find("token_embd.weight"), std::string::npos);
  EXPECT_NE(text.out.find("[576, 49152]"), std::string::npos);
  EXPECT_NE(text.out.find("(49152 items)"), std::string::npos);
}

TEST(InspectCli, MissingFileIsOneLineError) {
  const std::string bin = kvzap_bin();
  ASSERT_TRUE(std::filesystem::exists(bin)) << "kvzap binary not found at " << bin << " (set KVZAP_BIN)";
  const RunResult r = run_capture("'" + bin + "' inspect /nonexistent/kvzap.gguf 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "kvzap: error: /nonexistent/kvzap.gguf: no such file\n");
}

}  // namespace
