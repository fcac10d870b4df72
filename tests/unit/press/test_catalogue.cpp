// The press catalogue (press/catalogue.h) that `kvzap presses --json`, the C API and the Python package share.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "press/catalogue.h"
#include "press/press.h"

namespace kvzap {
namespace {

TEST(PressCatalogue, ListsEveryRegisteredPressOnceSortedWithItsFields) {
  const nlohmann::json c = press_catalogue_json();
  ASSERT_TRUE(c.contains("presses") && c.contains("families") && c.contains("kvpress_gaps"));
  ASSERT_EQ(c["presses"].size(), scorer_registry().size());
  std::set<std::string> names;
  std::string previous;
  for (const auto& p : c["presses"]) {
    const std::string name = p["name"];
    EXPECT_TRUE(names.insert(name).second) << name << " listed twice";
    EXPECT_LT(previous, name) << "not sorted";
    previous = name;
    ASSERT_NE(find_press_entry(name), nullptr) << name;
    for (const char* field : {"description", "policies", "supports_threshold", "own_budget", "needs_query_stats", "kvpress_ratio_scope",
                              "kvpress_parity", "python_class", "kvpress_class", "params", "demo_params"})
      EXPECT_TRUE(p.contains(field)) << name << " lacks " << field;
    const std::string cls = p["python_class"];
    EXPECT_TRUE(cls.size() > 5 && cls.compare(cls.size() - 5, 5, "Press") == 0) << cls;
    // A press with its own budget takes neither a ratio nor a threshold; the others always take a ratio.
    const auto& pol = p["policies"];
    const bool own = p["own_budget"];
    EXPECT_EQ(own, pol.size() == 1 && pol[0] == "own_budget") << name;
    if (!own) EXPECT_EQ(pol.back(), "ratio") << name;
  }
  EXPECT_EQ(press_python_class("snapkv"), "SnapKVPress");
  EXPECT_EQ(press_python_class("kvzap-mlp"), "KVzapPress");
  EXPECT_EQ(press_python_class("chunk_snapkv"), "ChunkSnapkvPress");
  EXPECT_FALSE(press_is_kvpress_class("chunk_snapkv"));
  EXPECT_TRUE(press_is_kvpress_class("snapkv"));
}

TEST(PressCatalogue, EveryFamilyExampleRunsAndEveryGapIsAbsent) {
  const nlohmann::json c = press_catalogue_json();
  ASSERT_EQ(c["families"].size(), press_families().size());
  std::set<std::string> classes;
  for (const PressFamily& f : press_families()) {
    EXPECT_TRUE(classes.insert(f.kvpress_class).second) << f.kvpress_class;
    EXPECT_EQ(scorer_registry().end(), std::find_if(scorer_registry().begin(), scorer_registry().end(),
                                                    [&](const ScorerEntry& e) { return e.name == f.example; }))
        << f.example << " is a registry entry, not a family member";
    EXPECT_NE(find_press_entry(f.example), nullptr) << f.pattern << ": its example " << f.example << " is unknown";
    EXPECT_FALSE(f.description.empty() || f.kvpress_parity.empty()) << f.pattern;
  }
  for (const char* cls : {"AdaKVPress", "DMSPress", "PerLayerCompressionPress", "ComposedPress", "DecodingPress",
                          "CompressionRatioDecodingPress", "PrefillDecodingPress"})
    EXPECT_EQ(classes.count(cls), 1u) << cls;
  ASSERT_EQ(c["kvpress_gaps"].size(), kvpress_gaps().size());
  for (const auto& g : c["kvpress_gaps"]) {
    EXPECT_EQ(find_press_entry(g["name"].get<std::string>()), nullptr) << g["name"];
    EXPECT_FALSE(g["reason"].get<std::string>().empty());
  }
}

}  // namespace
}  // namespace kvzap
