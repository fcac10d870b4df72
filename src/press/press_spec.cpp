#include "press/press_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include <nlohmann/json.hpp>

#include "common/json_fields.h"
#include "kvzap/error.h"
#include "press/press.h"

namespace kvzap {
namespace {

using nlohmann::json;

double number_in(const json& v, const std::string& field, double lo, double hi) { return json_fields::get_number(v, field, lo, hi); }
int64_t integer_in(const json& v, const std::string& field, int64_t lo, int64_t hi) { return json_fields::get_integer(v, field, lo, hi); }
bool boolean(const json& v, const std::string& field) { return json_fields::get_bool(v, field); }
std::string text(const json& v, const std::string& field) { return json_fields::get_string(v, field); }
using json_fields::wrong_type;

constexpr const char* kSpecFields =
    "press, threshold, ratio, ratios, ratio_scope, window, sink_tokens, prefill_evict_every, decoding, sliding_layers, seed";

// The parameters `press` declares, for error messages ("none" when it takes none).
std::string declared_params(const PressTraits& t) {
  std::string s;
  for (const PressParam& p : t.params) s += (s.empty() ? "" : ", ") + p.name;
  return s.empty() ? "none" : s;
}

}  // namespace

void check_ratio_list(const std::vector<double>& ratios, const std::string& where) {
  if (ratios.empty()) throw Error("'" + where + "' must list at least one ratio");
  for (size_t i = 0; i < ratios.size(); i++)
    if (!(ratios[i] >= 0 && ratios[i] < 1)) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "'%s': ratio %zu is %g; each must be in [0, 1) (the fraction of KV pairs to evict)",
                    where.c_str(), i, ratios[i]);
      throw Error(buf);
    }
}

std::vector<double> parse_ratio_list(const std::string& text, const std::string& where) {
  std::vector<double> out;
  size_t i = 0;
  while (i <= text.size()) {
    const size_t end = text.find_first_of(",:", i);
    const std::string item = text.substr(i, end == std::string::npos ? std::string::npos : end - i);
    char* stop = nullptr;
    const double v = item.empty() ? NAN : std::strtod(item.c_str(), &stop);
    if (item.empty() || *stop != '\0')
      throw Error("'" + where + "' takes ratios separated by ',' or ':' (e.g. 0:0.25:0.5), got '" + text + "'");
    out.push_back(v);
    if (end == std::string::npos) break;
    i = end + 1;
  }
  check_ratio_list(out, where);
  return out;
}

PressSpecPatch parse_press_spec_patch(const json& v, const std::string& where, bool allow_host_paths) {
  if (!v.is_object()) wrong_type(where, "an object", v);
  PressSpecPatch s;
  for (auto& [key, val] : v.items()) {
    const std::string f = where + "." + key;
    if (key == "press") {
      s.press = text(val, f);
      if (s.press->empty()) throw Error("'" + f + "' must not be empty (use \"none\" for no press)");
    } else if (key == "threshold") {
      s.threshold = number_in(val, f, -1e6, 1e6);
    } else if (key == "ratio") {
      s.ratio = number_in(val, f, 0, 1);
      if (*s.ratio >= 1) throw Error("'" + f + "' must be below 1 (the fraction of KV pairs to evict)");
    } else if (key == "ratio_scope") {
      s.ratio_scope = text(val, f);
      if (*s.ratio_scope != "global" && *s.ratio_scope != "layer" && *s.ratio_scope != "head" && *s.ratio_scope != "adakv")
        throw Error("'" + f + "' must be one of global, layer, head, adakv, got " + val.dump());
    } else if (key == "window") {
      s.window = (int)integer_in(val, f, 0, 1 << 20);
    } else if (key == "sink_tokens") {
      s.sink_tokens = (int)integer_in(val, f, 0, 1 << 20);
    } else if (key == "prefill_evict_every") {
      s.prefill_evict_every = (int)integer_in(val, f, 0, 1 << 20);
    } else if (key == "decoding") {
      s.decoding = boolean(val, f);
    } else if (key == "sliding_layers") {
      s.sliding_layers = boolean(val, f);
    } else if (key == "seed") {
      s.seed = (uint64_t)integer_in(val, f, 0, std::numeric_limits<int64_t>::max());
    } else if (key == "ratios") {
      // A JSON array of numbers, or the CLI's text form ("0:0.25:0.5").
      if (val.is_string()) {
        s.ratios = parse_ratio_list(val.get<std::string>(), f);
      } else {
        if (!val.is_array() || val.empty()) wrong_type(f, "a non-empty array of ratios", val);
        std::vector<double> r;
        for (size_t i = 0; i < val.size(); i++) r.push_back(number_in(val[i], f + "[" + std::to_string(i) + "]", -1e9, 1e9));
        check_ratio_list(r, f);
        s.ratios = std::move(r);
      }
    } else if (key == "surrogate" && allow_host_paths) {
      s.surrogate = text(val, f);
    } else if (val.is_number()) {
      s.params[key] = {number_in(val, f, -1e9, 1e9), "", f};  // checked against the press in press_spec_apply
    } else if (val.is_boolean()) {
      s.params[key] = {val.get<bool>() ? 1.0 : 0.0, "", f};  // kvpress's boolean arguments (use_vnorm=False): 0 / 1
    } else if (val.is_string() && !val.get<std::string>().empty()) {
      s.params[key] = {0, val.get<std::string>(), f};  // a choice parameter's word (leverage_type="key")
    } else {
      throw Error("unknown field '" + f + "' (expected " + std::string(kSpecFields) + (allow_host_paths ? ", surrogate" : "") +
                  ", or a parameter of the press)");
    }
  }
  if (s.threshold && s.ratio) throw Error("'" + where + "' takes either 'threshold' or 'ratio', not both");
  // A name no press takes is refused here; whether the press it ends up with takes it, in press_spec_apply.
  for (const auto& [key, given] : s.params) {
    bool declared = false;
    if (s.press)
      for (const PressParam& d : press_traits(*s.press).params) declared |= d.name == key;
    else
      for (const ScorerEntry& e : scorer_registry())
        for (const PressParam& d : e.traits.params) declared |= d.name == key;
    if (!declared && !(s.press && !find_press_entry(*s.press)))
      throw Error("unknown field '" + given.field + "' (expected " + kSpecFields + (allow_host_paths ? ", surrogate" : "") +
                  (s.press ? ", or a parameter of press '" + *s.press + "': " + declared_params(press_traits(*s.press))
                           : std::string(", or a parameter of the press")) + ")");
  }
  return s;
}

PressSpec press_spec_apply(const PressSpec& base, const PressSpecPatch& p) {
  PressSpec out = base;
  if (p.press && *p.press != base.name) {
    out = PressSpec{};
    out.name = *p.press;
  }
  if (p.threshold) out.has_threshold = true, out.threshold = *p.threshold, out.has_ratio = false;
  if (p.ratio) out.has_ratio = true, out.ratio = *p.ratio, out.has_threshold = false;
  if (p.ratio_scope) out.ratio_scope = *p.ratio_scope;
  if (p.window) out.window = *p.window;
  if (p.sink_tokens) out.sink_tokens = *p.sink_tokens;
  if (p.prefill_evict_every) out.prefill_evict_every = *p.prefill_evict_every;
  if (p.decoding) out.decoding = *p.decoding;
  if (p.sliding_layers) out.sliding_layers = *p.sliding_layers;
  if (p.surrogate) out.surrogate_dir = *p.surrogate;
  if (p.seed) out.seed = *p.seed;
  if (p.ratios) out.ratios = *p.ratios;
  const PressTraits& traits = press_traits(out.name);
  for (const auto& [key, given] : p.params) {
    const std::string& field = given.field;
    double value = given.value;
    const PressParam* decl = nullptr;
    for (const PressParam& d : traits.params)
      if (d.name == key) decl = &d;
    if (!decl)
      throw Error("unknown field '" + field + "' (expected " + kSpecFields + ", or a parameter of press '" + out.name +
                  "': " + declared_params(traits) + ")");
    if (!given.word.empty() || !decl->choices.empty()) {
      std::string words;
      for (const std::string& w : decl->choices) words += (words.empty() ? "" : ", ") + w;
      // The client's word, echoed at most 64 bytes long (a hostile request may send megabytes).
      size_t cut = std::min<size_t>(given.word.size(), 64);
      while (cut < given.word.size() && cut > 0 && ((unsigned char)given.word[cut] & 0xC0) == 0x80) cut--;  // whole UTF-8
      const std::string echoed = given.word.substr(0, cut) + (cut < given.word.size() ? "..." : "");
      if (decl->choices.empty())
        throw Error("'" + field + "' must be a number (" + decl->help + "), got \"" + echoed + "\"");
      const auto it = std::find(decl->choices.begin(), decl->choices.end(), given.word);
      if (!given.word.empty() && it == decl->choices.end())
        throw Error("'" + field + "' must be one of " + words + " (" + decl->help + "), got \"" + echoed + "\"");
      if (!given.word.empty()) value = (double)(it - decl->choices.begin());
    }
    if (!(value >= decl->min && value <= decl->max) || (decl->integer && value != std::floor(value))) {
      char range[96];
      std::snprintf(range, sizeof range, "%s in [%g, %g]", decl->integer ? "an integer" : "a number", decl->min, decl->max);
      throw Error("'" + field + "' must be " + range + " (" + decl->help + "), got " + json(value).dump());
    }
    out.params[key] = value;
  }
  // Checked here too (make_press checks the rest), so every front end refuses it on the spec alone.
  if (traits.own_budget && (out.has_ratio || out.has_threshold))
    throw Error("press '" + out.name + "' sets its own budget (see `kvzap presses`) and takes no " +
                (out.has_ratio ? "ratio" : "threshold") + ": leave it out");
  return out;
}

PressSpec press_spec_from_json(const json& v, const std::string& where, bool allow_host_paths) {
  const PressSpecPatch p = parse_press_spec_patch(v, where, allow_host_paths);
  if (!p.press) throw Error("'" + where + ".press' is required");
  return press_spec_apply(PressSpec{}, p);
}

json press_spec_to_json(const PressSpec& s) {
  json j = {{"press", s.name},
            {"ratio_scope", s.ratio_scope},
            {"window", s.window},
            {"sink_tokens", s.sink_tokens},
            {"prefill_evict_every", s.prefill_evict_every},
            {"decoding", s.decoding},
            {"sliding_layers", s.sliding_layers},
            {"seed", s.seed}};
  if (s.has_threshold) j["threshold"] = s.threshold;
  if (s.has_ratio) j["ratio"] = s.ratio;
  if (!s.surrogate_dir.empty()) j["surrogate"] = s.surrogate_dir;
  if (!s.ratios.empty()) j["ratios"] = s.ratios;
  const PressTraits& traits = press_traits(s.name);
  for (const auto& [k, v] : s.params) {
    j[k] = v;
    for (const PressParam& d : traits.params)
      if (d.name == k && !d.choices.empty()) j[k] = press_param_text(d, v);  // the word, as it was given
  }
  return j;
}

json press_params_json(const PressTraits& traits) {
  json arr = json::array();
  for (const PressParam& p : traits.params) {
    json d = {{"name", p.name}, {"default", p.default_value}, {"min", p.min}, {"max", p.max}, {"integer", p.integer},
              {"help", p.help}};
    if (!p.choices.empty()) d["choices"] = p.choices, d["default"] = press_param_text(p, p.default_value);
    arr.push_back(std::move(d));
  }
  return arr;
}

std::string press_param_text(const PressParam& p, double value) {
  if (!p.choices.empty() && value >= 0 && value < (double)p.choices.size() && value == std::floor(value))
    return p.choices[(size_t)value];
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", value);
  return buf;
}

std::string press_spec_key(const PressSpec* s) {
  if (!s) return "none";
  auto exact = [](double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return std::string(buf);
  };
  // Built as a string, not into a fixed buffer: a long surrogate path must not truncate the key.
  std::string key = s->name + "|t=" + std::to_string((int)s->has_threshold) + ":" + exact(s->threshold) +
         "|r=" + std::to_string((int)s->has_ratio) + ":" + exact(s->ratio) + "|scope=" + s->ratio_scope +
         "|w=" + std::to_string(s->window) + "|sink=" + std::to_string(s->sink_tokens) +
         "|every=" + std::to_string(s->prefill_evict_every) + "|dec=" + std::to_string((int)s->decoding) +
         "|slide=" + std::to_string((int)s->sliding_layers) + "|sur=" + s->surrogate_dir + "|seed=" + std::to_string(s->seed);
  for (const auto& [k, v] : s->params) key += "|" + k + "=" + exact(v);
  if (!s->ratios.empty()) {
    key += "|ratios=";
    for (size_t i = 0; i < s->ratios.size(); i++) key += (i ? ":" : "") + exact(s->ratios[i]);
  }
  return key;
}

}  // namespace kvzap
