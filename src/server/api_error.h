// Errors a request can cause, in OpenAI's shape: {"error": {"message", "type", "code"}}.
// Handlers throw ApiError; the HTTP layer turns it into the status and the JSON body. Anything else that
// escapes a handler becomes a 500 with the same shape, so the server never dies on a request.
#pragma once
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace kvzap::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, const std::string& message, nlohmann::json extra = nullptr)
      : std::runtime_error(message), status_(status), type_(std::move(type)), extra_(std::move(extra)) {}
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  // {"error": {"message", "type", "code", ...extra}}; code is the HTTP status, as llama.cpp's server does.
  nlohmann::json body() const {
    nlohmann::json e = {{"message", what()}, {"type", type_}, {"code", status_}};
    if (extra_.is_object())
      for (auto& [k, v] : extra_.items()) e[k] = v;
    return {{"error", e}};
  }

 private:
  int status_;
  std::string type_;
  nlohmann::json extra_;
};

inline ApiError invalid_request(const std::string& message) { return ApiError(400, "invalid_request_error", message); }
inline ApiError not_supported(const std::string& message) { return ApiError(400, "not_supported_error", message); }
inline ApiError unavailable(const std::string& message) { return ApiError(503, "unavailable_error", message); }

// JSON text that never throws on odd bytes (invalid UTF-8 in generated text becomes U+FFFD).
inline std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kvzap::server
