// `kvzap inspect PATH [--json]`: prints a GGUF file's metadata (arrays abbreviated) and tensor table, or a
// Hugging Face checkpoint folder's config.json, tokenizer and tensor table (shard by shard).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/chat_template.h"
#include "cli/command.h"
#include "format/gguf.h"
#include "format/hf_checkpoint.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_json.h"

namespace kvzap::cli {
namespace {

using gguf::Value;

std::string shape_string(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

std::string type_string(const Value& v) {
  if (v.type == gguf::kArray) return std::string("array[") + gguf::value_type_name(v.array_type) + "]";
  return gguf::value_type_name(v.type);
}

// Keeps one metadata line readable: long strings (chat templates) are cut.
std::string clip(const std::string& s, size_t max_chars) {
  if (s.size() <= max_chars) return s;
  return s.substr(0, max_chars) + "... (" + std::to_string(s.size()) + " chars)";
}

nlohmann::json value_json(const Value& v, size_t max_items) {
  switch (v.type) {
    case gguf::kString: return std::get<std::string>(v.v);
    case gguf::kBool: return std::get<bool>(v.v);
    case gguf::kF32: case gguf::kF64: return std::get<double>(v.v);
    case gguf::kArray: {
      const auto& arr = *std::get<std::shared_ptr<gguf::Array>>(v.v);
      nlohmann::json items = nlohmann::json::array();
      for (size_t i = 0; i < arr.size() && i < max_items; ++i) items.push_back(value_json(arr[i], max_items));
      return items;
    }
    default: return std::get<int64_t>(v.v);
  }
}

// What `generate --chat` renders for a file without tokenizer.chat_template: "" when the file has one,
// else a sentence naming the built-in fallback (or saying there is none).
std::string chat_template_note(const gguf::File& f) {
  if (f.has("tokenizer.chat_template") || !f.has("tokenizer.ggml.tokens")) return "";
  TokenizerVocab v;
  try {
    v.tokens = f.get_string_array("tokenizer.ggml.tokens");
    const ChatFormat fmt = detect_chat_format(v);
    std::string s = std::string("none in the file; kvzap falls back to its built-in '") + chat_format_name(fmt) + "' format";
    if (fmt == ChatFormat::Gemma) s += " (<start_of_turn>user\\n...<end_of_turn>\\n<start_of_turn>model\\n)";
    return s;
  } catch (const Error&) {
    return "none in the file, and no built-in format matches its tokens (--chat needs a template)";
  }
}

struct Totals {
  size_t n_tensors = 0;
  int64_t n_elements = 0;
  size_t n_bytes = 0;
  void add(int64_t elements, size_t bytes) { n_tensors++, n_elements += elements, n_bytes += bytes; }
};

// {"n_tensors", "n_elements", "n_bytes", "by_type": {type: the same}}
nlohmann::json totals_json(const std::map<std::string, Totals>& by_type, const Totals& all) {
  auto one = [](const Totals& t) {
    return nlohmann::json{{"n_tensors", t.n_tensors}, {"n_elements", t.n_elements}, {"n_bytes", t.n_bytes}};
  };
  nlohmann::json out = one(all), types = nlohmann::json::object();
  for (const auto& [name, tot] : by_type) types[name] = one(tot);
  out["by_type"] = std::move(types);
  return out;
}

void print_totals(const std::map<std::string, Totals>& by_type, const Totals& all) {
  std::printf("\ntotals:\n");
  for (const auto& [name, tot] : by_type)
    std::printf("  %-5s %5zu tensors %14lld elements %14zu bytes\n", name.c_str(), tot.n_tensors,
                (long long)tot.n_elements, tot.n_bytes);
  std::printf("  all   %5zu tensors %14lld elements %14zu bytes (%.2f MiB)\n", all.n_tensors,
              (long long)all.n_elements, all.n_bytes, all.n_bytes / (1024.0 * 1024.0));
}

// A Hugging Face folder: config.json as stored, the tokenizer kvzap reads from it, every tensor with its
// dtype, shape and shard. The tokenizer's problems are reported, not thrown: inspecting is how one finds
// out why a folder does not load.
int run_inspect_hf(const std::string& dir, bool json, size_t max_items) {
  const auto ck = hf::Checkpoint::open(dir);
  nlohmann::json tok;
  try {
    const auto t = tokenizer_from_hf_dir(dir);
    const TokenizerVocab& v = t->vocab();
    tok = {{"kind", v.kind == TokenizerKind::SentencePiece ? "SentencePiece-style BPE (byte fallback)" : "byte-level BPE"},
           {"n_vocab", t->n_vocab()}, {"n_merges", v.merges.size()}, {"bos_id", v.bos_id}, {"eos_id", v.eos_id},
           {"add_bos", v.add_bos}};
    if (!v.chat_template.empty()) {
      tok["chat_template"] = clip(v.chat_template, json ? v.chat_template.size() : 160);
    } else {
      const ChatFormat fmt = detect_chat_format(v);
      tok["chat_template_note"] = std::string("none in the folder; kvzap falls back to its built-in '") +
                                  chat_format_name(fmt) + "' format";
    }
  } catch (const Error& e) {
    tok = {{"error", e.what()}};
  }
  struct Row {
    std::string name, dtype, shard;
    std::vector<int64_t> shape;
    size_t n_bytes;
  };
  std::vector<Row> rows;
  std::map<std::string, Totals> by_type;
  Totals all;
  for (const std::string& name : ck->tensor_names()) {
    const hf::Checkpoint::Entry* e = ck->find(name);
    rows.push_back({name, e->tensor->dtype, std::filesystem::path(e->file->path()).filename().string(),
                    e->tensor->shape, e->tensor->n_bytes});
    for (Totals* tot : {&all, &by_type[e->tensor->dtype]}) tot->add(e->tensor->n_elements(), e->tensor->n_bytes);
  }
  if (json) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const Row& r : rows)
      tensors.push_back({{"name", r.name}, {"dtype", r.dtype}, {"shape", r.shape}, {"n_bytes", r.n_bytes}, {"shard", r.shard}});
    nlohmann::json out = {{"path", dir}, {"format", "huggingface"}, {"config", ck->config()}, {"tokenizer", tok},
                          {"weights_bytes", ck->weights_bytes()}, {"tensors", std::move(tensors)},
                          {"totals", totals_json(by_type, all)}};
    std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("%s: Hugging Face checkpoint, %llu bytes of safetensors\n", dir.c_str(),
              (unsigned long long)ck->weights_bytes());
  std::printf("\nconfig.json (%zu keys):\n", ck->config().size());
  size_t key_w = 0;
  for (const auto& [key, v] : ck->config().items()) key_w = std::max(key_w, key.size());
  for (const auto& [key, v] : ck->config().items()) {
    std::string shown;
    if (v.is_array() && v.size() > max_items) {
      nlohmann::json head(v.begin(), v.begin() + (std::ptrdiff_t)max_items);
      shown = head.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      shown = shown.substr(0, shown.size() - 1) + ", ... (" + std::to_string(v.size()) + " items)]";
    } else {
      shown = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
    std::printf("  %-*s  %s\n", (int)key_w, key.c_str(), clip(shown, 160).c_str());
  }
  std::printf("\ntokenizer:\n");
  for (const auto& [key, v] : tok.items())
    std::printf("  %-18s %s\n", key.c_str(), v.is_string() ? v.get<std::string>().c_str() : v.dump().c_str());
  std::printf("\ntensors (%zu):\n", rows.size());
  size_t name_w = 4;
  for (const Row& r : rows) name_w = std::max(name_w, r.name.size());
  std::printf("  %-*s  %-5s %-20s %12s  %s\n", (int)name_w, "name", "dtype", "shape", "bytes", "shard");
  for (const Row& r : rows)
    std::printf("  %-*s  %-5s %-20s %12zu  %s\n", (int)name_w, r.name.c_str(), r.dtype.c_str(),
                shape_string(r.shape).c_str(), r.n_bytes, r.shard.c_str());
  print_totals(by_type, all);
  return 0;
}

int run_inspect(const std::string& path, bool json, size_t max_items) {
  if (hf::is_checkpoint_dir(path)) return run_inspect_hf(path, json, max_items);
  const auto f = gguf::File::open(path);
  Totals all;
  std::map<std::string, Totals> by_type;
  for (const auto& t : f->tensors()) {
    for (Totals* tot : {&all, &by_type[type_name(t.type)]}) tot->add(t.n_elements(), t.n_bytes);
  }

  if (json) {
    nlohmann::json out;
    out["path"] = f->path();
    out["version"] = f->version();
    out["alignment"] = f->alignment();
    out["file_size"] = f->file_size();
    nlohmann::json meta = nlohmann::json::array();
    for (const auto& [key, v] : f->metadata()) {
      nlohmann::json e = {{"key", key}, {"type", type_string(v)}, {"value", value_json(v, max_items)}};
      if (v.type == gguf::kArray) e["length"] = std::get<std::shared_ptr<gguf::Array>>(v.v)->size();
      meta.push_back(std::move(e));
    }
    out["metadata"] = std::move(meta);
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& t : f->tensors())
      tensors.push_back({{"name", t.name}, {"type", type_name(t.type)}, {"ne", t.ne}, {"n_bytes", t.n_bytes},
                         {"offset", t.offset}});
    out["tensors"] = std::move(tensors);
    if (const std::string note = chat_template_note(*f); !note.empty()) out["chat_template_note"] = note;
    out["totals"] = totals_json(by_type, all);
    // Metadata strings are not guaranteed to be valid UTF-8: replace bad bytes rather than fail.
    std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }

  std::printf("%s: GGUF v%u, %zu bytes, alignment %zu\n", f->path().c_str(), f->version(), f->file_size(),
              f->alignment());
  std::printf("\nmetadata (%zu keys):\n", f->metadata().size());
  size_t key_w = 0;
  for (const auto& kv : f->metadata()) key_w = std::max(key_w, kv.first.size());
  for (const auto& [key, v] : f->metadata()) {
    std::string shown = clip(f->value_to_string(v, max_items), 160);
    std::printf("  %-*s  %-13s %s\n", (int)key_w, key.c_str(), type_string(v).c_str(), shown.c_str());
  }
  if (const std::string note = chat_template_note(*f); !note.empty()) std::printf("\nchat template: %s\n", note.c_str());
  std::printf("\ntensors (%zu):\n", f->tensors().size());
  size_t name_w = 4;
  for (const auto& t : f->tensors()) name_w = std::max(name_w, t.name.size());
  std::printf("  %-*s  %-5s %-20s %12s %12s\n", (int)name_w, "name", "type", "ne", "bytes", "offset");
  for (const auto& t : f->tensors())
    std::printf("  %-*s  %-5s %-20s %12zu %12llu\n", (int)name_w, t.name.c_str(), type_name(t.type),
                shape_string(t.ne).c_str(), t.n_bytes, (unsigned long long)t.offset);
  print_totals(by_type, all);
  return 0;
}

RegisterCommand reg("inspect", "Show a GGUF file's (or Hugging Face folder's) metadata and tensor table", [](CLI::App& sub) {
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto max_items = std::make_shared<size_t>(8);
  sub.add_option("file", *path, "GGUF file, or Hugging Face checkpoint folder, to inspect")->required();
  sub.add_flag("--json", *json, "Print machine-readable JSON instead of tables");
  sub.add_option("--max-items", *max_items, "Array items shown per metadata (config.json) key")->capture_default_str();
  return [=]() -> int { return run_inspect(*path, *json, *max_items); };
});

}  // namespace
}  // namespace kvzap::cli
