// KvCache tests: per-(layer, head) streams keep their entries in position order through append,
// evict and truncate; eviction really frees pages; the accounting follows kvpress's definitions.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cache/kv_cache.h"
#include "common/fp16.h"
#include "kvzap/error.h"

namespace {

using kvzap::KvCache;
constexpr int kL = 2, kH = 3, kD = 4;
constexpr int P = KvCache::kPageTokens;

// Key/value contents that identify an entry and are exact in f16 (< 11 significant bits; pos < 64).
float key_value(int layer, int head, int32_t pos, int d) { return (float)pos + 0.25f * d; }
float val_value(int layer, int head, int32_t pos, int d) { return -(float)(layer * 256 + head * 64 + pos) - 0.5f * d; }

void append_tokens(KvCache& c, int32_t from, int32_t to) {
  const int64_t n = to - from;
  std::vector<float> k((size_t)n * kH * kD), v(k.size());  // [n][H][D]
  std::vector<int32_t> pos((size_t)n);
  for (int l = 0; l < kL; l++) {
    for (int64_t t = 0; t < n; t++) {
      pos[(size_t)t] = from + (int32_t)t;
      for (int h = 0; h < kH; h++)
        for (int d = 0; d < kD; d++) {
          k[((size_t)t * kH + h) * kD + d] = key_value(l, h, from + (int32_t)t, d);
          v[((size_t)t * kH + h) * kD + d] = val_value(l, h, from + (int32_t)t, d);
        }
    }
    c.append_layer(l, n, k.data(), v.data(), pos.data());
  }
  c.set_n_past(to);
}

std::vector<int32_t> positions(const KvCache& c, int l, int h) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < c.length(l, h); i++) p.push_back(c.position_at(l, h, i));
  return p;
}

// Every entry's key and value still belong to its position (nothing was mixed up by compaction).
void expect_contents_match_positions(const KvCache& c) {
  for (int l = 0; l < kL; l++)
    for (int h = 0; h < kH; h++)
      for (int64_t i = 0; i < c.length(l, h); i++) {
        const int32_t p = c.position_at(l, h, i);
        for (int d = 0; d < kD; d++) {
          ASSERT_EQ(kvzap::fp16_to_fp32(c.key_at(l, h, i)[d]), key_value(l, h, p, d)) << l << " " << h << " " << i;
          ASSERT_EQ(kvzap::fp16_to_fp32(c.value_at(l, h, i)[d]), val_value(l, h, p, d)) << l << " " << h << " " << i;
        }
      }
}

std::vector<int32_t> range(int32_t a, int32_t b) {
  std::vector<int32_t> r;
  for (int32_t i = a; i < b; i++) r.push_back(i);
  return r;
}

int64_t pages_for(int64_t n) { return (n + P - 1) / P; }

TEST(KvCache, AppendKeepsOrderPositionsAndContents) {
  KvCache c(kL, kH, kD);
  append_tokens(c, 0, 5);
  append_tokens(c, 5, 40);
  EXPECT_EQ(c.n_past(), 40);
  for (int l = 0; l < kL; l++)
    for (int h = 0; h < kH; h++) {
      EXPECT_EQ(c.length(l, h), 40);
      EXPECT_EQ(positions(c, l, h), range(0, 40));
      EXPECT_EQ(c.n_pages(l, h), pages_for(40));
    }
  expect_contents_match_positions(c);
  // Page access agrees with the entry accessors.
  EXPECT_EQ(c.page_positions(1, 2, 1)[3], 16 + 3);
  EXPECT_EQ(c.page_keys(1, 2, 1) + 3 * kD, c.key_at(1, 2, 19));
}

TEST(KvCache, EvictCompactsAndKeepsOrder) {
  KvCache c(kL, kH, kD);
  append_tokens(c, 0, 40);
  std::vector<uint8_t> drop(40, 0);
  std::vector<int32_t> expect;
  for (int32_t i = 0; i < 40; i++) {
    drop[(size_t)i] = (i % 3 == 0) || (i >= 10 && i < 20);
    if (!drop[(size_t)i]) expect.push_back(i);
  }
  EXPECT_EQ(c.evict(1, 2, drop), 40 - (int64_t)expect.size());
  EXPECT_EQ(positions(c, 1, 2), expect);
  EXPECT_EQ(c.length(1, 2), (int64_t)expect.size());
  // Other streams untouched.
  EXPECT_EQ(positions(c, 1, 1), range(0, 40));
  EXPECT_EQ(positions(c, 0, 2), range(0, 40));
  expect_contents_match_positions(c);
  // Appending after an eviction continues the stream in order.
  append_tokens(c, 40, 45);
  expect.insert(expect.end(), {40, 41, 42, 43, 44});
  EXPECT_EQ(positions(c, 1, 2), expect);
  expect_contents_match_positions(c);
}

TEST(KvCache, EvictFreesPagesAndResidentBytesTrackKeptEntries) {
  KvCache c(kL, kH, kD);
  append_tokens(c, 0, 50);
  const int64_t streams = kL * kH;
  EXPECT_EQ(c.bytes_resident(), streams * pages_for(50) * c.page_bytes());
  EXPECT_EQ(c.bytes_full(), c.bytes_resident());
  EXPECT_EQ(c.entries_kept(), streams * 50);

  // Keep 10 entries of stream (0, 0): 4 pages -> 1 page.
  std::vector<uint8_t> drop(50, 1);
  for (int i = 0; i < 50; i += 5) drop[(size_t)i] = 0;
  EXPECT_EQ(c.evict(0, 0, drop), 40);
  EXPECT_EQ(c.n_pages(0, 0), 1);
  EXPECT_EQ(c.bytes_resident(), ((streams - 1) * pages_for(50) + 1) * c.page_bytes());
  EXPECT_EQ(c.bytes_full(), streams * pages_for(50) * c.page_bytes());
  EXPECT_EQ(c.entries_kept(), streams * 50 - 40);
  EXPECT_EQ(c.entries_kept(0), kH * 50 - 40);
  EXPECT_EQ(c.entries_kept(1), kH * 50);

  // Evicting a whole stream frees all its pages; they wait in the pool until released.
  std::vector<uint8_t> all(50, 1);
  EXPECT_EQ(c.evict(1, 1, all), 50);
  EXPECT_EQ(c.length(1, 1), 0);
  EXPECT_EQ(c.n_pages(1, 1), 0);
  const int64_t live_pages = (streams - 2) * pages_for(50) + 1;
  EXPECT_EQ(c.bytes_resident(), live_pages * c.page_bytes());
  EXPECT_GT(c.bytes_allocated(), c.bytes_resident());
  c.release_pool();
  EXPECT_EQ(c.bytes_allocated(), c.bytes_resident());
  expect_contents_match_positions(c);
}

TEST(KvCache, EvictedFractionIsMeanOverLayersOfEvictedOverHeadsTimesLength) {
  KvCache c(kL, kH, kD);
  EXPECT_EQ(c.evicted_fraction(), 0.0);
  append_tokens(c, 0, 20);
  EXPECT_EQ(c.evicted_fraction(), 0.0);
  std::vector<uint8_t> drop(20, 0);
  for (int i = 0; i < 6; i++) drop[(size_t)i] = 1;
  c.evict(0, 0, drop);  // layer 0: 6 of 60 gone
  c.evict(0, 2, drop);  // layer 0: 12 of 60 gone
  EXPECT_DOUBLE_EQ(c.evicted_fraction(), (12.0 / 60.0 + 0.0) / 2.0);
  // More tokens: the denominator is the sequence length, evicted entries included.
  append_tokens(c, 20, 30);
  EXPECT_DOUBLE_EQ(c.evicted_fraction(), (12.0 / 90.0) / 2.0);
}

TEST(KvCache, TruncateRemovesLaterPositionsInEveryStream) {
  KvCache c(kL, kH, kD);
  append_tokens(c, 0, 30);
  // Streams hold different kept sets before the truncate.
  std::vector<uint8_t> drop(30, 0);
  for (int i = 20; i < 26; i++) drop[(size_t)i] = 1;
  c.evict(0, 1, drop);  // positions 20..25 gone in (0, 1)
  std::vector<uint8_t> drop2(30, 0);
  for (int i = 0; i < 30; i += 2) drop2[(size_t)i] = 1;
  c.evict(1, 0, drop2);  // only odd positions in (1, 0)

  c.truncate(22);
  EXPECT_EQ(c.n_past(), 22);
  EXPECT_EQ(positions(c, 0, 0), range(0, 22));
  EXPECT_EQ(positions(c, 0, 1), range(0, 20));
  std::vector<int32_t> odd;
  for (int32_t i = 1; i < 22; i += 2) odd.push_back(i);
  EXPECT_EQ(positions(c, 1, 0), odd);
  EXPECT_EQ(c.n_pages(0, 0), pages_for(22));
  expect_contents_match_positions(c);

  // The sequence continues at the truncated position.
  append_tokens(c, 22, 25);
  EXPECT_EQ(positions(c, 0, 0), range(0, 25));
  EXPECT_EQ(c.n_past(), 25);
  expect_contents_match_positions(c);

  c.clear();
  EXPECT_EQ(c.n_past(), 0);
  EXPECT_EQ(c.entries_kept(), 0);
  EXPECT_EQ(c.bytes_resident(), 0);
}

TEST(KvCache, ShortEvictionMaskIsRejected) {
  KvCache c(kL, kH, kD);
  append_tokens(c, 0, 10);
  std::vector<uint8_t> drop(9, 0);
  EXPECT_THROW(c.evict(0, 0, drop), kvzap::Error);
  EXPECT_EQ(c.length(0, 0), 10);
}

}  // namespace
