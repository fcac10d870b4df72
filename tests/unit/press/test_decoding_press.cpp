// decoding_<press> (issue 38, kvpress DecodingPress(base_press, compression_interval, target_size)): nothing
// evicted while the context is prefilled; every compression_interval decoding steps of a layer each head keeps
// exactly target_size entries, the ones the base press's own ratio selection keeps at the ratio kvpress
// computes for that target (a scalar reference below); the pages are freed; a fork keeps the press and its
// step counter. Checked on a bare cache with distinct scores, then on the default model with knorm.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/session.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "press/policy.h"
#include "press/press.h"
#include "press/press_spec.h"
#include "press/best_by_log.h"
#include "test_support.h"
#include "press/scramble_scorer.h"

namespace kvzap {
namespace {

using nlohmann::json;

using test::ScrambleScorer;

// The context protocol without an engine: the press asks nothing of it.
class NoRunner : public ContextRunner {
 public:
  ThreadPool& threads() override { throw Error("unused"); }
  int64_t n_ctx() const override { return 1 << 20; }
  int64_t max_step_tokens() const override { return 1 << 20; }
  void run_on_scratch_fork(const KvCache&, const int32_t*, int64_t, LayerObserver&) override { throw Error("unused"); }
};

constexpr int kLayers = 3, kHeads = 2, kDim = 4;

// kvpress DecodingPress._find_target_compression_ratio, scalar: the ratio r with int(T (1 - r)) == target.
double kvpress_target_ratio(int64_t T, int64_t target) {
  if (T <= target) return 0;
  double ratio = 1.0 - (double)target / (double)T, low = 0, high = 1;
  for (int it = 0; it < 20; it++) {
    const int64_t n_kept = (int64_t)((double)T * (1 - ratio));
    if (n_kept == target) break;
    if (n_kept > target) {
      low = ratio;
      ratio = (ratio + high) / 2;
    } else {
      high = ratio;
      ratio = (low + ratio) / 2;
    }
  }
  return ratio;
}

// Appends a step of n tokens at positions first.. to every layer and shows it to the press as the forward
// does (the step's K/V in the cache, then the observer). before: each stream as the press finds it.
void step(Press& press, KvCache& cache, int32_t first, int64_t n, test::KeptSet* before = nullptr) {
  std::vector<float> kv((size_t)(n * kHeads * kDim), 0.5f);
  std::vector<int32_t> pos((size_t)n);
  std::iota(pos.begin(), pos.end(), first);
  if (before) before->clear();
  for (int l = 0; l < kLayers; l++) {
    cache.append_layer(l, n, kv.data(), kv.data(), pos.data());
    if (before) {
      const test::KeptSet all = test::kept_positions(cache);
      before->insert(before->end(), all.begin() + l * kHeads, all.begin() + (l + 1) * kHeads);
    }
    LayerStep st;
    st.layer = l;
    st.n_tok = n;
    st.pos = pos.data();
    st.k = st.v = kv.data();
    press.after_attention(st, cache);
  }
  cache.set_n_past(first + n);
}

// What the base press's own ratio selection (the ratio policy, per head) keeps of streams holding `before`
// at kvpress's ratio for `target`.
test::KeptSet reference(const test::KeptSet& before, int64_t target) {
  KvCache ref(kLayers, kHeads, kDim);
  CacheScores scores(kLayers, std::vector<std::vector<float>>(kHeads));
  const float z[kDim] = {};
  for (int l = 0; l < kLayers; l++)
    for (int h = 0; h < kHeads; h++)
      for (int32_t p : before[(size_t)l * kHeads + h]) {
        ref.append(l, h, z, z, p);
        scores[(size_t)l][(size_t)h].push_back(ScrambleScorer::score(l, h, p));
      }
  const int64_t T = (int64_t)before[0].size();
  evict_lowest(ref, scores, kvpress_target_ratio(T, target), RatioScope::Head);
  return test::kept_positions(ref);
}

struct Fixture {
  NoRunner runner;
  KvCache cache{kLayers, kHeads, kDim};
  std::vector<int32_t> ids;
  std::string question;
  std::unique_ptr<Press> press;
  Fixture(int64_t interval, int64_t target, int64_t context, double target_ratio = -1) {
    PressSpec o;
    o.name = "decoding_test";
    press = make_decoding_press(std::make_unique<ScrambleScorer>(), o, interval, target, target_ratio);
    press->begin_context(runner);
    step(*press, cache, 0, context);
    ContextView view{cache, runner, ids, question};
    press->end_context(view);
  }
};

TEST(DecodingPress, PrefillEvictsNothingThenEachIntervalCutsToTheTarget) {
  constexpr int64_t kInterval = 8, kTarget = 20, kContext = 50;
  Fixture f(kInterval, kTarget, kContext);
  EXPECT_TRUE(f.press->prunes_decoding());
  EXPECT_EQ(f.press->context_eviction_interval(), 0);
  for (const auto& s : test::kept_positions(f.cache)) EXPECT_EQ((int64_t)s.size(), kContext);  // prefill: whole
  const int64_t full_bytes = f.cache.bytes_resident();
  int32_t pos = kContext;
  for (int i = 1; i < kInterval; i++) step(*f.press, f.cache, pos++, 1);
  for (const auto& s : test::kept_positions(f.cache)) EXPECT_EQ((int64_t)s.size(), kContext + kInterval - 1);
  // The interval's last step: every (layer, head) keeps exactly the target, the ratio selection's set.
  test::KeptSet before;
  step(*f.press, f.cache, pos++, 1, &before);
  const test::KeptSet kept = test::kept_positions(f.cache);
  for (const auto& s : kept) EXPECT_EQ((int64_t)s.size(), kTarget);
  EXPECT_EQ((int64_t)before[0].size(), kContext + kInterval);
  EXPECT_EQ(kept, reference(before, kTarget));
  EXPECT_LE(f.cache.bytes_resident(), full_bytes / 2);  // the pages are freed (4 pages of 16 entries down to 2), not masked
  // The next interval judges the kept entries plus the new ones.
  for (int i = 1; i < kInterval; i++) step(*f.press, f.cache, pos++, 1);
  for (const auto& s : test::kept_positions(f.cache)) EXPECT_EQ((int64_t)s.size(), kTarget + kInterval - 1);
  step(*f.press, f.cache, pos++, 1, &before);
  EXPECT_EQ(test::kept_positions(f.cache), reference(before, kTarget));
  for (const auto& s : test::kept_positions(f.cache)) EXPECT_EQ((int64_t)s.size(), kTarget);
}

TEST(DecodingPress, AContextShorterThanTheTargetStaysWhole) {
  Fixture f(4, 100, 30);
  for (int i = 0; i < 12; i++) step(*f.press, f.cache, 30 + i, 1);
  for (const auto& s : test::kept_positions(f.cache)) EXPECT_EQ(s.size(), 42u);
}

TEST(DecodingPress, AStepOfTargetSizeTokensCompressesAtOnce) {
  // kvpress compresses on any step with q_len >= target_size (a long question), whatever the counter.
  Fixture f(512, 20, 50);
  test::KeptSet before;
  step(*f.press, f.cache, 50, 20, &before);
  EXPECT_EQ(test::kept_positions(f.cache), reference(before, 20));
  step(*f.press, f.cache, 70, 19);  // shorter: counted, not compressed
  for (const auto& s : test::kept_positions(f.cache)) EXPECT_EQ(s.size(), 39u);
}

TEST(DecodingPress, AForkKeepsThePressAndItsStepCounter) {
  constexpr int64_t kInterval = 8, kTarget = 20;
  Fixture f(kInterval, kTarget, 50);
  for (int i = 0; i < 5; i++) step(*f.press, f.cache, 50 + i, 1);
  std::unique_ptr<Press> copy = f.press->clone();
  KvCache fork(kLayers, kHeads, kDim);
  for (int l = 0; l < kLayers; l++)
    for (int h = 0; h < kHeads; h++)
      for (int64_t i = 0; i < f.cache.length(l, h); i++) {
        std::vector<float> k(kDim), v(kDim);
        f.cache.key_row(l, h, i, k.data());
        f.cache.value_row(l, h, i, v.data());
        fork.append(l, h, k.data(), v.data(), f.cache.position_at(l, h, i));
      }
  fork.set_n_past(f.cache.n_past());
  // Three more steps end the interval on both: the copy counted the five before the fork.
  for (int i = 5; i < 7; i++) {
    step(*f.press, f.cache, 50 + i, 1);
    step(*copy, fork, 50 + i, 1);
  }
  for (const auto& s : test::kept_positions(fork)) EXPECT_EQ(s.size(), 57u);
  step(*f.press, f.cache, 57, 1);
  step(*copy, fork, 57, 1);
  for (const auto& s : test::kept_positions(fork)) EXPECT_EQ((int64_t)s.size(), kTarget);
  EXPECT_EQ(test::kept_positions(fork), test::kept_positions(f.cache));
}

TEST(DecodingPress, CompressionRatioTargetFollowsTheTokensSeen) {
  // kvpress CompressionRatioDecodingPress: target max(1, int(P (1 - ratio))), P = last position + 1.
  Fixture f(8, 0, 50, 0.5);
  for (int i = 0; i < 7; i++) step(*f.press, f.cache, 50 + i, 1);
  for (const auto& s : test::kept_positions(f.cache)) EXPECT_EQ(s.size(), 57u);
  test::KeptSet before;
  step(*f.press, f.cache, 57, 1, &before);
  for (const auto& s : test::kept_positions(f.cache)) EXPECT_EQ(s.size(), 29u);  // int(58 * 0.5)
  EXPECT_EQ(test::kept_positions(f.cache), reference(before, 29));
  for (int i = 0; i < 8; i++) step(*f.press, f.cache, 58 + i, 1, &before);
  EXPECT_EQ(test::kept_positions(f.cache), reference(before, 33));  // int(66 * 0.5) of 29 + 8
  for (const auto& s : test::kept_positions(f.cache)) EXPECT_EQ(s.size(), 33u);
  const PressSpec d = press_spec_from_json({{"press", "compression_ratio_decoding_knorm"}});
  EXPECT_EQ(press_param(d, "target_compression_ratio"), 0.5);
  EXPECT_EQ(press_param(d, "compression_interval"), 512);
  EXPECT_THROW(press_spec_from_json({{"press", "compression_ratio_decoding_knorm"}, {"target_size", 8}}), Error);
  EXPECT_THROW(press_spec_from_json({{"press", "decoding_knorm"}, {"target_compression_ratio", 0.5}}), Error);
  EXPECT_EQ(find_kvpress_gap("CompressionRatioDecodingPress"), nullptr);
  PressSpec bad;
  bad.name = "compression_ratio_decoding_test";
  EXPECT_THROW(make_decoding_press(std::make_unique<ScrambleScorer>(), bad, 8, 0, 1.0), Error);
}

TEST(DecodingPress, SpecsAndRefusals) {
  const PressSpec d = press_spec_from_json({{"press", "decoding_knorm"}});
  EXPECT_EQ(press_param(d, "compression_interval"), 512);
  EXPECT_EQ(press_param(d, "target_size"), 2048);
  EXPECT_TRUE(judges_whole_contexts(d));  // the server leaves prefill_evict_every at 0
  EXPECT_EQ(find_press_entry("decoding_knorm"), find_press_entry("knorm"));
  EXPECT_EQ(decoding_inner("decoding_knorm"), "knorm");
  EXPECT_EQ(decoding_inner("knorm"), "");
  EXPECT_EQ(find_press_entry("decoding_nope"), nullptr);
  EXPECT_EQ(find_press_entry("decoding_adakv_knorm"), nullptr);
  EXPECT_EQ(find_kvpress_gap("DecodingPress"), nullptr);
  EXPECT_FALSE(press_traits("decoding_knorm").kvpress_parity.empty());
  const PressSpec s = press_spec_from_json({{"press", "decoding_knorm"}, {"compression_interval", 16}, {"target_size", 64}});
  EXPECT_EQ(press_param(s, "compression_interval"), 16);
  EXPECT_EQ(press_param(s, "target_size"), 64);
  // The target sets the ratio: neither a ratio nor a threshold; integer parameters >= 1.
  EXPECT_THROW(press_spec_from_json({{"press", "decoding_knorm"}, {"ratio", 0.5}}), Error);
  EXPECT_THROW(press_spec_from_json({{"press", "decoding_knorm"}, {"threshold", -3}}), Error);
  EXPECT_THROW(press_spec_from_json({{"press", "decoding_knorm"}, {"target_size", 0}}), Error);
  EXPECT_THROW(press_spec_from_json({{"press", "decoding_knorm"}, {"compression_interval", 0}}), Error);
  EXPECT_THROW(press_spec_from_json({{"press", "decoding_knorm"}, {"compression_interval", 1.5}}), Error);
  EXPECT_THROW(press_spec_from_json({{"press", "knorm"}, {"target_size", 8}}), Error);  // not the plain press's
  PressSpec bad;
  bad.name = "decoding_knorm";
  EXPECT_THROW(make_decoding_press(std::make_unique<ScrambleScorer>(), bad, 0, 8), Error);
  EXPECT_THROW(make_decoding_press(std::make_unique<ScrambleScorer>(), bad, 8, 0), Error);
}

class DecodingPressModel : public test::DefaultModelTest {
 protected:
  static std::vector<int32_t> context_ids(int64_t n) {
    std::string text;
    for (int i = 0; text.size() < 3000; i++)
      text += "The harbour master counted " + std::to_string(3 * i + 7) + " boats at dawn; the north pier held the "
              "blue trawlers and the fog lifted by nine. Entry " + std::to_string(i) + " is closed. ";
    std::vector<int32_t> ids = model_->tokenizer().encode(text, true);
    ids.resize((size_t)n);
    return ids;
  }
  std::string error_of(const json& spec) {
    try {
      make_press(press_spec_from_json(spec), *model_);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

using test::best_by_log;

TEST_F(DecodingPressModel, KnormCutsEveryHeadToTheTargetWhileDecodingAndFreesPages) {
  constexpr int64_t kT = 200, kInterval = 8, kTarget = 100;
  SessionOptions so;
  so.n_threads = 2;
  so.n_ctx = 512;
  Session s(*model_, so);
  auto press = make_press(press_spec_from_json({{"press", "decoding_knorm"}, {"compression_interval", kInterval},
                                                {"target_size", kTarget}}), *model_);
  EXPECT_NE(press->name().find("decoding_knorm (every 8 decoding steps to 100 tokens)"), std::string::npos) << press->name();
  press->keep_scores(true);
  s.prefill_context(context_ids(kT), press.get());
  for (const auto& st : test::kept_positions(s.cache())) ASSERT_EQ((int64_t)st.size(), kT);  // prefill: nothing evicted
  const int64_t full_bytes = s.cache().bytes_resident();
  const std::vector<int32_t> gen = context_ids(2 * kInterval);  // fed one token per step, as decoding does
  for (int i = 0; i < kInterval - 1; i++) s.feed({gen[(size_t)i]});
  const test::KeptSet before_first = test::kept_positions(s.cache());
  for (const auto& st : before_first) ASSERT_EQ((int64_t)st.size(), kT + kInterval - 1);
  s.feed({gen[(size_t)kInterval - 1]});
  // The stream held every position up to the new token's when it was cut.
  test::KeptSet judged = before_first;
  for (auto& st : judged) st.push_back((int32_t)(kT + kInterval - 1));
  const test::KeptSet kept = test::kept_positions(s.cache());
  for (const auto& st : kept) EXPECT_EQ((int64_t)st.size(), kTarget);
  EXPECT_EQ(kept, best_by_log(judged, *press->score_log(), kTarget));
  EXPECT_LT(s.cache().bytes_resident(), full_bytes * 2 / 3);
  // The next interval: the kept entries plus the new ones.
  for (int i = kInterval; i < 2 * kInterval; i++) s.feed({gen[(size_t)i]});
  judged = kept;
  for (auto& st : judged)
    for (int32_t p = kT + kInterval; p < kT + 2 * kInterval; p++) st.push_back(p);
  EXPECT_EQ(test::kept_positions(s.cache()), best_by_log(judged, *press->score_log(), kTarget));
}

TEST_F(DecodingPressModel, ASequenceForkKeepsThePressAndItsCounter) {
  constexpr int64_t kT = 150, kInterval = 8, kTarget = 60;
  SessionOptions so;
  so.n_threads = 2;
  so.n_ctx = 512;
  Session s(*model_, so);
  auto press = make_press(press_spec_from_json({{"press", "decoding_knorm"}, {"compression_interval", kInterval},
                                                {"target_size", kTarget}}), *model_);
  s.prefill_context(context_ids(kT), press.get());
  const std::vector<int32_t> gen = context_ids(kInterval);
  for (int i = 0; i < 5; i++) s.feed({gen[(size_t)i]});
  std::unique_ptr<Sequence> fork = s.sequence().fork();
  ASSERT_NE(fork->press(), nullptr);
  for (int i = 5; i < kInterval; i++) {
    // Both in one batched step, as the server runs its requests.
    Segment seg[2] = {{&s.sequence(), &gen[(size_t)i], 1}, {fork.get(), &gen[(size_t)i], 1}};
    s.engine().step(seg);
    ASSERT_EQ(seg[0].status, SegmentStatus::Ok);
    ASSERT_EQ(seg[1].status, SegmentStatus::Ok);
  }
  // Both ended the interval on the same step: the copy counted the five steps before the fork.
  for (const auto& st : test::kept_positions(fork->cache())) EXPECT_EQ((int64_t)st.size(), kTarget);
  EXPECT_EQ(test::kept_positions(fork->cache()), test::kept_positions(s.cache()));
}

TEST_F(DecodingPressModel, ContextScorersAndOtherPoliciesAreRefused) {
  EXPECT_NE(error_of({{"press", "decoding_snapkv"}}).find("token by token"), std::string::npos)
      << error_of({{"press", "decoding_snapkv"}});
  EXPECT_NE(error_of({{"press", "decoding_nope"}}).find("decoding_<press>"), std::string::npos);
  EXPECT_NE(error_of({{"press", "decoding_knorm"}, {"prefill_evict_every", 64}}).find("prefill_evict_every"),
            std::string::npos);
  EXPECT_EQ(error_of({{"press", "decoding_knorm"}, {"decoding", true}}), "");  // it prunes while decoding anyway
  EXPECT_TRUE(make_press(press_spec_from_json({{"press", "decoding_knorm"}}), *model_)->prunes_decoding());
}

}  // namespace
}  // namespace kvzap
