// Reading typed, range-checked fields out of JSON objects (request bodies, press specs): one set of
// helpers whose errors (kvzap::Error) name the field and what it must be. The server turns them into 400s.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace kvzap::json_fields {

// "a boolean", "an integer", ...: how an error names what it got.
const char* type_name(const nlohmann::json& v);
[[noreturn]] void wrong_type(const std::string& field, const char* expected, const nlohmann::json& v);
bool get_bool(const nlohmann::json& v, const std::string& field);
std::string get_string(const nlohmann::json& v, const std::string& field);
// A finite number within [lo, hi].
double get_number(const nlohmann::json& v, const std::string& field, double lo, double hi);
// An integer within [lo, hi] (floats such as 10.0 are refused: the field is a count).
int64_t get_integer(const nlohmann::json& v, const std::string& field, int64_t lo, int64_t hi);

}  // namespace kvzap::json_fields
