// Sampler: greedy, seeded determinism, the draw frequencies against softmax(logits / T), and the
// top-k / top-p / min-p filters (applied at temperature 1, before the temperature, as llama.cpp does).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/sampler.h"

namespace {

using kvzap::Sampler;
using kvzap::SamplerOptions;

SamplerOptions unfiltered(float temperature, uint64_t seed = 1) {
  SamplerOptions o;
  o.temperature = temperature;
  o.top_k = 0;
  o.top_p = 1.0f;
  o.min_p = 0.0f;
  o.seed = seed;
  return o;
}

// Logits whose softmax at temperature 1 is exactly `probs`.
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back((float)std::log(p));
  return l;
}

std::vector<double> frequencies(Sampler& s, const std::vector<float>& logits, int draws) {
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < draws; i++) f[s.sample(logits.data())] += 1.0 / draws;
  return f;
}

TEST(Sampler, GreedyIsTheArgmaxAndTiesGoToTheLowestId) {
  const std::vector<float> l = {0.1f, 2.0f, -1.0f, 2.0f};
  Sampler s(unfiltered(0.0f), (int)l.size());
  for (int i = 0; i < 5; i++) EXPECT_EQ(s.sample(l.data()), 1);
  EXPECT_EQ(Sampler::argmax(l.data(), 4), 1);
  SamplerOptions top1 = unfiltered(1.5f);
  top1.top_k = 1;
  Sampler k1(top1, 4);
  for (int i = 0; i < 50; i++) EXPECT_EQ(k1.sample(l.data()), 1);
}

TEST(Sampler, TheSameSeedGivesTheSameDrawsAndAnotherSeedOthers) {
  const std::vector<float> l(64, 0.0f);  // uniform over 64 ids
  Sampler a(unfiltered(1.0f, 7), 64), b(unfiltered(1.0f, 7), 64), c(unfiltered(1.0f, 8), 64);
  int same_ab = 0, same_ac = 0;
  for (int i = 0; i < 200; i++) {
    const int32_t x = a.sample(l.data()), y = b.sample(l.data()), z = c.sample(l.data());
    same_ab += x == y;
    same_ac += x == z;
  }
  EXPECT_EQ(same_ab, 200);
  EXPECT_LT(same_ac, 20);  // 1/64 chance per draw: about 3 expected
}

TEST(Sampler, DrawsFollowSoftmaxAtTheTemperature) {
  const std::vector<double> probs = {0.5, 0.25, 0.15, 0.1};
  const std::vector<float> l = logits_of(probs);
  for (float t : {1.0f, 0.5f, 2.0f}) {
    Sampler s(unfiltered(t, 3), 4);
    const std::vector<double> f = frequencies(s, l, 40000);
    double z = 0;
    for (double p : probs) z += std::pow(p, 1.0 / t);
    for (size_t i = 0; i < probs.size(); i++) {
      const double want = std::pow(probs[i], 1.0 / t) / z;
      // 40,000 draws: the standard error is at most 0.0025; allow four of them.
      EXPECT_NEAR(f[i], want, 0.01) << "T " << t << " id " << i;
    }
  }
}

TEST(Sampler, TopKKeepsTheKMostLikely) {
  const std::vector<float> l = logits_of({0.4, 0.3, 0.2, 0.1});
  SamplerOptions o = unfiltered(1.0f, 5);
  o.top_k = 2;
  Sampler s(o, 4);
  const std::vector<double> f = frequencies(s, l, 20000);
  EXPECT_EQ(f[2] + f[3], 0.0);
  EXPECT_NEAR(f[0], 0.4 / 0.7, 0.02);
}

TEST(Sampler, TopPKeepsTheSmallestPrefixReachingP) {
  // Cumulative 0.5, 0.8, 0.95, 1.0: top_p 0.75 keeps two ids, top_p 0.85 three.
  const std::vector<float> l = logits_of({0.5, 0.3, 0.15, 0.05});
  for (auto [p, kept] : {std::pair{0.75f, 2}, std::pair{0.85f, 3}}) {
    SamplerOptions o = unfiltered(1.0f, 9);
    o.top_p = p;
    Sampler s(o, 4);
    const std::vector<double> f = frequencies(s, l, 20000);
    for (int i = 0; i < 4; i++) {
      if (i < kept) EXPECT_GT(f[i], 0.0) << "top_p " << p << " id " << i;
      else EXPECT_EQ(f[i], 0.0) << "top_p " << p << " id " << i;
    }
  }
}

TEST(Sampler, MinPIsJudgedAtTemperatureOneBeforeTheTemperature) {
  // min_p 0.35 keeps ids with p >= 0.175 at T = 1: ids 0 and 1. A high temperature flattens what is
  // kept but must not bring ids 2 and 3 back.
  const std::vector<float> l = logits_of({0.5, 0.3, 0.15, 0.05});
  for (float t : {1.0f, 5.0f}) {
    SamplerOptions o = unfiltered(t, 11);
    o.min_p = 0.35f;
    Sampler s(o, 4);
    const std::vector<double> f = frequencies(s, l, 20000);
    EXPECT_EQ(f[2] + f[3], 0.0) << "T " << t;
    EXPECT_GT(f[1], 0.0) << "T " << t;
  }
}

TEST(Sampler, FiltersAlwaysLeaveAtLeastOneId) {
  const std::vector<float> l = logits_of({0.9, 0.05, 0.05});
  SamplerOptions o = unfiltered(1.0f, 13);
  o.top_p = 0.01f;
  o.min_p = 1.0f;
  Sampler s(o, 3);
  for (int i = 0; i < 100; i++) EXPECT_EQ(s.sample(l.data()), 0);
}

}  // namespace
