#include "cli/cli_common.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "fetch/model_store.h"
#include "tokenizer/tokenizer.h"

namespace kvzap::cli {

void ModelArgs::add_to(CLI::App& sub) {
  sub.add_option("-m,--model", model,
                 "GGUF model file, or a Hugging Face checkpoint folder (config.json, safetensors, tokenizer.json; "
                 "default: the pulled SmolLM2-135M-Instruct)");
  sub.add_option("-t,--threads", threads, "worker threads (default: physical cores)")->check(CLI::Range(0, 1024));
  sub.add_option("-c,--ctx", ctx, "context size in tokens (default: the model's, at most 8192)")->check(CLI::Range((int64_t)0, (int64_t)1 << 22));
  sub.add_option("--quantize", quantize, "Hugging Face checkpoints: quantise the weight matrices at load")
      ->check(CLI::IsMember({"q8_0", "q4_k"}));
  sub.add_option("-b,--batch", batch, "tokens per forward step (default: a whole prompt)")->check(CLI::Range((int64_t)0, (int64_t)1 << 22));
  sub.add_option("--kv-type", kv_type,
                 "KV cache element type: f16 (default), f32 (exact keys and values, no f16 rounding in attention; "
                 "twice the KV bytes per token, so a KV budget holds half as many tokens), q8_0 or q4_0 (each "
                 "token's keys and values quantised in ggml's 32-element blocks: ~1.9x / ~3.4x the tokens of f16 "
                 "per byte; head size a multiple of 32)")
      ->check(CLI::IsMember({"f16", "f32", "q8_0", "q4_0"}));
}

std::unique_ptr<Model> ModelArgs::load_model() const { return Model::load(resolve_model(model), load_options()); }

LoadOptions ModelArgs::load_options() const {
  LoadOptions o;
  if (quantize == "q8_0") o.quantize = GgmlType::Q8_0;
  else if (quantize == "q4_k") o.quantize = GgmlType::Q4_K;
  return o;
}

SessionOptions ModelArgs::session_options() const {
  SessionOptions o;
  o.n_threads = threads;
  o.n_ctx = ctx;
  o.n_batch = batch;
  o.kv_type = cache_type();
  return o;
}

void PressArgs::add_to(CLI::App& sub, bool with_surrogate) {
  flags.ratio_scope = "global";
  sub.add_option("--press", flags.name, "KV-cache press (see `kvzap presses`)");
  threshold_opt = sub.add_option("--threshold", flags.threshold, "evict pairs scoring below T (per-token presses)");
  ratio_opt = sub.add_option("--ratio", flags.ratio, "evict this fraction of the context's KV pairs")->check(CLI::Range(0.0, 1.0));
  sub.add_option("--ratio-scope", flags.ratio_scope,
                 "ratio budget: global (across layers and heads), layer, head, or adakv (per layer with a 20 % per-head safeguard)")
      ->check(CLI::IsMember({"global", "layer", "head", "adakv"}));
  sub.add_option("--window", flags.window, "threshold presses never judge the most recent W tokens")->check(CLI::Range(0, 1 << 20));
  sub.add_option("--sink-tokens", flags.sink_tokens,
                 "threshold presses never evict the first N positions (attention sinks; default 0, as kvpress)")
      ->check(CLI::Range(0, 1 << 20));
  sub.add_option("--prefill-evict-every", flags.prefill_evict_every,
                 "threshold presses judge a context every N positions while prefilling it, freeing memory as the prompt "
                 "goes in (later context tokens attend to the pruned cache); 0 = once the context is complete, as kvpress")
      ->check(CLI::Range(0, 1 << 20));
  sub.add_flag("--decode-press", flags.decoding, "keep pruning question and generated tokens (threshold presses)");
  sub.add_flag("--press-sliding-layers", flags.sliding_layers,
               "also prune sliding-window layers (by default presses prune only global-attention layers)");
  if (with_surrogate) sub.add_option("--surrogate", flags.surrogate_dir,
                                     "KVzap surrogate folder (kvpress format); qfilter / expected_attention_stats: "
                                     "their query statistics file (kvzap query-stats; default beside the model)");
  sub.add_option("--press-seed", flags.seed, "seed of the random press");
  sub.add_option("--press-param", params,
                 "a parameter of the press under kvpress's name, NAME=VALUE (repeatable; `kvzap presses` lists each "
                 "press's, e.g. snapkv window_size=32)");
  sub.add_option("--press-ratios", ratios,
                 "a list of ratios, ',' or ':' separated: one per layer for per_layer_<press> (kvpress "
                 "PerLayerCompressionPress), e.g. --press per_layer_knorm --press-ratios 0:0.25:0.5:0.75");
}

std::unique_ptr<Press> PressArgs::make(const Model& model) const {
  if (flags.name.empty()) {
    if (given_threshold() || given_ratio() || flags.decoding || !flags.surrogate_dir.empty() || !params.empty() ||
        !ratios.empty())
      throw Error("--threshold/--ratio/--decode-press/--surrogate/--press-param/--press-ratios need --press NAME");
    return nullptr;
  }
  return make_press(spec(), model);
}

PressSpec PressArgs::spec() const {
  PressSpec o = flags;
  o.has_threshold = given_threshold();
  o.has_ratio = given_ratio();
  if (!ratios.empty()) o.ratios = parse_ratio_list(ratios, "--press-ratios");
  if (params.empty()) return o;
  PressSpecPatch patch;
  for (const std::string& a : params) {
    const size_t eq = a.find('=');
    char* end = nullptr;
    double v = eq == std::string::npos ? 0 : std::strtod(a.c_str() + eq + 1, &end);
    // kvpress's boolean arguments (use_vnorm=False) as 0 / 1.
    const std::string text = eq == std::string::npos ? "" : a.substr(eq + 1);
    const bool boolean = text == "true" || text == "True" || text == "false" || text == "False";
    if (boolean) v = text[0] == 't' || text[0] == 'T' ? 1 : 0;
    if (eq == std::string::npos || eq == 0 || text.empty())
      throw Error("--press-param takes NAME=VALUE with a number, true / false or one of the parameter's words, got '" + a + "'");
    // Not a number: a choice parameter's word (leverage_type=key), checked against the press.
    const bool word = !boolean && (end == a.c_str() + eq + 1 || *end != '\0');
    patch.params[a.substr(0, eq)] = {word ? 0 : v, word ? text : "", "--press-param " + a.substr(0, eq)};
  }
  return press_spec_apply(o, patch);  // checks each against the press's declared parameters
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open file");
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  size_t bad = 0;
  if (!is_valid_utf8(s, &bad)) throw Error(path + ": invalid UTF-8 at byte " + std::to_string(bad));
  return s;
}

std::string prompt_from(const std::string& text, const std::string& file) {
  if (!text.empty() && !file.empty()) throw Error("give the prompt with -p or -f, not both");
  if (text.empty() && file.empty()) throw Error("no prompt: give -p TEXT or -f FILE");
  if (!file.empty()) return read_text_file(file);
  size_t bad = 0;
  if (!is_valid_utf8(text, &bad)) throw Error("prompt: invalid UTF-8 at byte " + std::to_string(bad));
  return text;
}

std::string json_dump(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kvzap::cli
