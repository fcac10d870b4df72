#include "tokenizer/tokenizer_json.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/json_file.h"
#include "kvzap/error.h"

namespace kvzap {
namespace fs = std::filesystem;
namespace {

using nlohmann::json;

// The split regexes of the byte-level families, as their tokenizer.json files spell them.
constexpr const char* kLlama3Regex =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kQwen2Regex =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kGpt2Regex = R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)re";

constexpr int32_t kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6;

std::optional<json> read_json_opt(const fs::path& p) {
  std::error_code ec;
  if (!fs::exists(p, ec)) return std::nullopt;
  return read_json_file(p.string());
}

// A type-tagged component ({"type": ...}) as its type name, "null" for none.
std::string type_of(const json& j) {
  if (j.is_null()) return "null";
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return "?";
  return j["type"].get<std::string>();
}

// Flattens a Sequence component (key: "normalizers" / "pretokenizers" / "processors").
std::vector<json> flatten(const json& j, const char* list_key) {
  if (j.is_null()) return {};
  if (type_of(j) == "Sequence" && j.contains(list_key) && j[list_key].is_array()) {
    std::vector<json> out;
    for (const json& x : j[list_key]) {
      std::vector<json> sub = flatten(x, list_key);
      out.insert(out.end(), sub.begin(), sub.end());
    }
    return out;
  }
  return {j};
}

// tokenizer_config.json names tokens as a string or as an AddedToken object {"content": ...}.
std::optional<std::string> token_name(const json& cfg, const char* key) {
  if (!cfg.is_object() || !cfg.contains(key)) return std::nullopt;
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_from_hf_dir(const std::string& dir, int32_t n_vocab) {
  const fs::path tj_path = fs::path(dir) / "tokenizer.json";
  const std::string where = tj_path.string();
  auto fail = [&](const std::string& problem) -> Error { return Error(where + ": " + problem); };
  const std::optional<json> tj_opt = read_json_opt(tj_path);
  if (!tj_opt) throw fail("no such file (a Hugging Face checkpoint needs its tokenizer.json)");
  const json& tj = *tj_opt;
  const json cfg = read_json_opt(fs::path(dir) / "tokenizer_config.json").value_or(json::object());
  if (!tj.is_object() || !tj.contains("model") || !tj["model"].is_object()) throw fail("missing object 'model'");
  const json& model = tj["model"];
  if (type_of(model) != "BPE") throw fail("tokenizer model '" + type_of(model) + "' is not supported (BPE only)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"})
    if (model.contains(key) && !model[key].is_null())
      throw fail(std::string("BPE option '") + key + "' is not supported");

  TokenizerVocab v;
  const bool byte_fallback = model.value("byte_fallback", false);
  v.kind = byte_fallback ? TokenizerKind::SentencePiece : TokenizerKind::ByteLevelBpe;
  v.ignore_merges = model.value("ignore_merges", false);

  // Vocabulary: model.vocab, then added_tokens (which may extend it); gaps are unused placeholders.
  if (!model.contains("vocab") || !model["vocab"].is_object()) throw fail("missing object 'model.vocab'");
  auto put = [&](int64_t id, const std::string& text, int32_t type) {
    if (id < 0 || id >= (1 << 24)) throw fail("token id " + std::to_string(id) + " is out of range");
    if ((size_t)id >= v.tokens.size()) {
      v.tokens.resize((size_t)id + 1);
      v.token_types.resize((size_t)id + 1, 0);
    }
    v.tokens[(size_t)id] = text;
    v.token_types[(size_t)id] = type;
  };
  for (const auto& [text, id] : model["vocab"].items()) {
    if (!id.is_number_integer()) throw fail("model.vocab['" + text + "'] is not an integer id");
    int32_t type = 1;
    unsigned b = 0;
    if (byte_fallback && text.size() == 6 && std::sscanf(text.c_str(), "<0x%2X>", &b) == 1) type = kByte;
    put(id.get<int64_t>(), text, type);
  }
  if (tj.contains("added_tokens") && tj["added_tokens"].is_array())
    for (const json& t : tj["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
          !t["content"].is_string())
        throw fail("an added_tokens entry has no integer 'id' and string 'content'");
      put(t["id"].get<int64_t>(), t["content"].get<std::string>(), t.value("special", false) ? kControl : kUserDefined);
    }
  for (size_t id = 0; id < v.tokens.size(); id++)
    if (v.token_types[id] == 0) {
      v.tokens[id] = "[PAD" + std::to_string(id) + "]";
      v.token_types[id] = kUnused;
    }
  if (n_vocab > 0) {
    if ((int32_t)v.tokens.size() > n_vocab)
      throw fail("has " + std::to_string(v.tokens.size()) + " tokens but the model's vocab_size is " + std::to_string(n_vocab));
    for (int32_t id = (int32_t)v.tokens.size(); id < n_vocab; id++) {
      v.tokens.push_back("[PAD" + std::to_string(id) + "]");
      v.token_types.push_back(kUnused);
    }
  }

  if (!model.contains("merges") || !model["merges"].is_array()) throw fail("missing array 'model.merges'");
  for (const json& m : model["merges"]) {
    if (m.is_string()) v.merges.push_back(m.get<std::string>());
    else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
      v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    else throw fail("a model.merges entry is neither \"a b\" nor [\"a\", \"b\"]");
  }
  if (byte_fallback && v.merges.empty()) throw fail("a byte-fallback BPE model without merges is not supported");

  // Normalizer and pre-tokenizer: only the combinations the supported families use.
  const std::vector<json> norms = flatten(tj.value("normalizer", json()), "normalizers");
  const std::vector<json> pres = flatten(tj.value("pre_tokenizer", json()), "pretokenizers");
  auto describe = [](const std::vector<json>& parts) {
    std::string s;
    for (const json& p : parts) s += (s.empty() ? "" : " + ") + type_of(p);
    return s.empty() ? std::string("none") : s;
  };
  if (byte_fallback) {
    const bool replace_space = norms.size() == 1 && type_of(norms[0]) == "Replace" &&
                               norms[0].value("content", std::string()) == "\xE2\x96\x81" &&
                               norms[0].contains("pattern") && norms[0]["pattern"].value("String", std::string("?")) == " ";
    if (!replace_space)
      throw fail("normalizer '" + describe(norms) + "' is not supported for byte-fallback BPE (Replace(' ', '\xE2\x96\x81') only)");
    // Gemma's Split on " " sees no space after the normalizer: it never splits.
    const bool split_space = pres.size() == 1 && type_of(pres[0]) == "Split" && pres[0].contains("pattern") &&
                             pres[0]["pattern"].value("String", std::string("?")) == " ";
    if (!pres.empty() && !split_space)
      throw fail("pre-tokenizer '" + describe(pres) + "' is not supported for byte-fallback BPE");
    v.add_space_prefix = false;
  } else {
    bool nfc = false;
    for (const json& n : norms) {
      if (type_of(n) == "NFC") nfc = true;
      else throw fail("normalizer '" + describe(norms) + "' is not supported for byte-level BPE (NFC or none)");
    }
    v.nfc = nfc;
    auto byte_level = [](const json& p, bool regex) {
      return type_of(p) == "ByteLevel" && !p.value("add_prefix_space", false) && p.value("use_regex", true) == regex;
    };
    auto split_on = [](const json& p, const char* regex) {
      return type_of(p) == "Split" && p.contains("pattern") && p["pattern"].is_object() &&
             p["pattern"].value("Regex", std::string()) == regex && p.value("behavior", std::string()) == "Isolated" &&
             !p.value("invert", false);
    };
    if (pres.size() == 1 && byte_level(pres[0], true)) v.pre = PreTokenizer::Gpt2;
    else if (pres.size() == 2 && split_on(pres[0], kLlama3Regex) && byte_level(pres[1], false)) v.pre = PreTokenizer::Llama3;
    else if (pres.size() == 2 && split_on(pres[0], kQwen2Regex) && byte_level(pres[1], false)) v.pre = PreTokenizer::Qwen2;
    else if (pres.size() == 2 && split_on(pres[0], kGpt2Regex) && byte_level(pres[1], false)) v.pre = PreTokenizer::Gpt2;
    else if (pres.size() == 2 && type_of(pres[0]) == "Digits" && pres[0].value("individual_digits", false) &&
             byte_level(pres[1], true))
      v.pre = PreTokenizer::Smollm;
    else
      throw fail("pre-tokenizer '" + describe(pres) +
                 "' is not supported (ByteLevel; Split on the Llama 3, Qwen2 or GPT-2 regex + ByteLevel; "
                 "Digits + ByteLevel)");
  }

  auto id_of = [&](const std::string& text) -> int32_t {
    for (size_t i = 0; i < v.tokens.size(); i++)
      if (v.tokens[i] == text && v.token_types[i] != kUnused) return (int32_t)i;
    return -1;
  };
  // BOS/EOS: the post-processor's template is what HF adds; tokenizer_config names the tokens.
  bool template_seen = false;
  for (const json& p : flatten(tj.value("post_processor", json()), "processors")) {
    const std::string t = type_of(p);
    if (t == "ByteLevel") continue;
    if (t != "TemplateProcessing" || !p.contains("single") || !p["single"].is_array())
      throw fail("post-processor '" + t + "' is not supported");
    template_seen = true;
    bool seen_a = false;
    for (const json& item : p["single"]) {
      if (item.contains("Sequence")) {
        seen_a = true;
        continue;
      }
      if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id")) throw fail("odd post-processor template item");
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      const int32_t id = id_of(name);
      if (id < 0) throw fail("post-processor token '" + name + "' is not in the vocabulary");
      if (!seen_a && !v.add_bos) v.add_bos = true, v.bos_id = id;
      else if (seen_a && byte_fallback && !v.add_eos) v.add_eos = true, v.eos_id = id;
      else throw fail("post-processor template '" + name + "' placement is not supported");
    }
  }
  if (!template_seen) v.add_bos = cfg.value("add_bos_token", false), v.add_eos = cfg.value("add_eos_token", false);
  if (v.add_eos && !byte_fallback) throw fail("adding EOS is not supported for byte-level BPE");
  auto named = [&](const char* key, int32_t& slot) {
    if (auto name = token_name(cfg, key)) {
      const int32_t id = id_of(*name);
      if (id < 0) throw Error((fs::path(dir) / "tokenizer_config.json").string() + ": " + key + " '" + *name +
                              "' is not in the vocabulary");
      if (slot < 0) slot = id;
    }
  };
  named("bos_token", v.bos_id);
  named("eos_token", v.eos_id);
  named("unk_token", v.unk_id);
  named("pad_token", v.pad_id);
  if (v.unk_id < 0 && model.contains("unk_token") && model["unk_token"].is_string())
    v.unk_id = id_of(model["unk_token"].get<std::string>());
  if (v.add_bos && v.bos_id < 0) throw fail("adds a BOS token but none is named");

  // Chat template: tokenizer_config's chat_template (a string, or named templates: "default"), else
  // chat_template.jinja (what transformers 5 writes).
  if (cfg.contains("chat_template")) {
    const json& ct = cfg["chat_template"];
    if (ct.is_string()) v.chat_template = ct.get<std::string>();
    else if (ct.is_array())
      for (const json& t : ct)
        if (t.is_object() && t.value("name", std::string()) == "default") v.chat_template = t.value("template", std::string());
  }
  if (v.chat_template.empty()) {
    std::ifstream in(fs::path(dir) / "chat_template.jinja", std::ios::binary);
    if (in) {
      std::ostringstream ss;
      ss << in.rdbuf();
      v.chat_template = ss.str();
    }
  }
  try {
    return std::make_unique<Tokenizer>(std::move(v));
  } catch (const Error& e) {
    throw fail(e.what());
  }
}

}  // namespace kvzap
