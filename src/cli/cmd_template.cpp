// `kvzap template [-m M | --template FILE] --messages F.json [--add-generation-prompt] [--var K=JSON]`:
// prints the prompt the model's own chat template renders for a conversation, exactly (no newline
// added). Only the file's metadata is read: any GGUF model with a template works, whatever its
// tokenizer. tests/python/check_chat_templates.py compares it with Python jinja2.
//
// --messages: a JSON array of messages, or an object {"messages": [...], <other variables>} (tools,
// enable_thinking, date_string, add_generation_prompt, ...). --template: a .jinja text file or a
// tokenizer_config.json (its chat_template; bos_token and eos_token too) instead of the model's.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat/chat_prompt.h"
#include "cli/command.h"
#include "fetch/model_store.h"
#include "format/gguf.h"
#include "format/hf_checkpoint.h"
#include "kvzap/error.h"
#include "tokenizer/tokenizer_json.h"

namespace kvzap::cli {
namespace {

using ojson = nlohmann::ordered_json;

struct TemplateArgs {
  std::string model, template_file, messages_file, bos, eos;
  std::vector<std::string> vars;
  bool add_generation_prompt = false, builtin_ok = true;
  CLI::Option* bos_opt = nullptr;
  CLI::Option* eos_opt = nullptr;
  CLI::Option* agp_opt = nullptr;
};

std::string read_bytes(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw Error(path + ": is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ojson parse_json(const std::string& text, const std::string& what) {
  try {
    return ojson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(what + ": not valid JSON (" + std::string(e.what()) + ")");
  }
}

// A special token in tokenizer_config.json: "text" or {"content": "text", ...}.
std::string config_token(const ojson& cfg, const char* key) {
  if (!cfg.contains(key)) return "";
  const ojson& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

struct Source {
  std::string tmpl, bos, eos;
  bool builtin = false;
  ChatFormat fmt = ChatFormat::ChatML;
};

Source from_template_file(const std::string& path) {
  Source s;
  const std::string text = read_bytes(path);
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    const ojson cfg = parse_json(text, path);
    if (!cfg.is_object() || !cfg.contains("chat_template")) throw Error(path + ": no chat_template in this file");
    const ojson& ct = cfg["chat_template"];
    if (ct.is_string()) {
      s.tmpl = ct.get<std::string>();
    } else if (ct.is_array()) {  // named templates: the "default" one
      for (const ojson& e : ct)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template")) s.tmpl = e["template"].get<std::string>();
      if (s.tmpl.empty()) throw Error(path + ": chat_template has no \"default\" entry");
    } else {
      throw Error(path + ": chat_template is neither a string nor a list");
    }
    s.bos = config_token(cfg, "bos_token");
    s.eos = config_token(cfg, "eos_token");
  } else {
    s.tmpl = text;
  }
  return s;
}

Source from_model(const std::string& path) {
  Source s;
  if (hf::is_checkpoint_dir(path)) {  // tokenizer.json + tokenizer_config.json
    const auto tok = tokenizer_from_hf_dir(path);
    const TokenizerVocab& v = tok->vocab();
    s.bos = v.bos_id >= 0 ? v.tokens[(size_t)v.bos_id] : "";
    s.eos = v.eos_id >= 0 ? v.tokens[(size_t)v.eos_id] : "";
    s.tmpl = v.chat_template;
    if (s.tmpl.empty()) {
      s.fmt = detect_chat_format(v);
      s.builtin = true;
    }
    return s;
  }
  const auto f = gguf::File::open(path);
  const std::vector<std::string> tokens =
      f->has("tokenizer.ggml.tokens") ? f->get_string_array("tokenizer.ggml.tokens") : std::vector<std::string>{};
  auto token = [&](const char* key) -> std::string {
    const auto id = f->get_int_opt(key);
    return id && *id >= 0 && *id < (int64_t)tokens.size() ? tokens[(size_t)*id] : std::string();
  };
  s.bos = token("tokenizer.ggml.bos_token_id");
  s.eos = token("tokenizer.ggml.eos_token_id");
  s.tmpl = f->get_string_opt("tokenizer.chat_template").value_or("");
  if (s.tmpl.empty()) {
    TokenizerVocab v;
    v.tokens = tokens;
    s.fmt = detect_chat_format(v);  // throws when nothing matches
    s.builtin = true;
  }
  return s;
}

int run_template(const TemplateArgs& a) {
  Source src = !a.template_file.empty() ? from_template_file(a.template_file) : from_model(resolve_model(a.model));
  if (a.bos_opt->count()) src.bos = a.bos;
  if (a.eos_opt->count()) src.eos = a.eos;

  ojson input = parse_json(read_bytes(a.messages_file), a.messages_file);
  ojson messages;
  TemplateOptions opt;
  if (input.is_array()) {
    messages = input;
  } else if (input.is_object() && input.contains("messages")) {
    messages = input["messages"];
    for (auto it = input.begin(); it != input.end(); ++it)
      if (it.key() != "messages") opt.vars[it.key()] = it.value();
  } else {
    throw Error(a.messages_file + ": expected a JSON array of messages or an object with \"messages\"");
  }
  if (!messages.is_array()) throw Error(a.messages_file + ": \"messages\" must be an array");
  for (const std::string& kv : a.vars) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) throw Error("--var expects NAME=JSON, got '" + kv + "'");
    const std::string name = kv.substr(0, eq), value = kv.substr(eq + 1);
    try {
      opt.vars[name] = ojson::parse(value);
    } catch (const nlohmann::json::exception&) {
      opt.vars[name] = value;  // not JSON: a plain string
    }
  }
  // --add-generation-prompt wins; else the messages file may set it; else off (transformers' default).
  opt.add_generation_prompt = a.add_generation_prompt;
  if (!a.agp_opt->count() && opt.vars.contains("add_generation_prompt")) {
    opt.add_generation_prompt = opt.vars["add_generation_prompt"].is_boolean() && opt.vars["add_generation_prompt"].get<bool>();
    opt.vars.erase("add_generation_prompt");
  }
  opt.bos_token = src.bos;
  opt.eos_token = src.eos;

  std::string out;
  if (src.builtin) {
    std::vector<ChatMessage> msgs;
    for (const ojson& m : messages) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") || !m["content"].is_string())
        throw Error("the built-in chat formats take messages with a string role and content only");
      msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    ChatOptions co;
    co.add_generation_prompt = opt.add_generation_prompt;
    if (opt.vars.contains("enable_thinking")) co.enable_thinking = opt.vars["enable_thinking"].get<bool>();
    if (opt.vars.contains("date_string")) co.date = opt.vars["date_string"].get<std::string>();
    std::fprintf(stderr, "kvzap: the file has no chat template: built-in format used\n");
    out = apply_chat_template(src.fmt, msgs, co);
  } else {
    out = render_chat_template(src.tmpl, messages, opt);
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  return 0;
}

const RegisterCommand kRegister{
    "template", "print the prompt the model's chat template renders for a conversation", [](CLI::App& sub) {
      auto a = std::make_shared<TemplateArgs>();
      auto* m = sub.add_option("-m,--model", a->model, "GGUF model file whose tokenizer.chat_template is used (default: the pulled model)");
      auto* t = sub.add_option("--template", a->template_file, "a .jinja file or a tokenizer_config.json instead of the model's template");
      m->excludes(t);
      t->excludes(m);
      sub.add_option("--messages", a->messages_file, "JSON file: an array of messages, or {\"messages\": [...], other variables}")
          ->required();
      a->agp_opt = sub.add_flag("--add-generation-prompt", a->add_generation_prompt, "end with the assistant header");
      a->bos_opt = sub.add_option("--bos-token", a->bos, "bos_token text (default: the model's or the config's)");
      a->eos_opt = sub.add_option("--eos-token", a->eos, "eos_token text (default: the model's or the config's)");
      sub.add_option("--var", a->vars, "extra template variable NAME=JSON (e.g. enable_thinking=false), repeatable");
      return [a]() { return run_template(*a); };
    }};

}  // namespace
}  // namespace kvzap::cli
