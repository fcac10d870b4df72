// API keys: `Authorization: Bearer KEY` or `X-Api-Key: KEY`, compared in constant time (both sides are
// hashed first, so neither the length nor the first differing byte of a key shows in the timing).
#pragma once
#include <string>
#include <vector>

namespace kvzap::server {

class ApiKeys {
 public:
  ApiKeys() = default;
  explicit ApiKeys(const std::vector<std::string>& keys);
  // Keys from a file, one per line (blank lines and lines starting with '#' skipped).
  static std::vector<std::string> read_file(const std::string& path);
  bool enabled() const { return !digests_.empty(); }
  // Index of the matching key (the tenant, for isolating cached prefixes), or -1. Every key is compared.
  int match(const std::string& presented) const;
  // The key from the request's headers ("" when none).
  static std::string from_headers(const std::string& authorization, const std::string& x_api_key);

 private:
  std::vector<std::string> digests_;  // SHA-256 of each key, raw 32 bytes
};

}  // namespace kvzap::server
