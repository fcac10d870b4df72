// Zip reader. Layout facts (APPNOTE.TXT): the End Of Central Directory record (EOCD, 22 bytes + comment)
// sits at the end; it points to the central directory, whose entries point to local headers, each
// followed by the member's data. ZIP64 moves sizes/offsets that overflow 32 bits into extra fields.
#include "format/zip.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

namespace kvzap::zip {
namespace {

constexpr uint32_t kEocdSig = 0x06054b50;
constexpr uint32_t kZip64EocdSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kLocalSig = 0x04034b50;
constexpr size_t kEocdSize = 22;
constexpr size_t kMaxComment = 0xffff;
constexpr size_t kCentralSize = 46;
constexpr size_t kLocalSize = 30;
constexpr size_t kChunk = 1 << 18;

uint16_t le16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }
uint32_t le32(const uint8_t* p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24); }
uint64_t le64(const uint8_t* p) { return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32); }

}  // namespace

void Archive::fail(const std::string& problem) const { throw Error(path_ + ": " + problem); }

void Archive::read_at(uint64_t offset, void* dst, size_t n, const char* what) const {
  if (offset > size_ || n > size_ - offset) fail(std::string("truncated zip: ") + what + " lies past the end of the file");
  if (fseeko(file_, (off_t)offset, SEEK_SET) != 0 || std::fread(dst, 1, n, file_) != n)
    fail(std::string("read error at ") + what);
}

std::unique_ptr<Archive> Archive::open(const std::string& path) {
  std::unique_ptr<Archive> a(new Archive());
  a->path_ = path;
  a->file_ = std::fopen(path.c_str(), "rb");
  if (!a->file_) {
    const int e = errno;
    if (e == ENOENT) a->fail("no such file");
    a->fail(std::string("cannot open: ") + std::strerror(e));
  }
  if (fseeko(a->file_, 0, SEEK_END) != 0) a->fail("cannot seek");
  const off_t end = ftello(a->file_);
  if (end < 0) a->fail("cannot determine the file size");
  a->size_ = (uint64_t)end;
  a->parse_central_directory();
  return a;
}

Archive::~Archive() {
  if (file_) std::fclose(file_);
}

void Archive::parse_central_directory() {
  if (size_ < kEocdSize) fail("not a zip file (too small)");
  // The EOCD is the last signature match whose comment length reaches exactly to the end of the file.
  const size_t tail_len = (size_t)std::min<uint64_t>(size_, kEocdSize + kMaxComment);
  std::vector<uint8_t> tail(tail_len);
  const uint64_t tail_start = size_ - tail_len;
  read_at(tail_start, tail.data(), tail_len, "end of central directory");
  int64_t eocd = -1;
  for (int64_t i = (int64_t)tail_len - (int64_t)kEocdSize; i >= 0; --i) {
    if (le32(&tail[i]) == kEocdSig && (size_t)i + kEocdSize + le16(&tail[i + 20]) == tail_len) {
      eocd = i;
      break;
    }
  }
  if (eocd < 0) fail("not a zip file (no end of central directory record)");
  const uint8_t* e = &tail[eocd];
  if (le16(e + 4) != 0 || le16(e + 6) != 0) fail("multi-disk zip archives are not supported");
  uint64_t n_entries = le16(e + 10);
  uint64_t cd_size = le32(e + 12);
  uint64_t cd_offset = le32(e + 16);

  const uint64_t eocd_pos = tail_start + (uint64_t)eocd;
  if (n_entries == 0xffff || cd_size == 0xffffffffu || cd_offset == 0xffffffffu) {
    // ZIP64: a 20-byte locator right before the EOCD points to the 56-byte ZIP64 EOCD record.
    if (eocd_pos < 20) fail("ZIP64 locator missing");
    uint8_t loc[20];
    read_at(eocd_pos - 20, loc, sizeof loc, "ZIP64 locator");
    if (le32(loc) != kZip64LocatorSig) fail("ZIP64 locator missing");
    uint8_t rec[56];
    read_at(le64(loc + 8), rec, sizeof rec, "ZIP64 end of central directory");
    if (le32(rec) != kZip64EocdSig) fail("bad ZIP64 end of central directory signature");
    n_entries = le64(rec + 32);
    cd_size = le64(rec + 40);
    cd_offset = le64(rec + 48);
  }
  if (cd_offset > size_ || cd_size > size_ - cd_offset) fail("central directory lies outside the file");
  if (n_entries > cd_size / kCentralSize) fail("central directory entry count does not fit its size");

  std::vector<uint8_t> cd((size_t)cd_size);
  read_at(cd_offset, cd.data(), cd.size(), "central directory");
  std::map<std::string, size_t> seen;
  size_t pos = 0;
  for (uint64_t i = 0; i < n_entries; ++i) {
    if (cd.size() - pos < kCentralSize) fail("central directory truncated");
    const uint8_t* c = &cd[pos];
    if (le32(c) != kCentralSig) fail("bad central directory entry signature");
    Entry ent;
    ent.flags = le16(c + 8);
    ent.method = le16(c + 10);
    ent.crc32 = le32(c + 16);
    ent.compressed_size = le32(c + 20);
    ent.uncompressed_size = le32(c + 24);
    const size_t name_len = le16(c + 28), extra_len = le16(c + 30), comment_len = le16(c + 32);
    ent.local_header_offset = le32(c + 42);
    if (cd.size() - pos - kCentralSize < name_len + extra_len + comment_len) fail("central directory truncated");
    ent.name.assign(reinterpret_cast<const char*>(c + kCentralSize), name_len);
    // ZIP64 extra field (id 1): only the fields whose 32-bit slot is saturated are present, in order.
    const uint8_t* x = c + kCentralSize + name_len;
    for (size_t xp = 0; xp + 4 <= extra_len;) {
      const uint16_t id = le16(x + xp), len = le16(x + xp + 2);
      if (xp + 4 + len > extra_len) fail("bad extra field in entry '" + ent.name + "'");
      if (id == 1) {
        const uint8_t* f = x + xp + 4;
        size_t left = len;
        auto take = [&](uint64_t& field) {
          if (field != 0xffffffffu) return;
          if (left < 8) fail("bad ZIP64 extra field in entry '" + ent.name + "'");
          field = le64(f);
          f += 8;
          left -= 8;
        };
        take(ent.uncompressed_size);
        take(ent.compressed_size);
        take(ent.local_header_offset);
      }
      xp += 4 + len;
    }
    if (!seen.emplace(ent.name, entries_.size()).second) fail("duplicate zip entry '" + ent.name + "'");
    entries_.push_back(std::move(ent));
    pos += kCentralSize + name_len + extra_len + comment_len;
  }
}

const Entry* Archive::find(const std::string& name) const {
  for (const Entry& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

void Archive::extract(const Entry& e, const Sink& sink) const {
  const std::string what = "zip entry '" + e.name + "'";
  if (e.flags & 1) fail(what + " is encrypted");
  if (e.method != 0 && e.method != 8) fail(what + " uses unsupported compression method " + std::to_string(e.method));
  uint8_t lh[kLocalSize];
  read_at(e.local_header_offset, lh, sizeof lh, "local header");
  if (le32(lh) != kLocalSig) fail(what + ": bad local header signature");
  const uint64_t data_start = e.local_header_offset + kLocalSize + le16(lh + 26) + le16(lh + 28);
  if (data_start > size_ || e.compressed_size > size_ - data_start) fail(what + ": data lies past the end of the file");
  if (e.method == 0 && e.compressed_size != e.uncompressed_size) fail(what + ": stored sizes disagree");

  std::vector<uint8_t> in(kChunk), out(kChunk);
  uint32_t crc = (uint32_t)::crc32(0L, Z_NULL, 0);
  uint64_t produced = 0;
  auto emit = [&](const uint8_t* p, size_t n) {
    if (n == 0) return;
    produced += n;
    if (produced > e.uncompressed_size) fail(what + ": more data than its recorded size");
    crc = (uint32_t)::crc32(crc, p, (uInt)n);
    sink(p, n);
  };

  if (fseeko(file_, (off_t)data_start, SEEK_SET) != 0) fail("cannot seek to " + what);
  uint64_t left = e.compressed_size;
  if (e.method == 0) {
    while (left > 0) {
      const size_t n = (size_t)std::min<uint64_t>(left, in.size());
      if (std::fread(in.data(), 1, n, file_) != n) fail("read error in " + what);
      left -= n;
      emit(in.data(), n);
    }
  } else {
    z_stream zs{};
    if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) fail("zlib: cannot initialise inflate");
    struct Guard {
      z_stream* z;
      ~Guard() { inflateEnd(z); }
    } guard{&zs};
    int rc = Z_OK;
    while (rc != Z_STREAM_END) {
      if (zs.avail_in == 0) {
        if (left == 0) fail(what + ": deflate stream is truncated");
        const size_t n = (size_t)std::min<uint64_t>(left, in.size());
        if (std::fread(in.data(), 1, n, file_) != n) fail("read error in " + what);
        left -= n;
        zs.next_in = in.data();
        zs.avail_in = (uInt)n;
      }
      zs.next_out = out.data();
      zs.avail_out = (uInt)out.size();
      rc = inflate(&zs, Z_NO_FLUSH);
      if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
        fail(what + ": corrupt deflate data (" + (zs.msg ? zs.msg : "zlib error " + std::to_string(rc)) + ")");
      if (rc == Z_BUF_ERROR && zs.avail_in != 0) fail(what + ": corrupt deflate data");
      emit(out.data(), out.size() - zs.avail_out);
    }
  }
  if (produced != e.uncompressed_size)
    fail(what + ": got " + std::to_string(produced) + " bytes, expected " + std::to_string(e.uncompressed_size));
  if (crc != e.crc32) fail(what + ": CRC-32 mismatch");
}

std::string Archive::read_all(const Entry& e) const {
  std::string s;
  extract(e, [&](const uint8_t* p, size_t n) { s.append(reinterpret_cast<const char*>(p), n); });
  return s;
}

}  // namespace kvzap::zip
