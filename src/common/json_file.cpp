#include "common/json_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "kvzap/error.h"

namespace kvzap {

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    throw Error(path + (std::filesystem::exists(path, ec) ? ": cannot open" : ": no such file"));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
}

}  // namespace kvzap
