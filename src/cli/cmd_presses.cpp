// `kvzap presses [--json]`: the registered scorers, what they do and which policies can wrap them
// (every scorer works with a ratio, except those that set their own budget; only per-step scorers with a
// threshold).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "press/press.h"

namespace kvzap::cli {
namespace {

std::string policies(const ScorerEntry& e) {
  if (e.traits.own_budget) return "own budget";  // no ratio, no threshold (PressTraits::own_budget)
  return e.supports_threshold ? "threshold, ratio" : "ratio";
}

std::string params_text(const PressTraits& t) {
  std::string s;
  char buf[64];
  for (const PressParam& p : t.params) {
    std::snprintf(buf, sizeof buf, "%g", p.default_value);
    s += (s.empty() ? "" : ", ") + p.name + "=" + buf;
  }
  return s;
}

int run_presses(bool json) {
  std::vector<const ScorerEntry*> entries;
  for (const ScorerEntry& e : scorer_registry()) entries.push_back(&e);
  std::sort(entries.begin(), entries.end(), [](const ScorerEntry* a, const ScorerEntry* b) { return a->name < b->name; });
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const ScorerEntry* e : entries) {
      nlohmann::json pol = nlohmann::json::array();
      if (e->traits.own_budget) {
        pol.push_back("own_budget");
      } else {
        if (e->supports_threshold) pol.push_back("threshold");
        pol.push_back("ratio");
      }
      out.push_back({{"name", e->name}, {"description", e->description}, {"policies", pol},
                     {"kvpress_parity", e->traits.kvpress_parity.empty() ? "not compared" : e->traits.kvpress_parity},
                     {"params", press_params_json(e->traits)}});
    }
    std::printf("%s\n", json_dump(out, 2).c_str());
    return 0;
  }
  size_t w = 4;
  for (const ScorerEntry* e : entries) w = std::max(w, e->name.size());
  std::printf("%-*s  %-16s  %s\n", (int)w, "NAME", "POLICIES", "DESCRIPTION");
  for (const ScorerEntry* e : entries) {
    std::printf("%-*s  %-16s  %s\n", (int)w, e->name.c_str(), policies(*e).c_str(), e->description.c_str());
    std::printf("%-*s  %-16s  kvpress parity: %s\n", (int)w, "", "",
                e->traits.kvpress_parity.empty() ? "not compared" : e->traits.kvpress_parity.c_str());
    if (!e->traits.params.empty())
      std::printf("%-*s  %-16s  parameters (--press-param): %s\n", (int)w, "", "", params_text(e->traits).c_str());
  }
  std::printf("\nadakv_<press>: any press under AdaKV's budget (kvpress AdaKVPress), with the press's parameters and "
              "alpha_safeguard=0.2; parity in docs/PARITY.md\n");
  std::printf("dms_<press>: any press's scores under a threshold (kvpress DMSPress; policy: threshold, window=128 most "
              "recent tokens kept; a per-token press also with --decode-press, a whole-context press judged once the "
              "context is prefilled), with the press's parameters; kvpress parity: exact for dms_knorm, dms_keydiff, "
              "dms_snapkv and dms_tova (docs/PARITY.md)\n");
  std::printf("per_layer_<press>: a per-head ratio press with one ratio per layer (kvpress PerLayerCompressionPress), "
              "--press-ratios R0:R1:... ; kvpress parity: %s\n", press_traits("per_layer_knorm").kvpress_parity.c_str());
  std::printf("composed_<a>+<b>[+...]: presses applied in turn, each on what the previous kept (kvpress ComposedPress), "
              "one ratio per stage, --press-ratios Ra:Rb ; later stages score each entry alone (per-token presses such as "
              "knorm); kvpress parity: %s\n", press_traits("composed_snapkv+knorm").kvpress_parity.c_str());
  const auto gaps = kvpress_gaps();
  std::printf("\nkvpress presses kvzap does not have (%zu):\n", gaps.size());
  size_t gw = 0;
  for (const KvpressGap& g : gaps) gw = std::max(gw, std::strlen(g.kvpress_class));
  for (const KvpressGap& g : gaps) std::printf("  %-*s  %s\n", (int)gw, g.kvpress_class, g.reason);
  return 0;
}

RegisterCommand reg("presses", "List the KV-cache presses and the policies they support", [](CLI::App& sub) {
  auto json = std::make_shared<bool>(false);
  sub.add_flag("--json", *json, "Print machine-readable JSON");
  return [=]() -> int { return run_presses(*json); };
});

}  // namespace
}  // namespace kvzap::cli
