// Minimal zip reader: the central directory (ZIP64 included) plus streamed extraction of stored or
// deflated members with CRC-32 and size checks. Enough to unpack a Python wheel; no encryption, no
// multi-disk archives. Every problem throws kvzap::Error("<path>: <problem>").
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvzap/error.h"

namespace kvzap::zip {

struct Entry {
  std::string name;
  uint16_t method = 0;  // 0 = stored, 8 = deflated
  uint16_t flags = 0;
  uint32_t crc32 = 0;
  uint64_t compressed_size = 0;
  uint64_t uncompressed_size = 0;
  uint64_t local_header_offset = 0;
};

class Archive {
 public:
  static std::unique_ptr<Archive> open(const std::string& path);
  ~Archive();
  Archive(const Archive&) = delete;
  Archive& operator=(const Archive&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<Entry>& entries() const { return entries_; }
  const Entry* find(const std::string& name) const;

  // Streams the member's uncompressed bytes to `sink` in chunks, then checks size and CRC-32.
  using Sink = std::function<void(const uint8_t* data, size_t n)>;
  void extract(const Entry& e, const Sink& sink) const;
  std::string read_all(const Entry& e) const;  // small members only

 private:
  Archive() = default;
  void read_at(uint64_t offset, void* dst, size_t n, const char* what) const;
  [[noreturn]] void fail(const std::string& problem) const;
  void parse_central_directory();

  std::string path_;
  FILE* file_ = nullptr;
  uint64_t size_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace kvzap::zip
