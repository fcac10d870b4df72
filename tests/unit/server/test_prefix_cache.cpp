// The server's prefix cache: longest-prefix lookup per key, LRU order, the byte budget, and pages going
// back to the engine's pool when an entry leaves (real sequences on the default model).
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/model.h"
#include "server/prefix_cache.h"
#include "test_support.h"

namespace {

using namespace kvzap;
using server::PrefixCache;

class PrefixCacheTest : public test::DefaultModelTest {
 protected:
  void SetUp() override {
    test::DefaultModelTest::SetUp();
    if (HasFatalFailure()) return;
    EngineOptions o;
    o.n_threads = 1;
    o.n_ctx = 256;
    o.n_batch = 64;
    o.kv_budget_bytes = (int64_t)1 << 28;
    engine_ = std::make_unique<Engine>(*model_, o);
  }
  // A sequence holding `tokens` (ids 1..n, distinct per `salt`).
  std::pair<std::vector<int32_t>, std::unique_ptr<Sequence>> prefilled(int n, int salt = 0) {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; i++) ids.push_back(1 + (i * 7 + salt * 13) % 1000);
    auto seq = engine_->new_sequence();
    engine_->feed(*seq, ids.data(), (int64_t)ids.size());
    return {ids, std::move(seq)};
  }
  std::unique_ptr<Engine> engine_;
};

TEST_F(PrefixCacheTest, LookupFindsTheLongestStoredPrefixUnderTheSameKeyOnly) {
  PrefixCache cache((int64_t)1 << 26);
  auto [long_ids, long_seq] = prefilled(40);
  std::vector<int32_t> short_ids(long_ids.begin(), long_ids.begin() + 20);
  auto short_seq = engine_->new_sequence();
  engine_->feed(*short_seq, short_ids.data(), (int64_t)short_ids.size());
  ASSERT_TRUE(cache.insert("press-a", short_ids, std::move(short_seq)));
  ASSERT_TRUE(cache.insert("press-a", long_ids, std::move(long_seq)));
  EXPECT_EQ(cache.size(), 2u);

  std::vector<int32_t> prompt = long_ids;
  prompt.push_back(5);
  PrefixCache::Entry* hit = cache.lookup("press-a", prompt);
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->tokens.size(), 40u);
  // A prompt that leaves the long entry after 30 tokens only matches the short one.
  std::vector<int32_t> diverging(long_ids.begin(), long_ids.begin() + 30);
  diverging.push_back(999);
  hit = cache.lookup("press-a", diverging);
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->tokens.size(), 20u);
  // Another key (press settings or tenant) never sees them; a prompt shorter than every entry misses.
  EXPECT_EQ(cache.lookup("press-b", prompt), nullptr);
  EXPECT_EQ(cache.lookup("press-a", std::vector<int32_t>(long_ids.begin(), long_ids.begin() + 10)), nullptr);
  EXPECT_NE(cache.find_exact("press-a", short_ids), nullptr);
  EXPECT_EQ(cache.find_exact("press-b", short_ids), nullptr);
}

TEST_F(PrefixCacheTest, TheBudgetDropsTheLeastRecentlyUsedAndFreesItsPages) {
  auto [a_ids, a] = prefilled(64, 1);
  const int64_t one = a->cache().bytes_resident() + 64 * (int64_t)sizeof(int32_t);
  PrefixCache cache(2 * one + one / 2);  // room for two entries of this size
  ASSERT_TRUE(cache.insert("k", a_ids, std::move(a)));
  auto [b_ids, b] = prefilled(64, 2);
  ASSERT_TRUE(cache.insert("k", b_ids, std::move(b)));
  EXPECT_EQ(cache.bytes(), 2 * one);
  // Using `a` makes `b` the least recently used: the third entry pushes `b` out, not `a`.
  ASSERT_NE(cache.lookup("k", a_ids), nullptr);
  const int64_t pages_before = engine_->pages().pages_in_use();
  auto [c_ids, c] = prefilled(64, 3);
  EXPECT_GT(engine_->pages().pages_in_use(), pages_before);
  ASSERT_TRUE(cache.insert("k", c_ids, std::move(c)));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_LE(cache.bytes(), cache.budget_bytes());
  EXPECT_NE(cache.find_exact("k", a_ids), nullptr);
  EXPECT_EQ(cache.find_exact("k", b_ids), nullptr);
  EXPECT_NE(cache.find_exact("k", c_ids), nullptr);
  // b's pages went back to the pool (b and c hold as many pages).
  EXPECT_EQ(engine_->pages().pages_in_use(), pages_before);
  // Evicting everything returns every page.
  while (cache.evict_lru()) {
  }
  EXPECT_EQ(cache.bytes(), 0);
  EXPECT_EQ(engine_->pages().pages_in_use(), 0);
}

TEST_F(PrefixCacheTest, AnEntryLargerThanTheBudgetIsRefusedAndReinsertingReplaces) {
  auto [ids, seq] = prefilled(64);
  const int64_t bytes = seq->cache().bytes_resident();
  PrefixCache small(bytes / 2);
  EXPECT_FALSE(small.insert("k", ids, std::move(seq)));
  EXPECT_EQ(small.size(), 0u);
  EXPECT_EQ(small.bytes(), 0);

  PrefixCache cache((int64_t)1 << 26);
  cache.set_entry_overhead(1000);
  auto [ids2, s1] = prefilled(32);
  const int64_t one = s1->cache().bytes_resident() + 1000 + 32 * (int64_t)sizeof(int32_t);
  ASSERT_TRUE(cache.insert("k", ids2, std::move(s1)));
  auto [ids3, s2] = prefilled(32);
  ASSERT_EQ(ids2, ids3);
  ASSERT_TRUE(cache.insert("k", ids3, std::move(s2)));
  EXPECT_EQ(cache.size(), 1u);  // same key and tokens: replaced, counted once
  EXPECT_EQ(cache.bytes(), one);
}

TEST_F(PrefixCacheTest, AQuotaHoldsAtMostItsShareAndDropsOnlyItsOwnEntries) {
  auto [d_ids, d] = prefilled(64, 9);
  const int64_t one = d->cache().bytes_resident() + 64 * (int64_t)sizeof(int32_t);
  PrefixCache cache(8 * one + one / 2);  // room for eight entries; a quota's share (1/4) holds two
  ASSERT_TRUE(cache.insert("server-press", d_ids, std::move(d)));  // uncharged
  std::vector<std::vector<int32_t>> mine;
  for (int i = 0; i < 6; i++) {  // a client's own settings, six entries: only its newest two stay
    auto [ids, seq] = prefilled(64, 20 + i);
    mine.push_back(ids);
    ASSERT_TRUE(cache.insert("custom-" + std::to_string(i), ids, std::move(seq), "tenant=1"));
    EXPECT_LE(cache.quota_bytes("tenant=1"), (int64_t)(cache.budget_bytes() * PrefixCache::kQuotaShare)) << i;
  }
  EXPECT_EQ(cache.quota_bytes("tenant=1"), 2 * one);
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_NE(cache.find_exact("server-press", d_ids), nullptr);  // the uncharged entry was not touched
  EXPECT_EQ(cache.find_exact("custom-3", mine[3]), nullptr);
  EXPECT_NE(cache.find_exact("custom-4", mine[4]), nullptr);
  EXPECT_NE(cache.find_exact("custom-5", mine[5]), nullptr);
  // Another tenant's quota is its own; evicting an entry returns its bytes to its quota.
  auto [o_ids, o] = prefilled(64, 40);
  ASSERT_TRUE(cache.insert("custom-x", o_ids, std::move(o), "tenant=2"));
  EXPECT_EQ(cache.quota_bytes("tenant=2"), one);
  EXPECT_EQ(cache.quota_bytes("tenant=1"), 2 * one);
  while (cache.evict_lru()) {
  }
  EXPECT_EQ(cache.quota_bytes("tenant=1"), 0);
  EXPECT_EQ(cache.quota_bytes("tenant=2"), 0);
  EXPECT_EQ(engine_->pages().pages_in_use(), 0);
  // An entry larger than a quota's share is not kept under that quota.
  PrefixCache tight(3 * one);
  auto [t_ids, t] = prefilled(64, 50);
  EXPECT_FALSE(tight.insert("custom", t_ids, std::move(t), "tenant=1"));
  EXPECT_EQ(tight.size(), 0u);
}

}  // namespace
