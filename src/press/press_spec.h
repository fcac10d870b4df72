// PressSpec: the one value that says which press a sequence runs and how (issue 35). Every front end
// builds it the same way: the CLI from its flags (cli/cli_common.h PressArgs::spec), the server and the C
// API / Python package from a JSON object (press_spec_from_json, press_spec_apply). Its canonical key
// (press_spec_key) names the settings in cache files, the server's prefix cache and slots, reports and
// /metrics. Validation against the registry (does the press exist, which policies it takes) is make_press's.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace kvzap {

struct PressSpec {
  std::string name;
  // Exactly one of threshold / ratio selects the policy.
  bool has_threshold = false;
  double threshold = 0;       // evict a pair when its score < threshold (strict)
  bool has_ratio = false;
  double ratio = 0;           // fraction of context entries to evict
  std::string ratio_scope = "global";  // global | layer | head
  int window = 128;           // threshold policy: the most recent `window` tokens are never judged
  // Threshold policy: positions < sink_tokens are never evicted (attention sinks such as <bos>). 0, as in
  // the KVzap paper and kvpress (their threshold press protects no sink).
  int sink_tokens = 0;
  bool decoding = false;      // threshold policy: also prune question and generated tokens
  // Threshold policy: while a context is prefilled, judge it every `prefill_evict_every` positions (each
  // entry that has left the window by then) and free its pages at once, so a request never holds much
  // more than kept + window + one interval. The engine cuts context steps at multiples of it, so the kept
  // set does not depend on how the prompt is chunked or batched. Later context tokens then attend to the
  // pruned cache (as decoding does). 0 = judge the context once it is complete (kvpress's one-pass prefill).
  int prefill_evict_every = 0;
  // Sliding-window layers (Gemma 3's local layers) already keep only their window: presses leave them
  // alone unless asked (they prune the global layers).
  bool sliding_layers = false;
  std::string surrogate_dir;  // KVzap surrogates (empty = the shipped default for the model)
  uint64_t seed = 42;         // random press
  // A press's own parameters under kvpress's argument names (SnapKV's window_size, StreamingLLM's n_sink,
  // ...): the registry declares which each press takes, with defaults and ranges (PressTraits::params);
  // only those given are here (press_param reads a value or its default).
  std::map<std::string, double> params;
  // A list of ratios, for the presses built of others whose kvpress arguments are a list: one per layer
  // for per_layer_<press> (kvpress PerLayerCompressionPress's compression_ratios), one per stage for
  // composed_<a>+<b>+... (each ComposedPress stage's compression_ratio). A field of its own rather than
  // a press parameter: parameters are single numbers with a declared range, this is a list whose length
  // only the model (or the name) fixes. Each value is checked in [0, 1) here (press_spec_apply); the
  // count against the model by make_press. Empty for every other press.
  std::vector<double> ratios;
};

// The fields a JSON object sets, each optional: a request's `kv_compression`, the C API's press JSON.
// Fields not given keep the base's value (press_spec_apply).
struct PressSpecPatch {
  std::optional<std::string> press;  // "none" = no press
  std::optional<double> threshold, ratio;
  std::optional<std::string> ratio_scope;
  std::optional<int> window, sink_tokens, prefill_evict_every;
  std::optional<bool> decoding, sliding_layers;
  std::optional<std::string> surrogate;  // a folder on the host: trusted front ends only
  std::optional<uint64_t> seed;
  std::optional<std::vector<double>> ratios;
  // Any other number, boolean or word: a press parameter, checked by press_spec_apply against the press it
  // ends up naming (a word must be one of the parameter's choices).
  struct GivenParam {
    double value = 0;
    std::string word;   // non-empty: given as a word (PressParam::choices)
    std::string field;  // the field's path, for error messages
  };
  std::map<std::string, GivenParam> params;
};

// Parses `v` (an object) field by field; errors (kvzap::Error) name the field as `<where>.<key>`.
// allow_host_paths: whether `surrogate` (a path on this machine) may be given; a server refuses it.
PressSpecPatch parse_press_spec_patch(const nlohmann::json& v, const std::string& where, bool allow_host_paths);
// base with the patch's fields on top. A threshold clears the base's ratio and the other way round;
// naming another press than base.name starts from PressSpec{} (the base's settings were for its press).
// Throws kvzap::Error for a parameter the resulting press does not declare, or out of its range.
PressSpec press_spec_apply(const PressSpec& base, const PressSpecPatch& patch);
// A whole spec from JSON: {"press": name, ...}; the press is required.
PressSpec press_spec_from_json(const nlohmann::json& v, const std::string& where = "press", bool allow_host_paths = true);
nlohmann::json press_spec_to_json(const PressSpec& s);
// The ratio list of `--press-ratios` / a "ratios" string: numbers separated by ',' or ':' ("0:0.25:0.5").
// Throws kvzap::Error naming `where` for an empty list, a non-number or a value outside [0, 1).
std::vector<double> parse_ratio_list(const std::string& text, const std::string& where);
// Checks every value is in [0, 1) (kvpress asserts 0 <= compression_ratio < 1); throws kvzap::Error naming `where`.
void check_ratio_list(const std::vector<double>& ratios, const std::string& where);
struct PressTraits;
struct PressParam;
// The parameters a press declares, as JSON: [{"name", "default", "min", "max", "integer", "help"}].
nlohmann::json press_params_json(const PressTraits& traits);
// A parameter's value as a user writes it: the word of a choice parameter, else the number ("%g").
std::string press_param_text(const PressParam& p, double value);
// Canonical text of every field (equal keys = equal behaviour); "none" for no press.
std::string press_spec_key(const PressSpec* s);

}  // namespace kvzap
