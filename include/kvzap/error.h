// kvzap — the one exception type. Every user-facing failure (bad file, bad input, bad option) throws
// kvzap::Error with a one-line message; the CLI prints "kvzap: error: <message>" and exits non-zero.
#pragma once
#include <stdexcept>
#include <string>

namespace kvzap {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

}  // namespace kvzap
