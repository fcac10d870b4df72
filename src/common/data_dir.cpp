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
  // Beside the binary (the Python package's layout), then the install prefix's share/kvzap
  // (`cmake --install`: PREFIX/bin/kvzap and PREFIX/lib/libkvzap.so both find PREFIX/share/kvzap).
  static const std::string beside = [] {
    const std::string b = binary_dir();
    if (b.empty()) return std::string();
    std::error_code ec;
    for (const std::filesystem::path& dir : {std::filesystem::path(b) / "data", std::filesystem::path(b).parent_path() / "share" / "kvzap"})
      if (std::filesystem::is_directory(dir / "surrogates", ec)) return dir.string();
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
