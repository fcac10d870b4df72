// `kvzap presses [--json]`: the registered scorers, what they do and which policies can wrap them
// (every scorer works with a ratio, except those that set their own budget; only per-step scorers with a
// threshold).
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "press/catalogue.h"
#include "press/press.h"
#include "press/press_spec.h"

namespace kvzap::cli {
namespace {

std::string policies(const ScorerEntry& e) {
  if (e.traits.own_budget) return "own budget";  // no ratio, no threshold (PressTraits::own_budget)
  return e.supports_threshold ? "threshold, ratio" : "ratio";
}

std::string params_text(const PressTraits& t) {
  std::string s;
  for (const PressParam& p : t.params) {
    s += (s.empty() ? "" : ", ") + p.name + "=" + press_param_text(p, p.default_value);
    if (!p.choices.empty()) {
      std::string words;
      for (const std::string& w : p.choices) words += (words.empty() ? "" : "|") + w;
      s += " (" + words + ")";
    }
  }
  return s;
}

int run_presses(bool json) {
  if (json) {
    std::printf("%s\n", json_dump(press_catalogue_json(), 2).c_str());
    return 0;
  }
  std::vector<const ScorerEntry*> entries;
  for (const ScorerEntry& e : scorer_registry()) entries.push_back(&e);
  std::sort(entries.begin(), entries.end(), [](const ScorerEntry* a, const ScorerEntry* b) { return a->name < b->name; });
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
  std::printf("\nFamilies built around any press (not listed above):\n");
  for (const PressFamily& f : press_families())
    std::printf("%s (kvpress %s, e.g. %s): %s; kvpress parity: %s\n", f.pattern.c_str(), f.kvpress_class.c_str(),
                f.example.c_str(), f.description.c_str(), f.kvpress_parity.c_str());
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
