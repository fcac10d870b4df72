#include "format/hf_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/json_file.h"
#include "kvzap/error.h"

namespace kvzap::hf {
namespace fs = std::filesystem;
namespace {

std::string shape_string(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// fields[key], or nullptr when absent or null (null counts as absent).
const nlohmann::json* present(const nlohmann::json& fields, const std::string& key) {
  auto it = fields.find(key);
  return it == fields.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace

bool is_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / "config.json", ec);
}

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir) {
  std::unique_ptr<Checkpoint> c(new Checkpoint());
  c->dir_ = dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error(dir + ": not a folder");
  c->config_path_ = (fs::path(dir) / "config.json").string();
  c->config_ = read_json_file(c->config_path_);
  if (!c->config_.is_object()) c->config_error("not a JSON object");

  const fs::path single = fs::path(dir) / "model.safetensors", index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    const nlohmann::json j = read_json_file(index.string());
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(index.string() + ": missing object 'weight_map'");
    std::map<std::string, const SafetensorsFile*> by_name;  // shard file name -> mapped file
    for (const auto& [name, shard] : j["weight_map"].items()) {
      if (!shard.is_string()) throw Error(index.string() + ": weight_map['" + name + "'] is not a file name");
      const std::string s = shard.get<std::string>();
      if (s.empty() || s.find('/') != std::string::npos || s == "." || s == "..")
        throw Error(index.string() + ": weight_map['" + name + "'] = '" + s + "' is not a file in the folder");
      auto it = by_name.find(s);
      if (it == by_name.end()) {
        c->files_.push_back(SafetensorsFile::open((fs::path(dir) / s).string()));  // "<shard>: no such file"
        it = by_name.emplace(s, c->files_.back().get()).first;
      }
      const SafetensorsFile::Tensor* t = it->second->find(name);
      if (!t) throw Error(it->second->path() + ": missing tensor '" + name + "' (listed in model.safetensors.index.json)");
      c->entries_[name] = Entry{it->second, t};
    }
    if (c->files_.empty()) throw Error(index.string() + ": weight_map is empty");
  } else if (fs::exists(single, ec)) {
    c->files_.push_back(SafetensorsFile::open(single.string()));
    for (const SafetensorsFile::Tensor& t : c->files_.back()->tensors()) c->entries_[t.name] = Entry{c->files_.back().get(), &t};
  } else {
    throw Error(dir + ": no model.safetensors or model.safetensors.index.json");
  }
  for (const auto& f : c->files_) c->weights_bytes_ += (uint64_t)fs::file_size(f->path(), ec);
  return c;
}

void Checkpoint::config_error(const std::string& problem) const { throw Error(config_path_ + ": " + problem); }

void Checkpoint::descend(const std::string& key) {
  auto it = fields_->find(key);
  if (it == fields_->end() || !it->is_object()) config_error("missing object '" + field_prefix_ + key + "'");
  fields_ = &*it;
  field_prefix_ += key + ".";
}

std::optional<int64_t> Checkpoint::get_int_opt(const std::string& key) const {
  const nlohmann::json* it = present(*fields_, key);
  if (!it) return std::nullopt;
  if (!it->is_number_integer()) config_error("field '" + field_prefix_ + key + "' must be an integer");
  return it->get<int64_t>();
}

int64_t Checkpoint::get_int(const std::string& key) const {
  if (auto v = get_int_opt(key)) return *v;
  config_error("missing field '" + field_prefix_ + key + "'");
}

std::optional<double> Checkpoint::get_float_opt(const std::string& key) const {
  const nlohmann::json* it = present(*fields_, key);
  if (!it) return std::nullopt;
  if (!it->is_number()) config_error("field '" + field_prefix_ + key + "' must be a number");
  return it->get<double>();
}

double Checkpoint::get_float(const std::string& key) const {
  if (auto v = get_float_opt(key)) return *v;
  config_error("missing field '" + field_prefix_ + key + "'");
}

std::optional<std::string> Checkpoint::get_string_opt(const std::string& key) const {
  const nlohmann::json* it = present(*fields_, key);
  if (!it) return std::nullopt;
  if (!it->is_string()) config_error("field '" + field_prefix_ + key + "' must be a string");
  return it->get<std::string>();
}

std::optional<bool> Checkpoint::get_bool_opt(const std::string& key) const {
  const nlohmann::json* it = present(*fields_, key);
  if (!it) return std::nullopt;
  if (!it->is_boolean()) config_error("field '" + field_prefix_ + key + "' must be true or false");
  return it->get<bool>();
}

const Checkpoint::Entry* Checkpoint::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

const Checkpoint::Entry& Checkpoint::tensor(const std::string& name, const std::vector<int64_t>& shape) const {
  const Entry* e = find(name);
  if (!e) throw Error((files_.size() == 1 ? files_[0]->path() : dir_) + ": missing tensor '" + name + "'");
  if (e->tensor->shape != shape)
    throw Error(e->file->path() + ": tensor '" + name + "' has shape " + shape_string(e->tensor->shape) + ", expected " +
                shape_string(shape));
  return *e;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

}  // namespace kvzap::hf
