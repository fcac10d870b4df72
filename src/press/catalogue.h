// What `kvzap presses`, the C API's kvzap_presses and the Python package list: every registered press,
// the name families built around any press, and the kvpress presses kvzap lacks. One builder, so the
// front ends cannot drift apart.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvzap {

// A family of press names built from other presses (adakv_<press>, dms_<press>, ...): not registry entries
// of their own, so listed apart.
struct PressFamily {
  std::string pattern;        // "adakv_<press>"
  std::string kvpress_class;  // "AdaKVPress"
  std::string example;        // a name of the family that runs: "adakv_snapkv"
  std::string description;
  std::string kvpress_parity;
};
std::vector<PressFamily> press_families();

// The Python package's class for a registered press: kvpress's class name where kvpress has the press,
// else a CamelCase name of its own. kvzap-linear / kvzap-mlp share KVzapPress(model_type=...).
std::string press_python_class(const std::string& name);
// Whether press_python_class(name) is kvpress's own class (false for compositions kvpress builds from
// wrappers, such as chunk_snapkv = ChunkPress(SnapKVPress())).
bool press_is_kvpress_class(const std::string& name);

// {"presses": [{"name", "description", "policies", "supports_threshold", "own_budget", "kvpress_ratio_scope",
//   "kvpress_parity", "python_class", "kvpress_class", "params", "demo_params"}, ...] sorted by name,
//  "families": [{"pattern", "kvpress_class", "example", "description", "kvpress_parity"}, ...],
//  "kvpress_gaps": [{"kvpress_class", "name", "reason"}, ...]}
nlohmann::json press_catalogue_json();

}  // namespace kvzap
