// `kvzap tokenize -m MODEL (--text-file F | -p TEXT) [--json] [--bos] [--no-special]`: the token ids
// of a text, as a JSON array or one "id<TAB>'piece'" line per token. Loads only the vocabulary.
// `--jsonl F`: many texts at once (one JSON string per line), one JSON array of ids per line out.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/command.h"
#include "fetch/model_store.h"
#include "format/gguf.h"
#include "format/hf_checkpoint.h"
#include "kvzap/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/unicode_text.h"

namespace kvzap::cli {
namespace {

struct TokenizeArgs {
  std::string model, text, text_file, jsonl;
  bool json = false, bos = false, no_special = false;
};

std::string read_file_bytes(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw Error(path + ": is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error(path + ": read error");
  return ss.str();
}

// A piece made printable on one line: valid UTF-8 as is, control bytes and stray bytes escaped.
std::string printable_piece(const std::string& bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    const unsigned char c = (unsigned char)bytes[i];
    const size_t len = tok::utf8_sequence_length(bytes, i);
    if (len > 1) {
      out.append(bytes, i, len);
      i += len;
      continue;
    }
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\\': out += "\\\\"; break;
      case '\'': out += "\\'"; break;
      default:
        if (len == 1 && c >= 0x20 && c != 0x7F) {
          out += (char)c;
        } else {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", c);
          out += buf;
        }
    }
    ++i;
  }
  return out;
}

int run_tokenize(const TokenizeArgs& a) {
  const std::string text = a.text_file.empty() ? a.text : read_file_bytes(a.text_file);
  const std::string path = resolve_model(a.model);
  const auto tok = hf::is_checkpoint_dir(path) ? tokenizer_from_hf_dir(path) : Tokenizer::from_gguf(*gguf::File::open(path));
  if (a.bos && tok->vocab().bos_id < 0) throw Error(path + ": the model has no BOS token (--bos)");
  if (!a.jsonl.empty()) {
    std::istringstream lines(read_file_bytes(a.jsonl));
    std::string line;
    for (int n = 1; std::getline(lines, line); n++) {
      if (line.empty()) continue;
      nlohmann::json s;
      try {
        s = nlohmann::json::parse(line);
      } catch (const std::exception&) {
        throw Error(a.jsonl + ": line " + std::to_string(n) + " is not JSON");
      }
      if (!s.is_string()) throw Error(a.jsonl + ": line " + std::to_string(n) + " is not a JSON string");
      std::printf("%s\n", nlohmann::json(tok->encode(s.get<std::string>(), a.bos, !a.no_special)).dump().c_str());
    }
    return 0;
  }
  const std::vector<int32_t> ids = tok->encode(text, a.bos, !a.no_special);
  if (a.json) {
    std::printf("%s\n", nlohmann::json(ids).dump().c_str());
    return 0;
  }
  for (int32_t id : ids) std::printf("%d\t'%s'\n", id, printable_piece(tok->token_bytes(id)).c_str());
  return 0;
}

const RegisterCommand kRegister{
    "tokenize", "Print the token ids of a text (JSON array with --json)", [](CLI::App& sub) {
      auto a = std::make_shared<TokenizeArgs>();
      sub.add_option("-m,--model", a->model, "GGUF model file or Hugging Face checkpoint folder (default: the downloaded default model)");
      auto* p = sub.add_option("-p,--prompt", a->text, "Text to tokenize");
      auto* f = sub.add_option("--text-file,-f", a->text_file, "Read the text from this file (raw bytes)");
      auto* j = sub.add_option("--jsonl", a->jsonl, "Tokenize every line of this file (each a JSON string); one JSON array per line");
      p->excludes(f);
      f->excludes(p);
      j->excludes(p);
      j->excludes(f);
      sub.add_flag("--json", a->json, "Print a JSON array of ids");
      sub.add_flag("--bos", a->bos, "Prepend the BOS token");
      sub.add_flag("--no-special", a->no_special, "Treat control-token text (e.g. <|im_start|>) as plain text");
      return [a, p, f, j] {
        if (p->count() == 0 && f->count() == 0 && j->count() == 0)
          throw Error("tokenize: give the text with -p TEXT, --text-file F or --jsonl F");
        return run_tokenize(*a);
      };
    }};

}  // namespace
}  // namespace kvzap::cli
