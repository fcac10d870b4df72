// Shared helpers for the libFuzzer harnesses (fuzz/fuzz_*.cpp, built with -DKVZAP_FUZZ=ON, run by
// scripts/fuzz.sh). The readers under test take paths, so each input is written to a scratch folder
// on tmpfs first (/dev/shm, else $TMPDIR), one folder per process, removed at exit.
//
// Contract checked by every harness: a reader either succeeds or throws kvzap::Error (the server's
// parsers: ApiError). Any other exception escapes and aborts (libFuzzer reports it as a crash), as do
// ASan/UBSan findings, allocations over -malloc_limit_mb and inputs slower than -timeout.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

namespace kvzap::fuzz {

inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path base = std::filesystem::exists("/dev/shm") ? std::filesystem::path("/dev/shm")
                                                                     : std::filesystem::temp_directory_path();
    std::filesystem::path d = base / ("kvzap_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return dir;
}

// Writes bytes to <scratch>/<name> (replacing it) and returns the path.
inline std::string write_file(const std::string& name, const uint8_t* data, size_t size) {
  const std::filesystem::path p = scratch_dir() / name;
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), (std::streamsize)size);
  return p.string();
}
inline std::string write_file(const std::string& name, std::string_view s) {
  return write_file(name, reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

inline std::string fuzz_read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Splits an input into parts at a separator line, for harnesses that need several files or fields.
// "a\n--8<--\nb" -> {"a", "b"}.
inline std::string_view next_part(std::string_view& rest) {
  static constexpr std::string_view kSep = "\n--8<--\n";
  const size_t at = rest.find(kSep);
  std::string_view part = rest.substr(0, at);
  rest = at == std::string_view::npos ? std::string_view() : rest.substr(at + kSep.size());
  return part;
}

}  // namespace kvzap::fuzz
