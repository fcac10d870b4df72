// The paged attention kernel against a double-precision scalar reference, over ragged causal rows.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cache/kv_cache.h"
#include "kernels/matmul.h"
#include "model/attention.h"

namespace kvzap {
namespace {

void check_attention(int head_dim, int64_t n_entries, int rows, bool f16_probs = false) {
  KvCache cache(1, 2, head_dim);
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
  std::vector<float> scores((size_t)rows * n_entries), page((size_t)KvCache::kPageTokens * head_dim);
  AttentionBlock b{q.data(), head_dim, rows, visible.data(), out.data(), head_dim, f16_probs};
  attend(b, cache, 0, 1, scores.data(), page.data());
  AttentionBlock br{q.data(), head_dim, rows, visible.data(), ref.data(), head_dim, f16_probs};
  attend_reference(br, cache, 0, 1);
  for (size_t i = 0; i < out.size(); i++) ASSERT_NEAR(out[i], ref[i], 2e-5f + 2e-5f * std::fabs(ref[i])) << "at " << i;
}

TEST(Attention, MatchesReferenceHead64) { check_attention(64, 200, 9); }
TEST(Attention, MatchesReferenceWithF16Probabilities) { check_attention(64, 300, 6, true); }
TEST(Attention, MatchesReferenceHead128PartialPage) { check_attention(128, 37, 5); }
TEST(Attention, SingleEntry) { check_attention(64, 1, 1); }

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
  }
  set_active_isa(before);
}

TEST(Attention, AfterEvictionSeesOnlyKeptEntries) {
  // Evicting entries must change the result exactly as if they had never been appended.
  const int D = 64;
  KvCache a(1, 1, D), b(1, 1, D);
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
  std::vector<float> q(D), oa(D), ob(D), scores(100), page(KvCache::kPageTokens * D);
  for (auto& x : q) x = nd(rng) * 0.2f;
  int64_t vis = a.length(0, 0);
  attend({q.data(), D, 1, &vis, oa.data(), D}, a, 0, 0, scores.data(), page.data());
  attend({q.data(), D, 1, &vis, ob.data(), D}, b, 0, 0, scores.data(), page.data());
  for (int i = 0; i < D; i++) EXPECT_EQ(oa[i], ob[i]);
}

}  // namespace
}  // namespace kvzap
