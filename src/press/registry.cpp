// The scorer registry and make_press: checks the press options, builds the scorer and wraps it in
// its policy. Scorers register themselves (one static RegisterScorer line in their own file).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>

#include "kvzap/error.h"
#include "press/baselines.h"
#include "press/kvzip.h"
#include "press/policy.h"
#include "press/prefill_decoding.h"
#include "model/model.h"

namespace kvzap {

std::vector<ScorerEntry>& scorer_registry() {
  static std::vector<ScorerEntry> registry;
  return registry;
}

namespace {

std::string known_presses() {
  std::vector<std::string> names;
  for (const ScorerEntry& e : scorer_registry()) names.push_back(e.name);
  std::sort(names.begin(), names.end());
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// What docs/PARITY.md measured for dms_<press> (tests/python/check_kvpress_parity.py): the threshold is
// exact wherever the press's scores are (no ties to break, unlike a ratio).
std::string dms_parity(const ScorerEntry& e) {
  if (e.traits.own_budget) return "";
  for (const char* measured : {"knorm", "keydiff", "snapkv", "tova"})
    if (e.name == measured) return "exact (kvpress DMSPress(" + e.name + "))";
  return "not compared: as the press's own scores (kvpress DMSPress; docs/PARITY.md)";
}

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

const ScorerEntry* find_registered(const std::string& n) {
  const auto& reg = scorer_registry();
  auto it = std::find_if(reg.begin(), reg.end(), [&](const ScorerEntry& e) { return e.name == n; });
  return it == reg.end() ? nullptr : &*it;
}

// "per_layer_<press>": kvpress PerLayerCompressionPress(press, compression_ratios), the ratios in
// PressSpec::ratios (one per layer). A name family like adakv_<press>, not one entry per press.
constexpr const char* kPerLayerPrefix = "per_layer_";
// "composed_<a>+<b>[+...]": kvpress ComposedPress([a, b, ...]), one ratio per stage in PressSpec::ratios.
constexpr const char* kComposedPrefix = "composed_";
// What tests/python/check_decoding_press.py measured for decoding_<press> (docs/PARITY.md).
constexpr const char* kDecodingParity =
    "match up to knorm's ties: every compression identical until a tie broken the other way (kvpress "
    "DecodingPress(KnormPress()), decoding_knorm; tests/python/check_decoding_press.py, docs/PARITY.md)";
constexpr const char* kRatioDecodingParity =
    "match up to knorm's ties: every compression identical until a tie broken the other way (kvpress "
    "CompressionRatioDecodingPress(KnormPress()), compression_ratio_decoding_knorm; tests/python/check_decoding_press.py)";
// What tests/python/check_kvpress_parity.py measured for key_rerotation_<press> (docs/PARITY.md).
constexpr const char* kKeyRerotationParity =
    "exact for key_rerotation_snapkv (kept sets and answers, kvpress KeyRerotationPress(SnapKVPress)); "
    "key_rerotation_knorm matches up to knorm's ties (docs/PARITY.md)";
constexpr const char* kPrefillDecodingParity =
    "match up to knorm's ties: the context's kept sets identical with snapkv (up to ties with knorm), then every "
    "compression until a tie broken the other way (kvpress PrefillDecodingPress(SnapKVPress(0.5) or KnormPress(0.5), "
    "DecodingPress(KnormPress())); tests/python/check_decoding_press.py, docs/PARITY.md)";

}  // namespace

bool is_dms_name(const std::string& name) {
  if (name.rfind(kDmsPrefix, 0) != 0) return false;
  const auto& reg = scorer_registry();
  return std::none_of(reg.begin(), reg.end(), [&](const ScorerEntry& e) { return e.name == name; });
}

std::vector<std::string> composed_stages(const std::string& name) {
  const std::string prefix = kComposedPrefix;
  if (name.rfind(prefix, 0) != 0 || find_registered(name)) return {};
  std::vector<std::string> out;
  size_t i = prefix.size();
  while (true) {
    const size_t plus = name.find('+', i);
    out.push_back(name.substr(i, plus == std::string::npos ? std::string::npos : plus - i));
    if (plus == std::string::npos) break;
    i = plus + 1;
  }
  return out;
}

std::string per_layer_inner(const std::string& name) {
  const std::string prefix = kPerLayerPrefix;
  if (name.rfind(prefix, 0) != 0 || find_registered(name)) return "";
  return name.substr(prefix.size());
}

bool is_ratio_decoding_name(const std::string& name) {
  return name.rfind(kRatioDecodingPrefix, 0) == 0 && !find_registered(name);
}

std::string key_rerotation_inner(const std::string& name) {
  const std::string prefix = kKeyRerotationPrefix;
  if (name.rfind(prefix, 0) != 0 || find_registered(name)) return "";
  return name.substr(prefix.size());
}

std::string decoding_inner(const std::string& name) {
  if (find_registered(name)) return "";
  for (const std::string prefix : {kDecodingPrefix, kRatioDecodingPrefix})
    if (name.rfind(prefix, 0) == 0) return name.substr(prefix.size());
  return "";
}

bool is_prefill_decoding_name(const std::string& name) {
  return name.rfind(kPrefillDecodingPrefix, 0) == 0 && !find_registered(name);
}

std::pair<std::string, std::string> prefill_decoding_parts(const std::string& name) {
  if (!is_prefill_decoding_name(name)) return {};
  const std::string rest = name.substr(std::string(kPrefillDecodingPrefix).size());
  for (size_t plus = rest.rfind('+'); plus != std::string::npos; plus = plus ? rest.rfind('+', plus - 1) : std::string::npos) {
    const std::string b = rest.substr(plus + 1);
    if (b.rfind(kDecodingPrefix, 0) == 0 || b.rfind(kRatioDecodingPrefix, 0) == 0) return {rest.substr(0, plus), b};
  }
  return {};
}

const ScorerEntry* find_press_entry(const std::string& name) {
  if (const ScorerEntry* e = find_registered(name)) return e;
  // Known when both sides are (the prefill press's entry stands for it; press_traits adds the decoding side's).
  if (is_prefill_decoding_name(name)) {
    const auto [a, b] = prefill_decoding_parts(name);
    if (a.empty() || !decoding_inner(a).empty() || is_prefill_decoding_name(a) || !find_press_entry(b)) return nullptr;
    return find_press_entry(a);
  }
  // Only a registered press inside (decoding_adakv_knorm, decoding_dms_knorm are not presses of their own).
  if (const std::string inner = decoding_inner(name); !inner.empty()) return find_registered(inner);
  // Any press taking a ratio inside (key_rerotation_adakv_snapkv too): the entry that press runs.
  if (const std::string inner = key_rerotation_inner(name); !inner.empty()) return find_press_entry(inner);
  if (is_dms_name(name)) return find_registered(name.substr(std::string(kDmsPrefix).size()));
  const std::string ada_prefix = "adakv_";
  if (name.rfind(ada_prefix, 0) == 0) return find_registered(name.substr(ada_prefix.size()));
  // Only a registered press inside (per_layer_adakv_snapkv would ask for two budget splits).
  if (const std::string inner = per_layer_inner(name); !inner.empty()) return find_registered(inner);
  // A composition is known when every stage is a registered press; its first stage stands for it here
  // (press_traits gives the union of the stages' parameters).
  if (const std::vector<std::string> stages = composed_stages(name); !stages.empty()) {
    for (const std::string& st : stages)
      if (!find_registered(st)) return nullptr;
    return find_registered(stages.front());
  }
  return nullptr;
}

const PressTraits& press_traits(const std::string& name) {
  static const PressTraits defaults;
  const ScorerEntry* e = find_press_entry(name);
  if (!e) return defaults;
  if (e->name == name) return e->traits;
  static std::mutex mu;
  if (is_prefill_decoding_name(name)) {
    // The prefill press's traits (its ratio or threshold, its context needs) and the decoding press's
    // parameters besides. Both sides' traits are looked up before locking (they may take the lock).
    const auto [a, b] = prefill_decoding_parts(name);
    const PressTraits& ta = press_traits(a);
    const PressTraits& tb = press_traits(b);
    static std::map<std::string, PressTraits> prefill_decoding;  // node-based: references stay valid
    std::lock_guard<std::mutex> lock(mu);
    auto [it, fresh] = prefill_decoding.try_emplace(name, ta);
    if (fresh) {
      PressTraits& t = it->second;
      for (const PressParam& p : tb.params)
        if (std::none_of(t.params.begin(), t.params.end(), [&](const PressParam& q) { return q.name == p.name; }))
          t.params.push_back(p);
      for (const auto& [k, v] : tb.demo_params) t.demo_params.emplace(k, v);
      // The calibrated default threshold (KVzap) is the prefill press's, asked under its own name.
      if (ta.default_threshold)
        t.default_threshold = [f = ta.default_threshold, a](const PressSpec& s, const Model& m) {
          PressSpec sa = s;
          sa.name = a;
          return f(sa, m);
        };
      t.kvpress_parity = kPrefillDecodingParity;
    }
    return it->second;
  }
  if (const std::vector<std::string> stages = composed_stages(name); !stages.empty()) {
    // Every stage's parameters (a name two stages declare goes to both, the first's default shown), the
    // longest context any stage needs.
    static std::map<std::string, PressTraits> composed;
    std::lock_guard<std::mutex> lock(mu);
    auto [it, fresh] = composed.try_emplace(name);
    if (fresh) {
      PressTraits& t = it->second;
      for (const std::string& st : stages) {
        const PressTraits& s = find_registered(st)->traits;
        for (const PressParam& p : s.params)
          if (std::none_of(t.params.begin(), t.params.end(), [&](const PressParam& q) { return q.name == p.name; }))
            t.params.push_back(p);
        t.min_context_tokens = std::max(t.min_context_tokens, s.min_context_tokens);
        if (t.min_context_param.empty()) t.min_context_param = s.min_context_param;
      }
      t.kvpress_parity = "match up to knorm's ties (kvpress ComposedPress: composed_snapkv+knorm, composed_knorm+knorm; docs/PARITY.md)";
    }
    return it->second;
  }
  if (const std::string inner = key_rerotation_inner(name); !inner.empty()) {
    // The inner press's traits, run by ratio only (kvpress wraps a ScorerPress's compression_ratio).
    static std::map<std::string, PressTraits> rerotated;  // node-based: references stay valid
    const PressTraits& of = press_traits(inner);
    std::lock_guard<std::mutex> lock(mu);
    auto [it, fresh] = rerotated.try_emplace(inner, of);
    if (fresh) {
      PressTraits& t = it->second;
      t.threshold_by_default = false;
      t.default_threshold = nullptr;
      t.threshold_on_context = false;
      t.kvpress_parity = kKeyRerotationParity;
    }
    return it->second;
  }
  if (!decoding_inner(name).empty()) {
    // The inner press's parameters and DecodingPress's two. No ratio or threshold (the target sets the ratio
    // at each compression): own_budget, so that every front end refuses them and prefill_evict_every stays 0.
    static std::map<std::string, PressTraits> decoding;  // node-based: references stay valid
    std::lock_guard<std::mutex> lock(mu);
    const bool by_ratio = is_ratio_decoding_name(name);
    auto [it, fresh] = decoding.try_emplace((by_ratio ? "r:" : "t:") + e->name, e->traits);
    if (fresh) {
      PressTraits& t = it->second;
      t.threshold_by_default = false;
      t.default_threshold = nullptr;
      t.threshold_on_context = false;
      t.own_budget = true;
      t.min_context_tokens = 0;  // the context is never judged alone
      t.min_context_param.clear();
      t.params.push_back({"compression_interval", 512, 1, 1e9, true,
                          "decoding steps of a layer between two compressions (the question's step counts as one)"});
      if (by_ratio) {
        t.params.push_back({"target_compression_ratio", 0.5, 0, 1, false,
                            "the share of the tokens seen so far a compression removes (below 1)"});
        t.demo_params = {{"compression_interval", 16}, {"target_compression_ratio", 0.5}};
        t.kvpress_parity = kRatioDecodingParity;
      } else {
        t.params.push_back({"target_size", 2048, 1, 1e9, true, "entries each head keeps after a compression"});
        t.demo_params = {{"compression_interval", 16}, {"target_size", 64}};
        t.kvpress_parity = kDecodingParity;
      }
    }
    return it->second;
  }
  if (!per_layer_inner(name).empty()) {
    // The inner press's parameters; no default threshold (it takes ratios only).
    static std::map<std::string, PressTraits> per_layer;  // node-based: references stay valid
    std::lock_guard<std::mutex> lock(mu);
    auto [it, fresh] = per_layer.try_emplace(e->name, e->traits);
    if (fresh) {
      PressTraits& t = it->second;
      t.threshold_by_default = false;
      t.default_threshold = nullptr;
      t.kvpress_parity = "as its press, ties included (kvpress PerLayerCompressionPress: per_layer_knorm, per_layer_snapkv exact; docs/PARITY.md)";
    }
    return it->second;
  }
  if (is_dms_name(name)) {
    static std::map<std::string, PressTraits> dms;  // node-based: references stay valid
    std::lock_guard<std::mutex> lock(mu);
    // "dms_<press>": the press's parameters, run by threshold (kvpress DMSPress takes no ratio); a context
    // scorer is judged once its context is prefilled.
    auto [it, fresh] = dms.try_emplace(name, e->traits);
    if (fresh) {
      it->second.threshold_by_default = true;
      it->second.threshold_on_context = !e->supports_threshold;
      it->second.kvpress_parity = dms_parity(*e);
    }
    return it->second;
  }
  // "adakv_<press>" wrapping a registered press: its traits and AdaKV's alpha_safeguard, unless the
  // press is an AdaKV press already (it declares the parameter itself).
  for (const PressParam& p : e->traits.params)
    if (p.name == "alpha_safeguard") return e->traits;
  static std::map<std::string, PressTraits> wrapped;  // node-based: references stay valid
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = wrapped.try_emplace(e->name, e->traits);
  if (fresh) it->second.params.push_back(adakv_alpha_safeguard_param());
  return it->second;
}

double press_param(const PressSpec& spec, const std::string& name) {
  if (auto it = spec.params.find(name); it != spec.params.end()) return it->second;
  for (const PressParam& p : press_traits(spec.name).params)
    if (p.name == name) return p.default_value;
  throw Error("internal: press '" + spec.name + "' declares no parameter '" + name + "'");
}

int64_t press_min_context(const PressSpec& spec) {
  const PressTraits& t = press_traits(spec.name);
  return t.min_context_param.empty() ? t.min_context_tokens : (int64_t)press_param(spec, t.min_context_param);
}

namespace {

// "dms_<press>" (kvpress DMSPress(press, threshold, sliding_window_size, decoding)): the press's raw scores
// against a threshold, the most recent `window` tokens protected. A per-token scorer runs under the threshold
// policy as it is (it is DMSPress, decoding included); a context scorer is judged once its context is
// prefilled (kvpress scores the one-pass prefill), by the ratio policy's protocol with a threshold split.
std::unique_ptr<Press> make_dms_press(const ScorerEntry& entry, PressSpec opt, const Model& model) {
  if (entry.traits.own_budget)
    throw Error("press '" + entry.name + "' sets its own budget and cannot be wrapped in DMS (" + opt.name + ")");
  if (opt.has_ratio)
    throw Error("press '" + opt.name + "' evicts by threshold (kvpress DMSPress) and takes no ratio: give it a threshold");
  if (!opt.has_threshold && entry.traits.default_threshold) {
    if (const std::optional<double> t = entry.traits.default_threshold(opt, model)) {
      opt.has_threshold = true;
      opt.threshold = *t;
    }
  }
  if (!opt.has_threshold)
    throw Error("press '" + opt.name + "' needs a threshold (kvpress DMSPress(press, threshold=...)): entries of the "
                "press scoring below it are evicted");
  if (std::isnan(opt.threshold)) throw Error("the threshold must be a number");
  if (opt.window < 0) throw Error("the window must be >= 0, got " + std::to_string(opt.window));
  if (entry.supports_threshold) {
    std::unique_ptr<Scorer> scorer = entry.make(opt, model);
    if (!scorer->per_step()) throw Error("internal: press '" + entry.name + "' supports a threshold but is not a per-step scorer");
    return make_threshold_press(std::move(scorer), opt);
  }
  if (opt.decoding)
    throw Error("press '" + opt.name + "' scores the whole context at once: it cannot prune while decoding (decoding "
                "needs a per-token press, e.g. dms_knorm)");
  if (opt.prefill_evict_every > 0)
    throw Error("press '" + opt.name + "' judges the whole context once it is complete: prefill_evict_every does not apply");
  const Model* m = &model;
  ScorerFactory make_scorer = [make = entry.make, opt, m]() {
    return make_dms_context_scorer(make(opt, *m), opt.threshold, opt.window, opt.sink_tokens);
  };
  return make_ratio_press(make_scorer, opt);
}

// "per_layer_<press>" (kvpress PerLayerCompressionPress): the press's scores under the ratio policy, each
// layer keeping kvpress_n_kept(ratios[layer], T) entries per head (press/scorer_per_layer.cpp).
std::unique_ptr<Press> make_per_layer_press(const PressSpec& spec, const ScorerEntry& entry, const Model& model) {
  const std::string& name = spec.name;
  // kvpress asserts a ScorerPress whose compression_ratio it can set: not one choosing its own budget,
  // nor one whose ratio is not a per-head one (KVzip's is global).
  if (entry.traits.own_budget)
    throw Error("press '" + entry.name + "' sets its own budget: per_layer_" + entry.name + " has no ratio to set per layer");
  if (entry.traits.kvpress_ratio_scope != "head")
    throw Error("press '" + entry.name + "' splits its ratio " + entry.traits.kvpress_ratio_scope +
                "-wide in kvpress, not per head: per-layer ratios need a per-head ScorerPress");
  if (spec.has_threshold || spec.has_ratio)
    throw Error("press '" + name + "' takes one ratio per layer (ratios / --press-ratios), not a " +
                (spec.has_threshold ? "threshold" : "single ratio"));
  const int n_layer = model.config().n_layer;
  if (spec.ratios.size() != (size_t)n_layer)
    throw Error("press '" + name + "' needs one ratio per layer: the model has " + std::to_string(n_layer) + " layers, " +
                std::to_string(spec.ratios.size()) + " ratio" + (spec.ratios.size() == 1 ? "" : "s") + " given");
  check_ratio_list(spec.ratios, "ratios");
  if (spec.decoding) throw Error("press '" + name + "' compresses the context only: it cannot prune while decoding");
  if (spec.prefill_evict_every > 0)
    throw Error("press '" + name + "' judges the whole context once it is complete: prefill_evict_every does not apply");
  PressSpec opt = spec;
  // The ratio policy shows (and skips a context at) the mean, kvpress's compression_ratio property; the
  // inner press is built with it too (the few that read the ratio while scoring see one value).
  double sum = 0;
  for (double r : spec.ratios) sum += r;
  opt.has_ratio = true;
  opt.ratio = sum / (double)spec.ratios.size();
  opt.ratio_scope = "head";
  const Model* m = &model;
  ScorerFactory make_scorer = [make = entry.make, opt, m]() { return make_per_layer_scorer(make(opt, *m), opt.ratios); };
  return make_ratio_press(make_scorer, opt);
}

}  // namespace

std::unique_ptr<Press> make_press(const PressSpec& options, const Model& model) {
  PressSpec opt = options;
  if (is_prefill_decoding_name(opt.name)) return make_prefill_decoding_press(opt, model);
  if (const std::vector<std::string> stages = composed_stages(opt.name); !stages.empty())
    return make_composed_press(opt, stages, model);
  // "adakv_<press>": any registered press under the AdaKV budget (press/scorer_adakv.cpp).
  const ScorerEntry* found = find_press_entry(opt.name);
  if (!found) {
    if (const KvpressGap* gap = find_kvpress_gap(opt.name))
      throw Error("press '" + opt.name + "': kvpress's " + gap->kvpress_class + " is not in kvzap: " + gap->reason);
    throw Error("unknown press '" + opt.name + "' (known presses: " + known_presses() +
                "; adakv_<press> for AdaKV, dms_<press> for DMS, per_layer_<press>, composed_<a>+<b>, decoding_<press>, compression_ratio_decoding_<press>, "
                "key_rerotation_<press>, prefill_decoding_<press>+decoding_<press>)");
  }
  const ScorerEntry& entry = *found;
  if (const std::string inner = key_rerotation_inner(opt.name); !inner.empty())
    return make_key_rerotation_press(opt, inner, model);
  if (!decoding_inner(opt.name).empty()) return make_decoding_press(opt, entry, model);
  const std::string per_layer_of = per_layer_inner(opt.name);
  if (!per_layer_of.empty()) return make_per_layer_press(opt, entry, model);
  if (!opt.ratios.empty())
    throw Error("press '" + opt.name + "' takes no list of ratios (ratios / --press-ratios are for per_layer_<press> and composed_<a>+<b>)");
  if (is_dms_name(opt.name)) return make_dms_press(entry, opt, model);
  const bool wrap_adakv = entry.name != opt.name;
  // No setting given: the press's default threshold, if the registry gives it one (KVzap: calibrated).
  if (!opt.has_threshold && !opt.has_ratio && entry.traits.default_threshold && !wrap_adakv) {
    if (const std::optional<double> t = entry.traits.default_threshold(opt, model)) {
      opt.has_threshold = true;
      opt.threshold = *t;
    }
  }
  if (entry.traits.own_budget) {
    // It chooses what to evict itself (e.g. SimLayerKV's lazy layers): a ratio or threshold would mean nothing.
    if (wrap_adakv) throw Error("press '" + entry.name + "' sets its own budget and cannot be wrapped in AdaKV");
    if (opt.has_ratio || opt.has_threshold)
      throw Error("press '" + opt.name + "' sets its own budget (see `kvzap presses`) and takes no " +
                  (opt.has_ratio ? "ratio" : "threshold") + ": leave it out");
    if (opt.decoding) throw Error("press '" + opt.name + "' compresses the context only: it cannot prune while decoding");
    if (opt.prefill_evict_every > 0)
      throw Error("press '" + opt.name + "' judges the whole context once it is complete: prefill_evict_every does not apply");
    parse_ratio_scope(opt.ratio_scope);
    std::unique_ptr<Scorer> probe = entry.make(opt, model);
    const auto* split = dynamic_cast<const BudgetSplit*>(probe.get());
    if (!split || split->uses_ratio() || probe->per_step())
      throw Error("internal: press '" + opt.name + "' declares its own budget but its scorer does not choose it");
    const Model* m = &model;
    return make_ratio_press([make = entry.make, opt, m]() { return make(opt, *m); }, opt);
  }
  if (wrap_adakv && opt.has_threshold)
    throw Error("press '" + opt.name + "' is an AdaKV ratio budget and cannot use a threshold; give it a ratio");

  if (opt.has_threshold == opt.has_ratio)
    throw Error("press '" + opt.name + "' needs exactly one of a threshold or a ratio");
  if (opt.has_threshold) {
    if (!entry.supports_threshold)
      throw Error("press '" + opt.name + "' scores the whole context at once and cannot use a threshold; give it a ratio");
    if (std::isnan(opt.threshold)) throw Error("the threshold must be a number");
    if (opt.window < 0) throw Error("the window must be >= 0, got " + std::to_string(opt.window));
  } else {
    if (!(opt.ratio >= 0 && opt.ratio < 1)) throw Error("the ratio must be in [0, 1), got " + number(opt.ratio));
    parse_ratio_scope(opt.ratio_scope);
    // Decoding-time pruning is the threshold policy's; a ratio press only compresses the context.
    if (opt.decoding) throw Error("pruning while decoding needs a threshold press, not a ratio");
    if (opt.prefill_evict_every > 0)
      throw Error("evicting while prefilling needs a threshold press: with a ratio, press '" + opt.name +
                  "' judges the whole context once it is complete");
  }

  if (opt.has_threshold) {
    std::unique_ptr<Scorer> scorer = entry.make(opt, model);
    if (!scorer->per_step()) throw Error("internal: press '" + opt.name + "' supports a threshold but is not a per-step scorer");
    return make_threshold_press(std::move(scorer), opt);
  }
  // The ratio policy keeps the recipe, so that a copy of the press (a fork) gets a fresh scorer.
  const Model* m = &model;
  ScorerFactory make_scorer = [make = entry.make, opt, m, wrap_adakv, name = entry.name]() {
    std::unique_ptr<Scorer> scorer = make(opt, *m);
    if (wrap_adakv) {
      const auto* split = dynamic_cast<BudgetSplit*>(scorer.get());
      if (split && split->budget_name() != "adakv")
        throw Error("press '" + name + "' splits its budget itself and cannot be wrapped in AdaKV");
      // An AdaKV press stays as it is (it read alpha_safeguard itself).
      if (!split) scorer = make_adakv_scorer(std::move(scorer), press_param(opt, "alpha_safeguard"));
    }
    return scorer;
  };
  return make_ratio_press(make_scorer, opt);
}

}  // namespace kvzap
