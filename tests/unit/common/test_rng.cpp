// common/rng.h: the one RNG module. Its streams are fixed by their algorithms (not by a standard
// library), checked against published reference values, and its normal draws have the right moments.
#include <gtest/gtest.h>

#include <cmath>

#include "common/rng.h"

namespace kvzap {
namespace {

TEST(Rng, SplitMix64MatchesTheReferenceStream) {
  // Vigna's splitmix64.c from state 0: the first three outputs.
  SplitMix64 g(0);
  EXPECT_EQ(g.next(), 0xe220a8397b1dcdafull);
  EXPECT_EQ(g.next(), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(g.next(), 0x06c45d188009454full);
  uint64_t s = 0;
  EXPECT_EQ(splitmix64_next(s), 0xe220a8397b1dcdafull);
  EXPECT_EQ(mix64(0), 0xe220a8397b1dcdafull);
}

TEST(Rng, StandardNormalHasUnitMomentsAndIsFinite) {
  Rng r(7);
  double sum = 0, sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; i++) {
    const double x = standard_normal(r);
    ASSERT_TRUE(std::isfinite(x));
    sum += x, sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0, 0.02);
  Rng a(11), b(11);
  for (int i = 0; i < 10; i++) EXPECT_EQ(standard_normal(a), standard_normal(b));
}

}  // namespace
}  // namespace kvzap
