// The paged attention kernel against a double-precision scalar reference, over ragged causal rows, for
// f16, f32, q8_0 and q4_0 pages (the reference reads quantised rows through key_row / value_row, which
// dequantise them: the kernels must compute attention over exactly those values).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "cache/kv_cache.h"
#include "kernels/matmul.h"
#include "model/attention.h"
#include "test_support.h"

namespace kvzap {
namespace {

void check_attention(int head_dim, int64_t n_entries, int rows, bool f16_probs = false, KvType type = KvType::F16) {
  KvCache cache(1, 2, head_dim, nullptr, type);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(head_dim), v(head_dim);
  for (int64_t i = 0; i < n_entries; i++) {
    for (int h = 0; h < 2; h++) {
      for (auto& x : k) x = nd(rng);
      for (auto& x : v) x = nd(rng);
      cache.append(0, h, k.data(), v.data(), (int32_t)i);
    }
  }
  std::vector<float> q((size_t)rows * head_dim);
  for (auto& x : q) x = nd(rng) * 0.3f;
  std::vector<int64_t> visible(rows);
  for (int r = 0; r < rows; r++) visible[r] = std::max<int64_t>(1, n_entries - (rows - 1 - r) * 3);
  std::vector<float> out((size_t)rows * head_dim), ref((size_t)rows * head_dim);
  std::vector<float> scores((size_t)rows * n_entries), page((size_t)KvCache::kPageTokens * head_dim),
      partial((size_t)rows * head_dim);
  AttentionBlock b{q.data(), head_dim, rows, visible.data(), out.data(), head_dim, f16_probs};
  attend(b, cache, 0, 1, scores.data(), page.data(), partial.data());
  AttentionBlock br{q.data(), head_dim, rows, visible.data(), ref.data(), head_dim, f16_probs};
  attend_reference(br, cache, 0, 1);
  for (size_t i = 0; i < out.size(); i++) ASSERT_NEAR(out[i], ref[i], 2e-5f + 2e-5f * std::fabs(ref[i])) << "at " << i;
}

// An f32 cache holds the keys and values unrounded: attention over it agrees with a double-precision
// computation from the f32 inputs themselves, where an f16 cache is off by the f16 rounding.
double f32_cache_error(KvType type) {
  const int D = 64, n = 150;
  KvCache cache(1, 1, D, nullptr, type);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> keys((size_t)n * D), values((size_t)n * D), q(D);
  for (auto& x : keys) x = nd(rng);
  for (auto& x : values) x = nd(rng);
  for (auto& x : q) x = nd(rng) * 0.4f;
  for (int i = 0; i < n; i++) cache.append(0, 0, &keys[(size_t)i * D], &values[(size_t)i * D], i);
  std::vector<double> s(n), o(D, 0.0);
  double mx = -1e300, sum = 0;
  for (int j = 0; j < n; j++) {
    double acc = 0;
    for (int i = 0; i < D; i++) acc += (double)q[i] * keys[(size_t)j * D + i];
    mx = std::max(mx, s[j] = acc);
  }
  for (int j = 0; j < n; j++) sum += (s[j] = std::exp(s[j] - mx));
  for (int j = 0; j < n; j++)
    for (int i = 0; i < D; i++) o[i] += s[j] / sum * values[(size_t)j * D + i];
  std::vector<float> out(D), scores(n), page((size_t)KvCache::kPageTokens * D), partial(D);
  int64_t vis = n;
  attend({q.data(), D, 1, &vis, out.data(), D}, cache, 0, 0, scores.data(), page.data(), partial.data());
  double worst = 0;
  for (int i = 0; i < D; i++) worst = std::max(worst, std::fabs(out[i] - o[i]));
  return worst;
}

TEST(Attention, MatchesReferenceHead64) { check_attention(64, 200, 9); }
TEST(Attention, MatchesReferenceWithF16Probabilities) { check_attention(64, 300, 6, true); }
TEST(Attention, MatchesReferenceHead128PartialPage) { check_attention(128, 37, 5); }
TEST(Attention, SingleEntry) { check_attention(64, 1, 1); }
// Gemma 3's head size: the AVX-512 kernels take the chunks in two groups of 8.
TEST(Attention, MatchesReferenceHead256) {
  check_attention(256, 300, 7);
  check_attention(256, 37, 3, true);
  check_attention(144, 50, 4);  // 9 chunks: a full group and a group of one
  check_attention(256, 200, 5, false, KvType::F32);
}
TEST(Attention, F32PagesMatchReference) {
  check_attention(64, 200, 9, false, KvType::F32);
  check_attention(128, 37, 5, false, KvType::F32);
  check_attention(64, 1, 1, false, KvType::F32);
  check_attention(40, 70, 4, false, KvType::F32);  // a head size the AVX-512 kernels do not take
}
TEST(Attention, F32PagesAreExactWhereF16PagesRound) {
  const double e32 = f32_cache_error(KvType::F32), e16 = f32_cache_error(KvType::F16);
  EXPECT_LT(e32, 2e-6);
  EXPECT_GT(e16, 10 * e32);
}

TEST(Attention, QuantisedPagesMatchReference) {
  for (KvType type : {KvType::Q8_0, KvType::Q4_0}) {
    SCOPED_TRACE(kv_type_name(type));
    check_attention(64, 200, 9, false, type);
    check_attention(128, 37, 5, false, type);   // a partly filled last page
    check_attention(64, 1, 1, false, type);
    check_attention(256, 300, 7, false, type);  // two groups of 8 chunks
    check_attention(96, 70, 4, false, type);    // 6 chunks (NC = 0 in the AVX-512 kernels)
    check_attention(32, 40, 3, false, type);    // one block per row
  }
}

// A quantised cache approximates an f32 computation from the unquantised inputs: q8_0 within ~1e-2 on
// unit-normal data, q4_0 far coarser, f16 closer than either.
TEST(Attention, QuantisedPagesApproximateTheUnquantisedInputs) {
  const double e16 = f32_cache_error(KvType::F16), e8 = f32_cache_error(KvType::Q8_0), e4 = f32_cache_error(KvType::Q4_0);
  EXPECT_LT(e8, 2e-2);
  EXPECT_LT(e4, 4e-1);  // measured 0.26
  EXPECT_GT(e8, e16);
  EXPECT_GT(e4, e8);
}

TEST(Attention, EveryIsaMatchesTheReference) {
  // The AVX-512 kernels and the portable path, chosen by the one ISA switch the matmuls use.
  const Isa before = active_isa();
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (isa > detected_isa()) continue;
    set_active_isa(isa);
    SCOPED_TRACE(isa_name(isa));
    check_attention(64, 200, 9);
    check_attention(64, 300, 6, true);
    check_attention(128, 37, 5);
    check_attention(64, 200, 9, false, KvType::F32);
    check_attention(128, 37, 5, false, KvType::F32);
    check_attention(256, 300, 7);
    check_attention(256, 200, 5, false, KvType::F32);
    EXPECT_LT(f32_cache_error(KvType::F32), 2e-6);
    for (KvType type : {KvType::Q8_0, KvType::Q4_0}) {
      SCOPED_TRACE(kv_type_name(type));
      check_attention(64, 200, 9, false, type);
      check_attention(128, 37, 5, false, type);
      check_attention(256, 300, 7, false, type);
      check_attention(96, 70, 4, false, type);
    }
  }
  set_active_isa(before);
}

void check_eviction(KvType type) {
  // Evicting entries must change the result exactly as if they had never been appended.
  const int D = 64;
  KvCache a(1, 1, D, nullptr, type), b(1, 1, D, nullptr, type);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(D), v(D);
  std::vector<uint8_t> drop;
  for (int i = 0; i < 100; i++) {
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    a.append(0, 0, k.data(), v.data(), i);
    drop.push_back(i % 3 == 0);
    if (i % 3 != 0) b.append(0, 0, k.data(), v.data(), i);
  }
  a.evict(0, 0, drop);
  ASSERT_EQ(a.length(0, 0), b.length(0, 0));
  std::vector<float> q(D), oa(D), ob(D), scores(100), page(KvCache::kPageTokens * D), partial(D);
  for (auto& x : q) x = nd(rng) * 0.2f;
  int64_t vis = a.length(0, 0);
  attend({q.data(), D, 1, &vis, oa.data(), D}, a, 0, 0, scores.data(), page.data(), partial.data());
  attend({q.data(), D, 1, &vis, ob.data(), D}, b, 0, 0, scores.data(), page.data(), partial.data());
  for (int i = 0; i < D; i++) EXPECT_EQ(oa[i], ob[i]);
}

TEST(Attention, AfterEvictionSeesOnlyKeptEntries) { check_eviction(KvType::F16); }
TEST(Attention, AfterEvictionSeesOnlyKeptEntriesF32) { check_eviction(KvType::F32); }
TEST(Attention, AfterEvictionSeesOnlyKeptEntriesQuantised) {
  check_eviction(KvType::Q8_0);
  check_eviction(KvType::Q4_0);
}

// attend() and its pieces run over any split of the pages and chunks (what Forward does on several
// threads) give the same bits: the values are summed per chunk from zero and the chunks in order.
void check_pieces_match_attend(KvType type, int head_dim, bool sliding) {
  const int64_t n = 1100;  // 69 pages, 5 chunks (the last partial)
  const int rows = 7;
  KvCache cache(1, 1, head_dim, nullptr, type);
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(head_dim), v(head_dim);
  for (int64_t i = 0; i < n; i++) {
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    cache.append(0, 0, k.data(), v.data(), (int32_t)i);
  }
  std::vector<float> q((size_t)rows * head_dim);
  for (auto& x : q) x = 0.3f * nd(rng);
  std::vector<int64_t> visible(rows), first(rows);
  for (int r = 0; r < rows; r++) visible[r] = n - (rows - 1 - r) * 37, first[r] = sliding ? 300 + 41 * r : 0;
  std::vector<float> whole((size_t)rows * head_dim), split((size_t)rows * head_dim, -1.0f), ref((size_t)rows * head_dim);
  std::vector<float> scores((size_t)rows * n), page((size_t)KvCache::kPageTokens * head_dim),
      partial((size_t)rows * head_dim);
  AttentionBlock b{q.data(), head_dim, rows, visible.data(), whole.data(), head_dim, type == KvType::F16,
                   sliding ? first.data() : nullptr};
  attend(b, cache, 0, 0, scores.data(), page.data(), partial.data());
  AttentionBlock br = b;
  br.out = ref.data();
  attend_reference(br, cache, 0, 0);
  for (size_t i = 0; i < ref.size(); i++) ASSERT_NEAR(whole[i], ref[i], 3e-5f + 3e-5f * std::fabs(ref[i])) << i;

  AttentionBlock bs = b;
  bs.out = split.data();
  const AttentionExtent e = attention_extent(bs);
  ASSERT_EQ(e.c1 - e.c0, sliding ? 4 : 5);
  std::vector<float> scores2((size_t)rows * n, 0.0f), partials((size_t)(e.c1 - e.c0) * rows * head_dim);
  // Pages in three uneven ranges, run last range first; chunks in two.
  const int pm1 = e.p0 + 5, pm2 = e.p0 + 40;
  attend_scores(bs, cache, 0, 0, e, pm2, e.n_pages, scores2.data(), page.data());
  attend_scores(bs, cache, 0, 0, e, e.p0, pm1, scores2.data(), page.data());
  attend_scores(bs, cache, 0, 0, e, pm1, pm2, scores2.data(), page.data());
  for (int r = rows - 1; r >= 0; r--) attend_softmax(bs, e, r, scores2.data());
  const int cm = e.c0 + 1;
  attend_values(bs, cache, 0, 0, e, cm, e.c1, scores2.data(), partials.data() + (cm - e.c0) * rows * head_dim, page.data());
  attend_values(bs, cache, 0, 0, e, e.c0, cm, scores2.data(), partials.data(), page.data());
  attend_merge(bs, e, head_dim, partials.data());
  for (size_t i = 0; i < whole.size(); i++) ASSERT_EQ(split[i], whole[i]) << i;
}

TEST(Attention, PiecesOverAnySplitGiveTheSameBitsAsOneCall) {
  test::IsaGuard guard;
  for (Isa isa : test::available_isas()) {
    set_active_isa(isa);
    SCOPED_TRACE(isa_name(isa));
    for (KvType type : {KvType::F16, KvType::F32, KvType::Q8_0, KvType::Q4_0})
      for (bool sliding : {false, true}) {
        SCOPED_TRACE(std::string(kv_type_name(type)) + (sliding ? " sliding" : ""));
        check_pieces_match_attend(type, 64, sliding);
        check_pieces_match_attend(type, 256, sliding);
      }
  }
}

}  // namespace
}  // namespace kvzap
