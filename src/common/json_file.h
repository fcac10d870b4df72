// Reading a whole JSON file with errors that name it (configs, tokenizer files, sweep summaries).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace kvzap {

// The parsed file; kvzap::Error "<path>: no such file" / "<path>: cannot open" / "<path>: not valid
// JSON (...)".
nlohmann::json read_json_file(const std::string& path);

}  // namespace kvzap
