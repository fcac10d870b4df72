// Safetensors writer/reader round trip, plus hand-built corrupt files that the reader must reject.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "format/safetensors.h"

namespace {

using kvzap::SafetensorsFile;
using kvzap::TensorToWrite;

// u64 header length + header text + data, as the format describes.
std::string make_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvzap_st_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& bytes) {
    const std::string p = dir_ + "/t.safetensors";
    std::ofstream(p, std::ios::binary).write(bytes.data(), (std::streamsize)bytes.size());
    return p;
  }
  static std::string read(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  void expect_reject(const std::string& bytes, const std::string& needle) {
    const std::string p = write(bytes);
    try {
      SafetensorsFile::open(p);
      ADD_FAILURE() << "accepted a corrupt file; expected error containing '" << needle << "'";
    } catch (const kvzap::Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
    }
  }
  std::string dir_;
};

TEST_F(SafetensorsTest, RoundTrip) {
  const std::string p = dir_ + "/rt.safetensors";
  // BF16 keeps 8 significant bits: 1 + 2^-8 is a tie and rounds to even (1.0); 1 + 3·2^-9 rounds up
  // to 1 + 2^-7.
  const std::vector<TensorToWrite> in = {
      {"layer.0.w", "F32", {2, 3}, {1.0f, -2.5f, 3.25f, 1e-7f, -0.0f, 65504.0f}},
      {"layer.0.b", "BF16", {4}, {1.5f, -2.25f, 1.00390625f, 1.005859375f}},
      {"scalar", "F32", {}, {42.0f}},
      {"empty", "F32", {0, 5}, {}},
  };
  kvzap::write_safetensors(p, in, {{"format", "pt"}, {"note", "kvzap test"}});

  const std::string bytes = read(p);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  EXPECT_EQ(bytes.size(), 8 + header_len + 6 * 4 + 4 * 2 + 4);
  const std::string header = bytes.substr(8, header_len);
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));  // padded with spaces only

  const auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("note"), "kvzap test");

  const auto& w = f->tensor("layer.0.w");
  EXPECT_EQ(w.dtype, "F32");
  EXPECT_EQ(w.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w.n_bytes, 24u);
  EXPECT_EQ(w.n_elements(), 6);
  EXPECT_EQ(f->to_f32(w), in[0].values);
  EXPECT_TRUE(std::signbit(f->to_f32(w)[4]));

  const auto& b = f->tensor("layer.0.b");
  EXPECT_EQ(b.dtype, "BF16");
  EXPECT_EQ(b.n_bytes, 8u);
  EXPECT_EQ(f->to_f32(b), (std::vector<float>{1.5f, -2.25f, 1.0f, 1.0078125f}));

  const auto& s = f->tensor("scalar");
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(f->to_f32(s), std::vector<float>{42.0f});
  EXPECT_EQ(f->tensor("empty").n_bytes, 0u);
  EXPECT_TRUE(f->to_f32(f->tensor("empty")).empty());

  EXPECT_EQ(f->find("nope"), nullptr);
  try {
    f->tensor("nope");
    FAIL() << "no throw";
  } catch (const kvzap::Error& e) {
    EXPECT_EQ(std::string(e.what()), p + ": missing tensor 'nope'");
  }
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  const std::string p = dir_ + "/bad.safetensors";
  EXPECT_THROW(kvzap::write_safetensors(p, {{"a", "F32", {2, 2}, {1, 2, 3}}}), kvzap::Error);
  EXPECT_THROW(kvzap::write_safetensors(p, {{"a", "F16", {1}, {1}}}), kvzap::Error);
  EXPECT_THROW(kvzap::write_safetensors(p, {{"a", "F32", {1}, {1}}, {"a", "F32", {1}, {2}}}), kvzap::Error);
  EXPECT_THROW(kvzap::write_safetensors(p, {{"__metadata__", "F32", {1}, {1}}}), kvzap::Error);
  EXPECT_THROW(kvzap::write_safetensors(p, {{"bad\xff", "F32", {1}, {1}}}), kvzap::Error);
  EXPECT_FALSE(std::filesystem::exists(p));
}

TEST_F(SafetensorsTest, ReadsOtherDtypes) {
  std::string data;
  const uint16_t h[2] = {0x3c00, 0xc000};  // F16 1.0, -2.0
  data.append(reinterpret_cast<const char*>(h), 4);
  const int32_t i[2] = {-7, 123456};
  data.append(reinterpret_cast<const char*>(i), 8);
  data += std::string("\x01\x00\x05", 3);  // BOOL 1, 0 then U8 5
  const std::string header = R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
                             R"("i":{"dtype":"I32","shape":[2],"data_offsets":[4,12]},)"
                             R"("b":{"dtype":"BOOL","shape":[2],"data_offsets":[12,14]},)"
                             R"("u":{"dtype":"U8","shape":[1],"data_offsets":[14,15]},)"
                             R"("f8":{"dtype":"F8_E4M3","shape":[0],"data_offsets":[15,15]}})";
  const auto f = SafetensorsFile::open(write(make_file(header, data)));
  EXPECT_EQ(f->to_f32(f->tensor("h")), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(f->to_f32(f->tensor("i")), (std::vector<float>{-7.0f, 123456.0f}));
  EXPECT_EQ(f->to_f32(f->tensor("b")), (std::vector<float>{1.0f, 0.0f}));
  EXPECT_EQ(f->to_f32(f->tensor("u")), (std::vector<float>{5.0f}));
  EXPECT_THROW(f->to_f32(f->tensor("f8")), kvzap::Error);
  EXPECT_TRUE(f->metadata().empty());
}

TEST_F(SafetensorsTest, EveryTruncationIsRejected) {
  const std::string p = dir_ + "/full.safetensors";
  kvzap::write_safetensors(p, {{"a", "F32", {3}, {1, 2, 3}}, {"b", "BF16", {2}, {4, 5}}}, {{"k", "v"}});
  const std::string bytes = read(p);
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::string t = write(bytes.substr(0, n));
    EXPECT_THROW(SafetensorsFile::open(t), kvzap::Error) << "prefix of " << n << " bytes";
  }
  EXPECT_NO_THROW(SafetensorsFile::open(write(bytes)));
}

TEST_F(SafetensorsTest, ByteFlipsNeverCrash) {
  const std::string p = dir_ + "/full.safetensors";
  kvzap::write_safetensors(p, {{"a", "F32", {3}, {1, 2, 3}}, {"b", "BF16", {2}, {4, 5}}}, {{"k", "v"}});
  const std::string bytes = read(p);
  int rejected = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t v : {(uint8_t)(bytes[i] ^ 0xff), (uint8_t)'"', (uint8_t)'9'}) {
      std::string c = bytes;
      c[i] = (char)v;
      try {
        SafetensorsFile::open(write(c));
      } catch (const kvzap::Error&) {
        ++rejected;
      }
    }
  }
  EXPECT_GT(rejected, 0);
}

TEST_F(SafetensorsTest, RejectsCorruptHeaders) {
  const std::string data(16, '\0');
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  ASSERT_NO_THROW(SafetensorsFile::open(write(make_file("{" + ok_entry + "}", data))));

  std::string huge = make_file("{}", "");
  const uint64_t big = ~0ull;
  std::memcpy(huge.data(), &big, 8);
  expect_reject(huge, "exceeds the file size");
  expect_reject("short", "not a safetensors file");
  expect_reject(make_file("{\"a\": ", data), "not valid JSON");
  expect_reject(make_file("[1, 2]", data), "not a JSON object");
  expect_reject(make_file(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", data), "unknown dtype 'Q4'");
  expect_reject(make_file(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", data), "missing dtype");
  expect_reject(make_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data), "non-negative");
  expect_reject(make_file(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", data), "non-negative");
  expect_reject(make_file(R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", data), "bad shape");
  expect_reject(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,80]}})", data), "outside the data");
  expect_reject(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data), "outside the data");
  expect_reject(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", data), "data_offsets");
  expect_reject(make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data), "does not match");
  expect_reject(make_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", data),
                "does not match");
  expect_reject(make_file("{" + ok_entry + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", data),
                "overlap");
  expect_reject(make_file("{" + ok_entry + "," + ok_entry + "}", data), "duplicate header key 'a'");
  expect_reject(make_file("{" + ok_entry + R"(,"__metadata__":{"k":1}})", data), "__metadata__");
  expect_reject(make_file("{" + ok_entry + R"(,"__metadata__":[]})", data), "__metadata__");
  expect_reject(make_file(R"({"a":[1]})", data), "not an object");
  // A top-level name repeated at a deeper level (inside __metadata__) is not a duplicate.
  EXPECT_NO_THROW(SafetensorsFile::open(
      write(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"a":"x"}})", data))));
}

TEST_F(SafetensorsTest, MissingFile) {
  try {
    SafetensorsFile::open(dir_ + "/absent.safetensors");
    FAIL() << "no throw";
  } catch (const kvzap::Error& e) {
    EXPECT_EQ(std::string(e.what()), dir_ + "/absent.safetensors: no such file");
  }
}

}  // namespace
