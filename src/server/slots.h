// Slot files per API key: each key gets its own folder under --slot-save-path, named by a hash of the key
// (the key itself is never written), so a key cannot list, restore or overwrite another key's files;
// and a count and a byte quota per folder. Without API keys the server has one tenant: the folder itself.
#pragma once
#include <cstdint>
#include <string>

namespace kvzap::server {

struct SlotQuota {
  int64_t max_files = 64;           // slot files per key
  int64_t max_bytes = 1ll << 30;    // bytes of slot files per key
};

// "<root>/key-<16 hex digits of SHA-256(key)>", or root when key is empty (API keys off).
std::string slot_folder(const std::string& root, const std::string& key);

// Usage of a folder's slot files (regular files not starting with '.'), leaving `except` out.
struct SlotUsage {
  int64_t files = 0, bytes = 0;
};
SlotUsage slot_usage(const std::string& folder, const std::string& except = "");

// Throws ApiError 403 when `new_bytes` more in a file named `name` (replacing one of that name, if
// any) would go past the quota.
void check_slot_quota(const std::string& folder, const std::string& name, int64_t new_bytes, const SlotQuota& q);

}  // namespace kvzap::server
