#include "common/data_dir.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

namespace kvzap {
namespace {

std::mutex g_mu;
std::string g_dir;  // set_data_dir

// The folder of the binary (executable or shared library) this function was linked into.
std::string binary_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&binary_dir), &info) == 0 || !info.dli_fname) return "";
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::canonical(info.dli_fname, ec);
  return ec ? "" : p.parent_path().string();
}

}  // namespace

std::string data_dir() {
  if (const char* env = std::getenv("KVZAP_DATA_DIR"); env && *env) return env;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_dir.empty()) return g_dir;
  }
  static const std::string beside = [] {
    const std::string b = binary_dir();
    std::error_code ec;
    if (!b.empty() && std::filesystem::is_directory(std::filesystem::path(b) / "data" / "surrogates", ec))
      return (std::filesystem::path(b) / "data").string();
    return std::string();
  }();
  if (!beside.empty()) return beside;
#ifdef KVZAP_SOURCE_DIR
  return std::string(KVZAP_SOURCE_DIR) + "/data";
#else
  return "data";
#endif
}

void set_data_dir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_dir = dir;
}

}  // namespace kvzap
