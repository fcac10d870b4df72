// A Hugging Face checkpoint folder: config.json plus the weights in model.safetensors, or in shards
// listed by model.safetensors.index.json ("weight_map": tensor name -> shard file). Every shard is
// mapped read-only (zero-copy views, safetensors.h). Every problem throws kvzap::Error naming the file:
// "<dir>/config.json: missing field 'hidden_size'", "<dir>/model-00002-of-00002.safetensors: no such
// file", "<shard>: tensor 'x' has shape [a, b], expected [c, d]".
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "format/safetensors.h"

namespace kvzap::hf {

// True when `path` is a folder holding a config.json (what `-m DIR` accepts).
bool is_checkpoint_dir(const std::string& path);

class Checkpoint {
 public:
  // Reads config.json and maps every shard; checks that each weight_map entry is in its shard.
  static std::unique_ptr<Checkpoint> open(const std::string& dir);
  Checkpoint(const Checkpoint&) = delete;  // fields_ points into config_
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::string& dir() const { return dir_; }
  const std::string& config_path() const { return config_path_; }
  const nlohmann::json& config() const { return config_; }

  // The object the field getters read: config.json itself, or after descend(key) one of its sub-objects
  // (a multimodal model's "text_config"); errors then name the field as "key.field".
  const nlohmann::json& fields() const { return *fields_; }
  void descend(const std::string& key);

  // Fields of fields(); a missing required field or a value of the wrong type is one line naming the file.
  int64_t get_int(const std::string& key) const;
  std::optional<int64_t> get_int_opt(const std::string& key) const;
  double get_float(const std::string& key) const;
  std::optional<double> get_float_opt(const std::string& key) const;  // null counts as absent
  std::optional<std::string> get_string_opt(const std::string& key) const;
  std::optional<bool> get_bool_opt(const std::string& key) const;
  [[noreturn]] void config_error(const std::string& problem) const;

  struct Entry {
    const SafetensorsFile* file;
    const SafetensorsFile::Tensor* tensor;
  };
  const Entry* find(const std::string& name) const;
  // The tensor `name` with exactly this shape (outermost first), else "<shard>: ..." / "<dir>: missing tensor".
  const Entry& tensor(const std::string& name, const std::vector<int64_t>& shape) const;
  std::vector<std::string> tensor_names() const;  // sorted

  const std::string& first_shard() const { return files_.front()->path(); }
  uint64_t weights_bytes() const { return weights_bytes_; }  // sum of the shard file sizes

 private:
  Checkpoint() = default;
  std::string dir_, config_path_;
  nlohmann::json config_;
  const nlohmann::json* fields_ = &config_;
  std::string field_prefix_;  // "" or "text_config."
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry> entries_;
  uint64_t weights_bytes_ = 0;
};

}  // namespace kvzap::hf
