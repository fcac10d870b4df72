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

// F32 caches (--kv-type f32): values that f16 cannot hold come back exactly, through append, eviction
// compaction, copy-on-write forks and the f32 row view; the typed f16 views refuse an f32 cache.
TEST(KvCacheF32, StoresKeysAndValuesExactly) {
  using kvzap::KvType;
  KvCache c(kL, kH, kD, nullptr, KvType::F32);
  EXPECT_EQ(c.kv_type(), KvType::F32);
  EXPECT_EQ(c.row_bytes(), (size_t)kD * 4);
  auto key = [](int l, int h, int32_t p, int d) { return 1.0f + 1e-6f * (float)(p * 7 + d + 31 * h + 97 * l); };
  auto val = [](int l, int h, int32_t p, int d) { return -3.0f - 1e-6f * (float)(p * 5 + d + 17 * h + 89 * l); };
  std::vector<float> k(kD), v(kD), out(kD);
  for (int32_t p = 0; p < 40; p++)
    for (int l = 0; l < kL; l++)
      for (int h = 0; h < kH; h++) {
        for (int d = 0; d < kD; d++) k[d] = key(l, h, p, d), v[d] = val(l, h, p, d);
        c.append(l, h, k.data(), v.data(), p);
      }
  c.set_n_past(40);
  ASSERT_NE(kvzap::fp16_to_fp32(kvzap::fp32_to_fp16(key(0, 0, 3, 1))), key(0, 0, 3, 1));  // f16 would round
  std::vector<uint8_t> drop(40, 0);
  for (int i = 0; i < 40; i += 3) drop[(size_t)i] = 1;
  KvCache fork(kL, kH, kD, &c.pool(), KvType::F32);
  fork.share_from(c);
  c.evict(1, 2, drop);  // compaction copies rows of 4-byte elements (and the shared pages first)
  for (const KvCache* cc : {&c, &fork})
    for (int l = 0; l < kL; l++)
      for (int h = 0; h < kH; h++)
        for (int64_t i = 0; i < cc->length(l, h); i++) {
          const int32_t p = cc->position_at(l, h, i);
          cc->key_row(l, h, i, out.data());
          for (int d = 0; d < kD; d++) {
            ASSERT_EQ(cc->key_at_f32(l, h, i)[d], key(l, h, p, d));
            ASSERT_EQ(cc->value_at_f32(l, h, i)[d], val(l, h, p, d));
            ASSERT_EQ(out[d], key(l, h, p, d));
          }
        }
  EXPECT_EQ(c.length(1, 2), 26);
  EXPECT_EQ(fork.length(1, 2), 40);
  EXPECT_THROW(c.key_at(0, 0, 0), kvzap::Error);
  EXPECT_THROW(c.page_values(0, 0, 0), kvzap::Error);
  KvCache f16(kL, kH, kD);
  append_tokens(f16, 0, 2);
  EXPECT_THROW(f16.key_at_f32(0, 0, 0), kvzap::Error);
  // A cache of the other type cannot take pages from this pool (its pages are a different size).
  EXPECT_THROW((KvCache(kL, kH, kD, &c.pool(), KvType::F16)), kvzap::Error);
}

// Memory accounting: an f32 entry costs twice the key/value bytes of an f16 one, so a page budget holds
// half as many tokens.
TEST(KvCacheF32, PagesCostTwiceTheKeyValueBytesAndABudgetHoldsHalfTheTokens) {
  using kvzap::KvType;
  const int64_t pos_bytes = P * 4;
  EXPECT_EQ(KvCache::page_bytes_for(64, KvType::F32) - pos_bytes, 2 * (KvCache::page_bytes_for(64, KvType::F16) - pos_bytes));
  EXPECT_EQ(KvCache::page_bytes_for(64), KvCache::page_bytes_for(64, KvType::F16));
  EXPECT_EQ(kvzap::parse_kv_type("f32"), KvType::F32);
  EXPECT_EQ(kvzap::parse_kv_type("f16"), KvType::F16);
  EXPECT_THROW(kvzap::parse_kv_type("q8"), kvzap::Error);
  // The same entries: the same number of pages, each page twice the K/V bytes.
  KvCache h(kL, kH, kD), f(kL, kH, kD, nullptr, KvType::F32);
  append_tokens(h, 0, 40);
  append_tokens(f, 0, 40);
  EXPECT_EQ(f.pages_needed(7), h.pages_needed(7));
  EXPECT_EQ(f.bytes_resident() - (int64_t)kL * kH * pages_for(40) * pos_bytes,
            2 * (h.bytes_resident() - (int64_t)kL * kH * pages_for(40) * pos_bytes));
  EXPECT_EQ(f.bytes_full(), f.bytes_resident());
  // A budget of 64 f16 pages of head size 64 fits only ~32 f32 pages.
  const int64_t budget = 64 * KvCache::page_bytes_for(64);
  kvzap::PagePool p16(KvCache::page_bytes_for(64), budget), p32(KvCache::page_bytes_for(64, KvType::F32), budget);
  EXPECT_EQ(p16.pages_available(), 64);
  EXPECT_EQ(p32.pages_available(), budget / KvCache::page_bytes_for(64, KvType::F32));
  EXPECT_LE(2 * p32.pages_available(), 64);
  EXPECT_GE(2 * p32.pages_available(), 62);
  KvCache tight(1, 1, 64, &p32, KvType::F32);
  std::vector<float> k(64, 0.5f);
  const int64_t fits = p32.pages_available() * P;  // tokens of one stream the budget holds
  for (int64_t i = 0; i < fits; i++) tight.append(0, 0, k.data(), k.data(), (int32_t)i);
  EXPECT_THROW(tight.append(0, 0, k.data(), k.data(), 1 << 20), kvzap::KvBudgetExceeded);
}

}  // namespace
