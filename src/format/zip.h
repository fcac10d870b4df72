// Zip reader on libzip (Debian libzip-dev): the central directory (ZIP64 included) and streamed
// extraction of a member, whose size and CRC-32 are checked. Enough to unpack a Python wheel; encrypted
// members are refused. Every problem throws kvzap::Error("<path>: <problem>").
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvzap/error.h"

namespace kvzap::zip {

struct Entry {
  std::string name;
  uint64_t index = 0;    // libzip's index of the member
  uint16_t method = 0;   // 0 = stored, 8 = deflated (others as libzip supports them)
  bool encrypted = false;
  uint32_t crc32 = 0;
  uint64_t compressed_size = 0;
  uint64_t uncompressed_size = 0;
};

class Archive {
 public:
  static std::unique_ptr<Archive> open(const std::string& path);
  ~Archive();
  Archive(const Archive&) = delete;
  Archive& operator=(const Archive&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<Entry>& entries() const { return entries_; }
  const Entry* find(const std::string& name) const;  // nullptr when absent
  const Entry& at(const std::string& name) const;    // throws "<path>: has no member '<name>'"

  // Streams the member's uncompressed bytes to `sink` in chunks (never the whole member in memory),
  // then checks its size and CRC-32. An exception from `sink` stops the extraction and propagates.
  using Sink = std::function<void(const uint8_t* data, size_t n)>;
  void extract(const Entry& e, const Sink& sink) const;
  std::string read_all(const Entry& e) const;  // small members only

 private:
  Archive() = default;
  [[noreturn]] void fail(const std::string& problem) const;

  std::string path_;
  struct Libzip;  // owns libzip's zip_t (zip.cpp); a libzip handle is not safe to share between threads
  std::unique_ptr<Libzip> lz_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> by_name_;
};

}  // namespace kvzap::zip
