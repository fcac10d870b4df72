// The list of kvpress presses kvzap lacks (press/kvpress_gaps.cpp) stays true to the registry: a press that
// lands must leave the list, and a name on the list is found by either spelling a user may type.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "press/press.h"

namespace {

using namespace kvzap;

TEST(KvpressGaps, NoListedPressIsRegistered) {
  ASSERT_FALSE(kvpress_gaps().empty());
  for (const KvpressGap& g : kvpress_gaps()) {
    EXPECT_EQ(find_press_entry(g.name), nullptr) << g.name << " is registered: remove it from kvpress_gaps()";
    EXPECT_FALSE(std::string(g.reason).empty()) << g.kvpress_class;
  }
  for (const ScorerEntry& e : scorer_registry())
    EXPECT_EQ(find_kvpress_gap(e.name), nullptr) << e.name << " is registered and listed as missing";
}

TEST(KvpressGaps, NamesAreUniqueAndFoundByEitherSpelling) {
  std::set<std::string> seen;
  for (const KvpressGap& g : kvpress_gaps()) {
    EXPECT_TRUE(seen.insert(g.kvpress_class).second) << g.kvpress_class << " listed twice";
    EXPECT_EQ(find_kvpress_gap(g.name), &g);
    EXPECT_EQ(find_kvpress_gap(g.kvpress_class), &g);
  }
  const KvpressGap* q = find_kvpress_gap("DuoAttention");
  ASSERT_NE(q, nullptr);
  EXPECT_STREQ(q->kvpress_class, "DuoAttentionPress");
  // Landed (issue 38): no longer listed, under either spelling.
  EXPECT_EQ(find_kvpress_gap("QFilterPress"), nullptr);
  EXPECT_EQ(find_kvpress_gap("expected_attention_stats"), nullptr);
  EXPECT_EQ(find_kvpress_gap("snapkv"), nullptr);
  EXPECT_EQ(find_kvpress_gap(""), nullptr);
}

}  // namespace
