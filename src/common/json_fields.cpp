#include "common/json_fields.h"

#include <cmath>

#include "kvzap/error.h"

namespace kvzap::json_fields {

using nlohmann::json;

const char* type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number_float()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

[[noreturn]] void wrong_type(const std::string& field, const char* expected, const json& v) {
  throw Error("'" + field + "' must be " + expected + ", got " + type_name(v));
}

bool get_bool(const json& v, const std::string& field) {
  if (!v.is_boolean()) wrong_type(field, "a boolean", v);
  return v.get<bool>();
}

std::string get_string(const json& v, const std::string& field) {
  if (!v.is_string()) wrong_type(field, "a string", v);
  return v.get<std::string>();
}

double get_number(const json& v, const std::string& field, double lo, double hi) {
  if (!v.is_number()) wrong_type(field, "a number", v);
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    throw Error("'" + field + "' must be between " + json(lo).dump() + " and " + json(hi).dump() +
                          ", got " + v.dump());
  return x;
}

int64_t get_integer(const json& v, const std::string& field, int64_t lo, int64_t hi) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();  // JSON's non-negative integers land here: lo still applies
    if (u > (uint64_t)hi) throw Error("'" + field + "' must be at most " + std::to_string(hi) + ", got " + v.dump());
    if (lo > 0 && u < (uint64_t)lo)
      throw Error("'" + field + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                            ", got " + v.dump());
    return (int64_t)u;
  }
  if (!v.is_number_integer()) wrong_type(field, "an integer", v);
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    throw Error("'" + field + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                          ", got " + v.dump());
  return x;
}

}  // namespace kvzap::json_fields
