#include "server/slots.h"

#include <filesystem>

#include "common/sha256.h"
#include "server/api_error.h"

namespace kvzap::server {

namespace fs = std::filesystem;

std::string slot_folder(const std::string& root, const std::string& key) {
  if (key.empty()) return root;
  return (fs::path(root) / ("key-" + sha256_hex(key.data(), key.size()).substr(0, 16))).string();
}

SlotUsage slot_usage(const std::string& folder, const std::string& except) {
  SlotUsage u;
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name[0] == '.' || name == except) continue;
    std::error_code e2;
    if (!it->is_regular_file(e2)) continue;
    const auto size = it->file_size(e2);
    if (e2) continue;
    u.files++;
    u.bytes += (int64_t)size;
  }
  return u;
}

void check_slot_quota(const std::string& folder, const std::string& name, int64_t new_bytes, const SlotQuota& q) {
  const SlotUsage u = slot_usage(folder, name);
  if (u.files + 1 > q.max_files)
    throw ApiError(403, "quota_exceeded_error",
                   "slot quota: this key already has " + std::to_string(u.files) + " slot files (limit " +
                       std::to_string(q.max_files) + "); overwrite one or ask for --slot-max-files");
  if (u.bytes + new_bytes > q.max_bytes)
    throw ApiError(403, "quota_exceeded_error",
                   "slot quota: " + std::to_string(new_bytes) + " more bytes would bring this key's slot files to " +
                       std::to_string(u.bytes + new_bytes) + " bytes (limit " + std::to_string(q.max_bytes) + ")");
}

}  // namespace kvzap::server
