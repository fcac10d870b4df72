#include "server/auth.h"

#include <fstream>

#include "common/sha256.h"
#include "kvzap/error.h"

namespace kvzap::server {
namespace {

std::string digest(const std::string& s) { return sha256_hex(s.data(), s.size()); }

// Equal-length strings compared without an early exit.
bool equal_constant_time(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;  // digests: always the same size
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); i++) diff |= (unsigned char)(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

ApiKeys::ApiKeys(const std::vector<std::string>& keys) {
  for (const auto& k : keys)
    if (!k.empty()) digests_.push_back(digest(k));
}

std::vector<std::string> ApiKeys::read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open the API key file");
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    size_t b = line.find_first_not_of(" \t");
    if (b == std::string::npos || line[b] == '#') continue;
    keys.push_back(line.substr(b));
  }
  if (keys.empty()) throw Error(path + ": the API key file holds no key");
  return keys;
}

int ApiKeys::match(const std::string& presented) const {
  if (presented.empty()) return -1;
  const std::string d = digest(presented);
  int found = -1;
  for (size_t i = 0; i < digests_.size(); i++)
    if (equal_constant_time(d, digests_[i]) && found < 0) found = (int)i;
  return found;
}

std::string ApiKeys::from_headers(const std::string& authorization, const std::string& x_api_key) {
  const std::string bearer = "Bearer ";
  if (authorization.size() > bearer.size() && authorization.compare(0, bearer.size(), bearer) == 0)
    return authorization.substr(bearer.size());
  return x_api_key;
}

}  // namespace kvzap::server
