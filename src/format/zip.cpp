// Zip reader on libzip. libzip parses the central directory (ZIP64 included), inflates, and checks each
// member's CRC-32 when the whole member has been read; this file turns its error codes into messages that
// say what is wrong with which file, and streams members in fixed-size chunks.
#include "format/zip.h"

#include <zip.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace kvzap::zip {
namespace {

constexpr size_t kChunk = 1 << 18;

// Owns a zip_error_t for the duration of one message.
struct ErrorText {
  zip_error_t err;
  explicit ErrorText(int code) { zip_error_init_with_code(&err, code); }
  ~ErrorText() { zip_error_fini(&err); }
  std::string text() { return zip_error_strerror(&err); }
};

// True when the file starts like a zip (a local header signature, "PK\3\4"): libzip then failing to find
// the end of central directory means the file was cut short, not that it is something else.
bool starts_like_zip(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  unsigned char sig[4];
  return f && std::fread(sig, 1, 4, f.get()) == 4 && sig[0] == 'P' && sig[1] == 'K' && sig[2] == 3 && sig[3] == 4;
}

// What went wrong with a member, from the error of its zip_file_t (or of the archive for zip_fopen).
std::string member_problem(zip_error_t* err) {
  const int sys = zip_error_code_system(err);
  switch (zip_error_code_zip(err)) {
    case ZIP_ER_CRC:
      return "corrupt member: CRC-32 mismatch";
    case ZIP_ER_COMPRESSED_DATA:
    case ZIP_ER_ZLIB:
      return "corrupt member: invalid compressed data";
    case ZIP_ER_INCONS:
      return "corrupt member: its local header or data disagrees with the central directory";
    case ZIP_ER_EOF:
      return "truncated zip: the member's data lies past the end of the file";
    case ZIP_ER_COMPNOTSUPP:
      return "unsupported compression method";
    case ZIP_ER_ENCRNOTSUPP:
    case ZIP_ER_NOPASSWD:
      return "member is encrypted";
    case ZIP_ER_READ:
    case ZIP_ER_SEEK:
      return std::string("read error: ") + (sys ? std::strerror(sys) : "unknown");
    default:
      return zip_error_strerror(err);
  }
}

}  // namespace

struct Archive::Libzip {
  zip_t* z = nullptr;
  ~Libzip() {
    if (z) zip_discard(z);  // read-only: nothing to write back
  }
};

void Archive::fail(const std::string& problem) const { throw Error(path_ + ": " + problem); }

std::unique_ptr<Archive> Archive::open(const std::string& path) {
  std::unique_ptr<Archive> a(new Archive());
  a->path_ = path;
  int code = 0;
  // ZIP_CHECKCONS: also compare every local header with its central directory entry, so a damaged
  // archive is rejected at open rather than halfway through a multi-GB extraction.
  a->lz_ = std::make_unique<Libzip>();
  zip_t* z = a->lz_->z = zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &code);
  if (!z) {
    switch (code) {
      case ZIP_ER_NOENT:
        a->fail("no such file");
      case ZIP_ER_OPEN: {
        // zip_open's int code carries no errno: ask the system again for the reason.
        errno = 0;
        std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
        a->fail(std::string("cannot open: ") + (errno ? std::strerror(errno) : "unknown error"));
      }
      case ZIP_ER_NOZIP:
        if (starts_like_zip(path)) a->fail("truncated zip: no end of central directory record");
        a->fail("not a zip file");
      case ZIP_ER_INCONS:
        a->fail("corrupt zip: the central directory is inconsistent");
      case ZIP_ER_EXISTS:  // ZIP_CHECKCONS refuses two members of the same name
        a->fail("corrupt zip: two members have the same name");
      case ZIP_ER_MULTIDISK:
        a->fail("multi-disk zip archives are not supported");
      case ZIP_ER_READ:
      case ZIP_ER_SEEK:
        a->fail("read error (truncated or unreadable zip)");
      default:
        a->fail("cannot open zip: " + ErrorText(code).text());
    }
  }
  const zip_int64_t n = zip_get_num_entries(z, 0);
  if (n < 0) a->fail("cannot read the central directory");
  a->entries_.reserve((size_t)n);
  for (zip_int64_t i = 0; i < n; ++i) {
    zip_stat_t st;
    zip_stat_init(&st);
    // ENC_RAW: the name's bytes as stored (wheels use UTF-8), not a CP437 guess converted to UTF-8.
    if (zip_stat_index(z, (zip_uint64_t)i, ZIP_FL_ENC_RAW, &st) != 0)
      a->fail("cannot read central directory entry " + std::to_string(i) + ": " + zip_strerror(z));
    const zip_uint64_t need = ZIP_STAT_NAME | ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE | ZIP_STAT_CRC |
                              ZIP_STAT_COMP_METHOD | ZIP_STAT_ENCRYPTION_METHOD;
    if ((st.valid & need) != need) a->fail("incomplete central directory entry " + std::to_string(i));
    Entry e;
    e.name = st.name;
    e.index = st.index;
    e.method = st.comp_method;
    e.encrypted = st.encryption_method != ZIP_EM_NONE;
    e.crc32 = st.crc;
    e.compressed_size = st.comp_size;
    e.uncompressed_size = st.size;
    if (!a->by_name_.emplace(e.name, a->entries_.size()).second) a->fail("duplicate zip entry '" + e.name + "'");
    a->entries_.push_back(std::move(e));
  }
  return a;
}

Archive::~Archive() = default;

const Entry* Archive::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

const Entry& Archive::at(const std::string& name) const {
  const Entry* e = find(name);
  if (!e) fail("has no member '" + name + "'");
  return *e;
}

void Archive::extract(const Entry& e, const Sink& sink) const {
  const std::string what = "zip entry '" + e.name + "'";
  if (e.encrypted) fail(what + " is encrypted");
  if (!zip_compression_method_supported((zip_int32_t)e.method, 0))
    fail(what + " uses unsupported compression method " + std::to_string(e.method));
  std::unique_ptr<zip_file_t, int (*)(zip_file_t*)> f(zip_fopen_index(lz_->z, e.index, 0), &zip_fclose);
  if (!f) fail(what + ": " + member_problem(zip_get_error(lz_->z)));

  std::vector<uint8_t> buf(kChunk);
  uint64_t produced = 0;
  for (;;) {
    // libzip checks the CRC-32 (and the size) when it reaches the member's end: the last read fails.
    const zip_int64_t n = zip_fread(f.get(), buf.data(), buf.size());
    if (n < 0) fail(what + ": " + member_problem(zip_file_get_error(f.get())));
    if (n == 0) break;
    produced += (uint64_t)n;
    if (produced > e.uncompressed_size) fail(what + ": more data than its recorded size");
    sink(buf.data(), (size_t)n);
  }
  if (produced != e.uncompressed_size)
    fail(what + ": got " + std::to_string(produced) + " bytes, expected " + std::to_string(e.uncompressed_size));
}

std::string Archive::read_all(const Entry& e) const {
  std::string s;
  extract(e, [&](const uint8_t* p, size_t n) { s.append(reinterpret_cast<const char*>(p), n); });
  return s;
}

}  // namespace kvzap::zip
