// SHA-256 (OpenSSL EVP underneath): incremental hashing for streamed downloads, plus one-shot helpers.
#pragma once
#include <cstddef>
#include <string>

namespace kvzap {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(const void* data, size_t n);
  // Finishes the hash and returns 64 lowercase hex digits; the object cannot be updated afterwards.
  std::string hex_digest();

 private:
  void* ctx_;  // EVP_MD_CTX*
  bool done_ = false;
};

std::string sha256_hex(const void* data, size_t n);
// Hashes a whole file; throws kvzap::Error("<path>: ...") when it cannot be read.
std::string sha256_file_hex(const std::string& path);

}  // namespace kvzap
