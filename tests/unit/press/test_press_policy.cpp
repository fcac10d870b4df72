// Press policy tests. Most drive the threshold and ratio policies directly: a bare KvCache, steps built
// by hand the way Forward::step hands them out (append the step's K/V, set n_past, call the observer),
// and a fake scorer whose scores are a function of (layer, head, position). The expected kept sets
// are derived from that function, not from the policy code. The last group runs the real model
// through Session: option checks, real eviction, and bit-identical logits for no-op presses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <unistd.h>
#include <vector>

#include "cache/kv_cache.h"
#include "fetch/model_store.h"
#include "engine/session.h"
#include "kvzap/error.h"
#include "model/forward.h"
#include "model/model.h"
#include "press/policy.h"
#include "press/press.h"
#include "press/surrogate.h"

namespace {

using namespace kvzap;
constexpr int kL = 2, kH = 3, kD = 4;
constexpr float kInf = std::numeric_limits<float>::infinity();
using ScoreFn = std::function<float(int layer, int head, int32_t pos)>;

class FakeScorer : public Scorer {
 public:
  explicit FakeScorer(ScoreFn fn) : fn(std::move(fn)) {}
  bool per_step() const override { return true; }
  void score_step(const LayerStep& step, const KvCache& cache, float* out) override {
    calls++;
    for (int h = 0; h < cache.n_head_kv(); h++)
      for (int64_t t = 0; t < step.n_tok; t++) out[(size_t)h * step.n_tok + t] = fn(step.layer, h, step.pos[t]);
  }
  ScoreFn fn;
  int calls = 0;
};

// Runs one step of n tokens through every layer, as Forward::step does.
void step(KvCache& cache, LayerObserver& press, int64_t n) {
  const int32_t pos0 = (int32_t)cache.n_past();
  std::vector<int32_t> pos((size_t)n);
  for (int64_t t = 0; t < n; t++) pos[(size_t)t] = pos0 + (int32_t)t;
  std::vector<float> k((size_t)n * kH * kD), v(k.size()), h((size_t)n * 8, 0.0f);
  for (size_t i = 0; i < k.size(); i++) k[i] = (float)(i % 7), v[i] = -(float)(i % 5);
  for (int l = 0; l < kL; l++) {
    cache.append_layer(l, n, k.data(), v.data(), pos.data());
    cache.set_n_past(pos0 + n);
    LayerStep st;
    st.layer = l;
    st.n_tok = n;
    st.pos = pos.data();
    st.h = h.data();
    st.k = k.data();
    st.v = v.data();
    press.after_attention(st, cache);
  }
  cache.set_n_past(pos0 + n);
}

std::vector<int32_t> kept(const KvCache& c, int l, int h) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < c.length(l, h); i++) p.push_back(c.position_at(l, h, i));
  return p;
}

std::vector<int32_t> range(int32_t a, int32_t b) {
  std::vector<int32_t> r;
  for (int32_t i = a; i < b; i++) r.push_back(i);
  return r;
}

// The threshold rule restated: a position is gone iff it has left the window of the `window` most
// recent judged tokens (pos < judged_end - window) and its score is below the threshold.
std::vector<int32_t> expected_threshold_kept(const ScoreFn& fn, int l, int h, int32_t n_past, int32_t judged_end,
                                             int window, double threshold) {
  std::vector<int32_t> r;
  for (int32_t p = 0; p < n_past; p++)
    if (!(p < judged_end - window && fn(l, h, p) < threshold)) r.push_back(p);
  return r;
}

struct ThresholdSetup {
  FakeScorer* scorer;
  std::unique_ptr<ThresholdPress> press;
};

ThresholdSetup make_threshold(ScoreFn fn, double threshold, int window, bool decoding) {
  auto s = std::make_unique<FakeScorer>(std::move(fn));
  FakeScorer* raw = s.get();
  PressSpec opt;
  opt.name = "fake";
  opt.has_threshold = true;
  opt.threshold = threshold;
  opt.window = window;
  opt.decoding = decoding;
  return {raw, std::make_unique<ThresholdPress>(std::move(s), opt)};
}

// ---------------------------------------------------------------- threshold policy

TEST(ThresholdPolicy, PrefillWithinWindowEvictsNothingBeyondItJudgesExactlyTheOverflow) {
  const ScoreFn low = [](int, int, int32_t) { return -10.0f; };
  auto t = make_threshold(low, 0.0, 128, false);  // kvpress default window
  KvCache cache(kL, kH, kD);
  t.press->start_context();
  step(cache, *t.press, 128);
  t.press->finish_context(cache);
  EXPECT_EQ(cache.entries_kept(), (int64_t)kL * kH * 128);
  EXPECT_EQ(t.press->n_evicted(), 0);

  // A new context in the same cache: 128 + 5 tokens -> exactly positions 0..4 leave the window.
  cache.clear();
  t.press->start_context();
  step(cache, *t.press, 133);
  t.press->finish_context(cache);
  for (int l = 0; l < kL; l++)
    for (int h = 0; h < kH; h++) EXPECT_EQ(kept(cache, l, h), range(5, 133)) << l << " " << h;
  EXPECT_EQ(t.press->n_evicted(), (int64_t)kL * kH * 5);
}

TEST(ThresholdPolicy, SinkTokensAreNeverEvicted) {
  const ScoreFn low = [](int, int, int32_t) { return -10.0f; };
  for (int sinks : {0, 1, 4}) {
    auto s = std::make_unique<FakeScorer>(low);
    PressSpec opt;
    opt.name = "fake";
    opt.has_threshold = true;
    opt.threshold = 0.0;
    opt.window = 8;
    opt.sink_tokens = sinks;
    ThresholdPress press(std::move(s), opt);
    KvCache cache(kL, kH, kD);
    press.start_context();
    step(cache, press, 40);
    press.finish_context(cache);
    std::vector<int32_t> want = range(0, sinks), tail = range(32, 40);
    want.insert(want.end(), tail.begin(), tail.end());
    for (int l = 0; l < kL; l++)
      for (int h = 0; h < kH; h++) EXPECT_EQ(kept(cache, l, h), want) << sinks << " sinks, " << l << " " << h;
    EXPECT_EQ(press.n_evicted(), (int64_t)kL * kH * (32 - sinks));
  }
  PressSpec bad;
  bad.sink_tokens = -1;
  EXPECT_THROW(ThresholdPress(std::make_unique<FakeScorer>(low), bad), Error);
}

TEST(ThresholdPolicy, StrictLessThanKeepsScoresEqualToTheThreshold) {
  const float below = std::nextafter(0.5f, 0.0f);
  const ScoreFn fn = [=](int, int, int32_t p) { return p % 2 == 0 ? 0.5f : below; };
  auto t = make_threshold(fn, 0.5, 0, false);
  KvCache cache(kL, kH, kD);
  t.press->start_context();
  step(cache, *t.press, 20);
  t.press->finish_context(cache);
  std::vector<int32_t> even;
  for (int32_t p = 0; p < 20; p += 2) even.push_back(p);
  for (int l = 0; l < kL; l++)
    for (int h = 0; h < kH; h++) EXPECT_EQ(kept(cache, l, h), even);
}

TEST(ThresholdPolicy, EachLayerAndHeadIsJudgedOnItsOwnScores) {
  const ScoreFn fn = [](int l, int h, int32_t p) { return (p + l) % kH == h ? -1.0f : 1.0f; };
  auto t = make_threshold(fn, 0.0, 6, false);
  KvCache cache(kL, kH, kD);
  t.press->start_context();
  step(cache, *t.press, 30);
  t.press->finish_context(cache);
  for (int l = 0; l < kL; l++)
    for (int h = 0; h < kH; h++) {
      EXPECT_EQ(kept(cache, l, h), expected_threshold_kept(fn, l, h, 30, 30, 6, 0.0)) << l << " " << h;
      EXPECT_EQ(cache.length(l, h), 30 - 8);  // 24 leave the window, a third of them score low
    }
}

TEST(ThresholdPolicy, DecodingOffLeavesQuestionAndAnswerAlone) {
  const ScoreFn low = [](int, int, int32_t) { return -1.0f; };
  auto t = make_threshold(low, 0.0, 4, false);
  KvCache cache(kL, kH, kD);
  t.press->start_context();
  step(cache, *t.press, 10);
  t.press->finish_context(cache);
  EXPECT_FALSE(t.press->prunes_decoding());
  const int calls = t.scorer->calls;
  for (int i = 0; i < 5; i++) step(cache, *t.press, 1);
  EXPECT_EQ(t.scorer->calls, calls);  // not even scored
  std::vector<int32_t> expect = range(6, 15);
  for (int l = 0; l < kL; l++)
    for (int h = 0; h < kH; h++) EXPECT_EQ(kept(cache, l, h), expect);
}

TEST(ThresholdPolicy, DecodingOnEvictsTheTokenLeavingTheWindowAtEachStep) {
  // Low scores on odd positions: each decoding step judges exactly one token, the one at n_past-1-W.
  const ScoreFn fn = [](int, int, int32_t p) { return p % 2 ? -1.0f : 1.0f; };
  const int W = 4;
  auto t = make_threshold(fn, 0.0, W, true);
  EXPECT_TRUE(t.press->prunes_decoding());
  KvCache cache(kL, kH, kD);
  t.press->start_context();
  step(cache, *t.press, 10);
  t.press->finish_context(cache);
  for (int32_t n_past = 11; n_past <= 20; n_past++) {
    step(cache, *t.press, 1);
    for (int l = 0; l < kL; l++)
      for (int h = 0; h < kH; h++)
        ASSERT_EQ(kept(cache, l, h), expected_threshold_kept(fn, l, h, n_past, n_past, W, 0.0)) << n_past;
  }
  // Decoding steps of several tokens (e.g. a question) follow the same rule.
  step(cache, *t.press, 7);
  for (int l = 0; l < kL; l++)
    for (int h = 0; h < kH; h++) EXPECT_EQ(kept(cache, l, h), expected_threshold_kept(fn, l, h, 27, 27, W, 0.0));
}

TEST(ThresholdPolicy, ContextInSeveralStepsIsJudgedLikeOneStep) {
  const ScoreFn fn = [](int l, int h, int32_t p) { return (float)((p * 7 + h * 3 + l) % 5) - 2.0f; };
  const int W = 4;
  for (bool decoding : {false, true}) {
    auto one = make_threshold(fn, 0.0, W, decoding);
    auto many = make_threshold(fn, 0.0, W, decoding);
    KvCache a(kL, kH, kD), b(kL, kH, kD);
    one.press->start_context();
    step(a, *one.press, 16);
    one.press->finish_context(a);
    many.press->start_context();
    for (int n : {3, 5, 1, 7}) step(b, *many.press, n);
    many.press->finish_context(b);
    for (int l = 0; l < kL; l++)
      for (int h = 0; h < kH; h++) {
        EXPECT_EQ(kept(a, l, h), expected_threshold_kept(fn, l, h, 16, 16, W, 0.0));
        EXPECT_EQ(kept(b, l, h), kept(a, l, h)) << "decoding " << decoding;
      }
  }
}

TEST(ThresholdPolicy, WithoutTheContextProtocolOnlyADecodingPressJudges) {
  // Nothing guesses where a context starts: the sequence says so (begin_context). A press attached
  // without it judges nothing unless it prunes while decoding.
  const ScoreFn low = [](int, int, int32_t) { return -1.0f; };
  auto t = make_threshold(low, 0.0, 2, false);
  KvCache cache(kL, kH, kD);
  step(cache, *t.press, 6);
  step(cache, *t.press, 6);
  EXPECT_EQ(t.scorer->calls, 0);
  EXPECT_EQ(cache.entries_kept(), (int64_t)kL * kH * 12);
  auto d = make_threshold(low, 0.0, 2, true);
  KvCache dc(kL, kH, kD);
  step(dc, *d.press, 6);  // judged: 0..3 evicted
  step(dc, *d.press, 6);  // judged: 4..9 evicted
  for (int l = 0; l < kL; l++)
    for (int h = 0; h < kH; h++) EXPECT_EQ(kept(dc, l, h), range(10, 12));
}

TEST(ThresholdPolicy, EvictedFractionAfterPrefillAndDecoding) {
  // Layer 0 scores low, layer 1 high: the kvpress ratio is the mean over layers.
  const ScoreFn fn = [](int l, int, int32_t) { return l == 0 ? -1.0f : 1.0f; };
  const int W = 4, T = 20;
  auto t = make_threshold(fn, 0.0, W, true);
  KvCache cache(kL, kH, kD);
  t.press->start_context();
  step(cache, *t.press, T);
  t.press->finish_context(cache);
  EXPECT_DOUBLE_EQ(cache.evicted_fraction(), (double)(kH * (T - W)) / (kH * T) / kL);
  EXPECT_EQ(t.press->n_evicted(), kH * (T - W));
  for (int m = 1; m <= 6; m++) {
    step(cache, *t.press, 1);
    EXPECT_DOUBLE_EQ(cache.evicted_fraction(), (double)(kH * (T + m - W)) / (kH * (T + m)) / kL);
  }
  EXPECT_EQ(t.press->n_evicted(), kH * (T + 6 - W));
  EXPECT_EQ(cache.entries_kept(0), kH * W);
  EXPECT_EQ(cache.entries_kept(1), kH * (T + 6));
}

TEST(ThresholdPolicy, MinusInfinityThresholdEvictsNothing) {
  const ScoreFn fn = [](int, int, int32_t p) { return p % 2 ? -kInf : -1e30f; };
  auto t = make_threshold(fn, -std::numeric_limits<double>::infinity(), 0, true);
  KvCache cache(kL, kH, kD);
  t.press->start_context();
  step(cache, *t.press, 40);
  t.press->finish_context(cache);
  for (int i = 0; i < 5; i++) step(cache, *t.press, 1);
  EXPECT_EQ(cache.entries_kept(), (int64_t)kL * kH * 45);
  EXPECT_EQ(t.press->n_evicted(), 0);
}

TEST(ThresholdPolicy, TruncatedTokensDoNotJudgeTheTokensThatReplaceThem) {
  // Several questions on one context: the first question's tokens (scored low) are truncated before
  // they leave the window; the second question's tokens at the same positions score high and must
  // all stay.
  const int W = 4;
  auto t = make_threshold([](int, int, int32_t p) { return p < 10 ? 1.0f : -1.0f; }, 0.0, W, true);
  KvCache cache(kL, kH, kD);
  t.press->start_context();
  step(cache, *t.press, 10);
  t.press->finish_context(cache);
  step(cache, *t.press, 3);  // question 1: positions 10..12, still inside the window
  cache.truncate(10);
  t.scorer->fn = [](int, int, int32_t) { return 1.0f; };
  for (int i = 0; i < 8; i++) step(cache, *t.press, 1);  // question 2: positions 10..17
  for (int l = 0; l < kL; l++)
    for (int h = 0; h < kH; h++) EXPECT_EQ(kept(cache, l, h), range(0, 18));
}

// ---------------------------------------------------------------- ratio policy

struct RatioSetup {
  FakeScorer* scorer;
  std::unique_ptr<RatioPress> press;
};

RatioSetup make_ratio(ScoreFn fn, double ratio, const std::string& scope) {
  auto s = std::make_unique<FakeScorer>(std::move(fn));
  FakeScorer* raw = s.get();
  PressSpec opt;
  opt.name = "fake";
  opt.has_ratio = true;
  opt.ratio = ratio;
  opt.ratio_scope = scope;
  return {raw, std::make_unique<RatioPress>(std::move(s), opt)};
}

// Reference selection: sort (score, layer, head, position) and take the first k of each group.
std::vector<std::tuple<int, int, int32_t>> reference_evicted(const ScoreFn& fn, int T, double ratio,
                                                             const std::string& scope) {
  using Item = std::tuple<float, int, int, int32_t>;
  std::vector<std::vector<Item>> groups;
  auto group_of = [&](int l, int h) -> size_t {
    if (scope == "global") return 0;
    if (scope == "layer") return (size_t)l;
    return (size_t)(l * kH + h);
  };
  groups.resize(scope == "global" ? 1 : scope == "layer" ? kL : kL * kH);
  for (int l = 0; l < kL; l++)
    for (int h = 0; h < kH; h++)
      for (int32_t p = 0; p < T; p++) groups[group_of(l, h)].emplace_back(fn(l, h, p), l, h, p);
  std::vector<std::tuple<int, int, int32_t>> out;
  for (auto& g : groups) {
    std::sort(g.begin(), g.end());
    // Per head: kvpress's compute_n_kept (int(T (1 - ratio)) kept, at least one); otherwise floor(ratio n).
    const size_t k = scope == "head" ? g.size() - std::max<size_t>(1, (size_t)((double)g.size() * (1.0 - ratio)))
                                     : (size_t)std::floor(ratio * (double)g.size());
    for (size_t i = 0; i < k; i++) out.emplace_back(std::get<1>(g[i]), std::get<2>(g[i]), std::get<3>(g[i]));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::tuple<int, int, int32_t>> evicted_entries(const KvCache& c, int T) {
  std::vector<std::tuple<int, int, int32_t>> out;
  for (int l = 0; l < kL; l++)
    for (int h = 0; h < kH; h++) {
      const std::vector<int32_t> k = kept(c, l, h);
      for (int32_t p = 0; p < T; p++)
        if (!std::binary_search(k.begin(), k.end(), p)) out.emplace_back(l, h, p);
    }
  return out;
}

TEST(RatioPolicy, EvictsTheLowestScoresPerScopeWithExactCounts) {
  // Scores with many ties, so the (layer, head, position) tie-break matters.
  const ScoreFn fn = [](int l, int h, int32_t p) { return (float)((l * 31 + h * 17 + p * 7) % 9); };
  const int T = 8;  // 48 entries
  for (const std::string scope : {"global", "layer", "head"})
    for (double ratio : {0.25, 0.3, 0.5, 0.9}) {
      auto r = make_ratio(fn, ratio, scope);
      KvCache cache(kL, kH, kD);
      r.press->start_context();
      step(cache, *r.press, T);
      const int64_t removed = r.press->finish_context(cache, nullptr);
      const auto expect = reference_evicted(fn, T, ratio, scope);
      EXPECT_EQ(removed, (int64_t)expect.size()) << scope << " " << ratio;
      EXPECT_EQ(evicted_entries(cache, T), expect) << scope << " " << ratio;
    }
}

TEST(RatioPolicy, GlobalBudgetFollowsTheScoresAcrossLayersAndHeads) {
  // Layer 0 scores below layer 1 everywhere; in layer 0, head 2 lowest.
  const ScoreFn fn = [](int l, int h, int32_t p) { return (float)(l * 100 + (h == 2 ? 0 : 10) + p); };
  const int T = 8;
  {
    auto r = make_ratio(fn, 0.25, "global");  // 12 of 48
    KvCache cache(kL, kH, kD);
    r.press->start_context();
    step(cache, *r.press, T);
    r.press->finish_context(cache, nullptr);
    EXPECT_EQ(cache.entries_kept(0), kH * T - 12);
    EXPECT_EQ(cache.entries_kept(1), kH * T);
    EXPECT_EQ(cache.length(0, 2), 0);  // its 8 scores are the lowest
    EXPECT_EQ(kept(cache, 0, 0), range(2, 8));
    EXPECT_EQ(kept(cache, 0, 1), range(2, 8));
  }
  {
    auto r = make_ratio(fn, 0.25, "layer");  // 6 per layer
    KvCache cache(kL, kH, kD);
    r.press->start_context();
    step(cache, *r.press, T);
    r.press->finish_context(cache, nullptr);
    for (int l = 0; l < kL; l++) {
      EXPECT_EQ(cache.entries_kept(l), kH * T - 6);
      EXPECT_EQ(kept(cache, l, 2), range(6, 8));
      EXPECT_EQ(kept(cache, l, 0), range(0, 8));
    }
  }
  {
    auto r = make_ratio(fn, 0.25, "head");  // 2 per stream
    KvCache cache(kL, kH, kD);
    r.press->start_context();
    step(cache, *r.press, T);
    r.press->finish_context(cache, nullptr);
    for (int l = 0; l < kL; l++)
      for (int h = 0; h < kH; h++) EXPECT_EQ(kept(cache, l, h), range(2, 8));
  }
}

TEST(RatioPolicy, EqualScoresAreBrokenByLayerHeadPosition) {
  auto r = make_ratio([](int, int, int32_t) { return 1.0f; }, 0.25, "global");  // 12 of 48
  KvCache cache(kL, kH, kD);
  r.press->start_context();
  step(cache, *r.press, 8);
  r.press->finish_context(cache, nullptr);
  EXPECT_EQ(cache.length(0, 0), 0);
  EXPECT_EQ(kept(cache, 0, 1), range(4, 8));
  EXPECT_EQ(cache.entries_kept(1), kH * 8);
}

TEST(RatioPolicy, RatioZeroEvictsNothing) {
  for (const std::string scope : {"global", "layer", "head"}) {
    auto r = make_ratio([](int, int, int32_t p) { return (float)p; }, 0.0, scope);
    KvCache cache(kL, kH, kD);
    r.press->start_context();
    step(cache, *r.press, 40);
    const int64_t bytes = cache.bytes_resident();
    EXPECT_EQ(r.press->finish_context(cache, nullptr), 0);
    EXPECT_EQ(cache.entries_kept(), (int64_t)kL * kH * 40);
    EXPECT_EQ(cache.bytes_resident(), bytes);
  }
}

TEST(RatioPolicy, ContextInSeveralStepsAndLaterTokensUntouched) {
  const ScoreFn fn = [](int l, int h, int32_t p) { return (float)((p * 5 + h + 2 * l) % 7); };
  auto r = make_ratio(fn, 0.5, "head");
  KvCache cache(kL, kH, kD);
  r.press->start_context();
  for (int n : {4, 1, 11}) step(cache, *r.press, n);
  r.press->finish_context(cache, nullptr);
  EXPECT_EQ(evicted_entries(cache, 16), reference_evicted(fn, 16, 0.5, "head"));
  EXPECT_FALSE(r.press->prunes_decoding());
  const int calls = r.scorer->calls;
  step(cache, *r.press, 3);  // after the context: neither scored nor evicted
  EXPECT_EQ(r.scorer->calls, calls);
  EXPECT_EQ(cache.entries_kept(), (int64_t)kL * kH * (8 + 3));
}

TEST(RatioPolicy, NanScoresAreEvictedFirst) {
  auto r = make_ratio([](int, int, int32_t p) { return p == 5 ? std::nanf("") : (float)p; }, 0.125, "head");
  KvCache cache(kL, kH, kD);
  r.press->start_context();
  step(cache, *r.press, 8);
  r.press->finish_context(cache, nullptr);
  for (int l = 0; l < kL; l++)
    for (int h = 0; h < kH; h++) EXPECT_EQ(kept(cache, l, h), (std::vector<int32_t>{0, 1, 2, 3, 4, 6, 7}));
}

TEST(RatioPolicy, ScopeNamesAreChecked) {
  EXPECT_EQ(parse_ratio_scope("global"), RatioScope::Global);
  EXPECT_EQ(parse_ratio_scope("layer"), RatioScope::Layer);
  EXPECT_EQ(parse_ratio_scope("head"), RatioScope::Head);
  EXPECT_THROW(parse_ratio_scope("heads"), Error);
}

// ---------------------------------------------------------------- with the real model

std::string model_path() {
  if (const char* m = std::getenv("KVZAP_MODEL"); m && *m) return m;
  return default_model_path();
}

class PressWithModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (std::filesystem::exists(model_path())) model_ = Model::load(model_path());
  }
  static void TearDownTestSuite() { model_.reset(); }
  void SetUp() override {
    if (!model_) FAIL() << "model not found at " << model_path() << " (CI pulls it first: run `kvzap pull` or set KVZAP_MODEL)";
  }
  static SessionOptions session_options(int64_t n_batch = 0) {
    SessionOptions o;
    o.n_threads = 2;
    o.n_ctx = 512;
    o.n_batch = n_batch;
    return o;
  }
  static std::vector<int32_t> context_ids() {
    std::string text;
    for (int i = 0; i < 6; i++)
      text += "The lighthouse keeper wrote the weather in his log every evening: wind from the west, "
              "a grey sea, and the ferry late again. Paragraph " + std::to_string(i) + " ends here. ";
    std::vector<int32_t> ids = model_->tokenizer().encode(text, true);
    return ids;
  }
  // Logits after the context and after each of 5 greedy steps, concatenated.
  static std::vector<float> greedy_logits(Session& s, const std::vector<int32_t>& ids, Press* press) {
    const int V = model_->config().n_vocab;
    s.prefill_context(ids, press);
    std::vector<float> all(s.logits(), s.logits() + V);
    for (int i = 0; i < 5; i++) {
      const int32_t next = (int32_t)(std::max_element(s.logits(), s.logits() + V) - s.logits());
      s.feed({next});
      all.insert(all.end(), s.logits(), s.logits() + V);
    }
    return all;
  }
  static PressSpec threshold_opt(const std::string& name, double t, int window = 128, bool decoding = false) {
    PressSpec o;
    o.name = name;
    o.has_threshold = true;
    o.threshold = t;
    o.window = window;
    o.decoding = decoding;
    return o;
  }
  static PressSpec ratio_opt(const std::string& name, double r, const std::string& scope = "global") {
    PressSpec o;
    o.name = name;
    o.has_ratio = true;
    o.ratio = r;
    o.ratio_scope = scope;
    return o;
  }
  static std::string error_of(const PressSpec& o) {
    try {
      make_press(o, *model_);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  static inline std::unique_ptr<Model> model_;
};

TEST_F(PressWithModel, OptionsAreValidated) {
  const std::string unknown = error_of(ratio_opt("snapkv-typo", 0.5));
  EXPECT_NE(unknown.find("unknown press"), std::string::npos) << unknown;
  for (const char* name : {"knorm", "random", "streaming_llm", "kvzap-linear", "kvzap-mlp"})
    EXPECT_NE(unknown.find(name), std::string::npos) << unknown;

  PressSpec both = ratio_opt("knorm", 0.5);
  both.has_threshold = true;
  EXPECT_NE(error_of(both).find("exactly one"), std::string::npos);
  PressSpec neither;
  neither.name = "knorm";
  EXPECT_NE(error_of(neither).find("exactly one"), std::string::npos);
  EXPECT_NE(error_of(threshold_opt("streaming_llm", 0.0)).find("cannot use a threshold"), std::string::npos);
  EXPECT_NE(error_of(ratio_opt("knorm", 1.0)).find("[0, 1)"), std::string::npos);
  EXPECT_NE(error_of(ratio_opt("knorm", -0.1)).find("[0, 1)"), std::string::npos);
  EXPECT_NE(error_of(ratio_opt("knorm", std::nan(""))).find("[0, 1)"), std::string::npos);
  EXPECT_NE(error_of(ratio_opt("knorm", 0.5, "heads")).find("scope"), std::string::npos);
  EXPECT_NE(error_of(threshold_opt("knorm", 0.0, -1)).find("window"), std::string::npos);
  EXPECT_NE(error_of(threshold_opt("knorm", std::nan(""))).find("threshold"), std::string::npos);
  PressSpec ratio_decoding = ratio_opt("knorm", 0.5);
  ratio_decoding.decoding = true;
  EXPECT_NE(error_of(ratio_decoding).find("threshold"), std::string::npos);

  EXPECT_EQ(error_of(threshold_opt("knorm", -1.0)), "");
  EXPECT_EQ(error_of(ratio_opt("streaming_llm", 0.5, "head")), "");
  EXPECT_EQ(error_of(threshold_opt("random", 0.5, 0, true)), "");
}

TEST_F(PressWithModel, KvzapUsesTheShippedSurrogateOrNamesTheMissingOne) {
  // SmolLM2's surrogates ship in data/surrogates: both presses build without --surrogate.
  for (const char* name : {"kvzap-linear", "kvzap-mlp"}) EXPECT_EQ(error_of(threshold_opt(name, -4.0)), "") << name;
  PressSpec missing = threshold_opt("kvzap-linear", -4.0);
  missing.surrogate_dir = "/nonexistent/kvzap-surrogate";
  EXPECT_NE(error_of(missing).find("/nonexistent/kvzap-surrogate"), std::string::npos);
}

TEST_F(PressWithModel, NoOpPressesLeaveLogitsBitIdentical) {
  const std::vector<int32_t> ids = context_ids();
  ASSERT_GT(ids.size(), 150u);  // past the 128-token window, so the threshold path judges tokens
  Session s(*model_, session_options());
  const std::vector<float> base = greedy_logits(s, ids, nullptr);

  auto random0 = make_press(ratio_opt("random", 0.0), *model_);
  const std::vector<float> r = greedy_logits(s, ids, random0.get());
  EXPECT_EQ(s.cache().evicted_fraction(), 0.0);
  ASSERT_EQ(r.size(), base.size());
  EXPECT_EQ(std::memcmp(r.data(), base.data(), base.size() * sizeof(float)), 0) << "random, ratio 0";

  auto knorm = make_press(threshold_opt("knorm", -std::numeric_limits<double>::infinity(), 128, true), *model_);
  const std::vector<float> k = greedy_logits(s, ids, knorm.get());
  EXPECT_EQ(s.cache().evicted_fraction(), 0.0);
  EXPECT_EQ(std::memcmp(k.data(), base.data(), base.size() * sizeof(float)), 0) << "knorm, threshold -inf";
}

// The forward hands each segment its observer's read-out of h (LayerObserver::h_readout), computed next
// to the norm: it must equal the same function of step.h, row for row, in one sequence and in a batched
// step where only one of two segments asks for it.
TEST_F(PressWithModel, ForwardReadoutOfHMatchesTheStepsH) {
  struct Probe : LayerObserver {
    int64_t E = 0, rows = 0;
    bool bad = false;
    int h_readout_dim(int) const override { return 2; }
    void h_readout(int layer, const float* h, int64_t n, float* out) const override {
      for (int64_t t = 0; t < n; t++, h += E, out += 2) {
        float sum = 0;
        for (int64_t i = 0; i < E; i++) sum += h[i] * (float)(layer + 1);
        out[0] = sum, out[1] = h[E - 1];
      }
    }
    void after_attention(const LayerStep& st, KvCache&) override {
      if (!st.h_readout) { bad = true; return; }
      float want[2];
      for (int64_t t = 0; t < st.n_tok; t++, rows++) {
        h_readout(st.layer, st.h + t * E, 1, want);
        if (std::memcmp(want, st.h_readout + 2 * t, sizeof want) != 0) bad = true;
      }
    }
  };
  const std::vector<int32_t> ids = context_ids();
  const int64_t T = (int64_t)ids.size(), L = model_->config().n_layer;
  Probe probe;
  probe.E = model_->config().n_embd;
  Session a(*model_, session_options(48)), b(*model_, session_options(48));
  a.forward().run(ids.data(), T, a.cache(), LogitsMode::None, nullptr, &probe);
  EXPECT_FALSE(probe.bad);
  EXPECT_EQ(probe.rows, T * L);
  // Batched: segment 0 without an observer, segment 1 with the probe.
  a.reset();
  probe.rows = 0;
  ForwardSegment segs[2];
  segs[0].cache = &b.cache(), segs[0].tokens = ids.data(), segs[0].n = 20;
  segs[1].cache = &a.cache(), segs[1].tokens = ids.data() + 5, segs[1].n = 17, segs[1].observer = &probe;
  a.forward().step_batch(segs, 2);
  EXPECT_FALSE(probe.bad);
  EXPECT_EQ(probe.rows, 17 * L);
}

// KVzap-Linear scores from the fused read-out and from step.h (an observer that offers no read-out)
// evict exactly the same entries.
TEST_F(PressWithModel, KvzapLinearFusedReadoutEvictsLikeReadingH) {
  struct NoReadout : LayerObserver {
    Press* press = nullptr;
    void after_attention(const LayerStep& st, KvCache& cache) override { press->after_attention(st, cache); }
  };
  const std::vector<int32_t> ids = context_ids();
  const int64_t T = (int64_t)ids.size();
  const ModelConfig& c = model_->config();
  std::vector<std::vector<int32_t>> kept[2];
  int64_t evicted[2] = {0, 0};
  for (int fused = 0; fused < 2; fused++) {
    auto press = make_press(threshold_opt("kvzap-linear", -4.0, 32, false), *model_);
    auto* tp = dynamic_cast<ThresholdPress*>(press.get());
    ASSERT_NE(tp, nullptr);
    EXPECT_EQ(tp->h_readout_dim(0), 0) << "outside a context nothing is judged";
    Session s(*model_, session_options(40));
    NoReadout plain;
    plain.press = press.get();
    tp->start_context();
    EXPECT_EQ(tp->h_readout_dim(0), c.n_head_kv);
    s.forward().run(ids.data(), T, s.cache(), LogitsMode::None, nullptr, fused ? (LayerObserver*)tp : &plain);
    tp->finish_context(s.cache());
    evicted[fused] = tp->n_evicted();
    for (int l = 0; l < c.n_layer; l++)
      for (int h = 0; h < c.n_head_kv; h++) {
        std::vector<int32_t> pos;
        for (int64_t i = 0; i < s.cache().length(l, h); i++) pos.push_back(s.cache().position_at(l, h, i));
        kept[fused].push_back(pos);
      }
  }
  EXPECT_GT(evicted[0], T);  // the threshold really evicts
  EXPECT_EQ(evicted[0], evicted[1]);
  EXPECT_EQ(kept[0], kept[1]);
}

TEST_F(PressWithModel, ThresholdPressEvictsForRealInEveryContextStep) {
  const std::vector<int32_t> ids = context_ids();
  const int64_t T = (int64_t)ids.size();
  const ModelConfig& c = model_->config();
  // +inf threshold: every token that leaves the 16-token window goes; the context is prefilled in
  // steps of 32 tokens, and all of them are judged.
  Session s(*model_, session_options(32));
  auto press = make_press(threshold_opt("knorm", std::numeric_limits<double>::infinity(), 16, false), *model_);
  Session base(*model_, session_options(32));
  const std::vector<float> ref = greedy_logits(base, ids, nullptr);
  const std::vector<float> got = greedy_logits(s, ids, press.get());
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++) {
      // 16 context tokens + 5 generated ones (decoding off).
      ASSERT_EQ(s.cache().length(l, h), 16 + 5);
      EXPECT_EQ(s.cache().position_at(l, h, 0), T - 16);
    }
  EXPECT_NEAR(s.cache().evicted_fraction(), (double)(T - 16) / (double)(T + 5), 1e-12);  // mean of 30 equal terms
  EXPECT_LT(s.cache().bytes_resident(), base.cache().bytes_resident() / 4);
  for (float x : got) ASSERT_TRUE(std::isfinite(x));
  EXPECT_NE(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0);
}

TEST_F(PressWithModel, StreamingLlmKeepsSinksAndRecentTokens) {
  const std::vector<int32_t> ids = context_ids();
  const int32_t T = (int32_t)ids.size();
  Session s(*model_, session_options());
  auto press = make_press(ratio_opt("streaming_llm", 0.5, "head"), *model_);
  s.prefill_context(ids, press.get());
  const int32_t k = T / 2;  // evicted per stream
  std::vector<int32_t> expect = range(0, 4);
  for (int32_t p = 4 + k; p < T; p++) expect.push_back(p);
  const ModelConfig& c = model_->config();
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++) ASSERT_EQ(kept(s.cache(), l, h), expect) << l << " " << h;
}

TEST_F(PressWithModel, KvzapSurrogateScoresMapToTheirHeads) {
  // A linear surrogate with zero weights and per-head biases -10, 0, +10 (SmolLM2 has 3 KV heads):
  // at threshold -1, head 0 keeps only its window and the others keep everything.
  const ModelConfig& c = model_->config();
  ASSERT_EQ(c.n_head_kv, 3);
  std::vector<SurrogateLayerWeights> layers((size_t)c.n_layer);
  for (auto& w : layers) {
    w.w1.assign((size_t)c.n_head_kv * c.n_embd, 0.0f);
    w.b1 = {-10.0f, 0.0f, 10.0f};
  }
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kvzap_test_surrogate_" + std::to_string(::getpid()));
  Surrogate(c.n_embd, c.n_head_kv, 0, layers).save(dir.string());
  PressSpec opt = threshold_opt("kvzap-linear", -1.0, 8);
  opt.surrogate_dir = dir.string();
  auto press = make_press(opt, *model_);
  PressSpec wrong_kind = opt;
  wrong_kind.name = "kvzap-mlp";
  const std::string e = error_of(wrong_kind);
  std::filesystem::remove_all(dir);
  EXPECT_NE(e.find("linear"), std::string::npos) << e;

  const std::vector<int32_t> ids = context_ids();
  const int32_t T = (int32_t)ids.size();
  Session s(*model_, session_options());
  s.prefill_context(ids, press.get());
  for (int l = 0; l < c.n_layer; l++) {
    EXPECT_EQ(kept(s.cache(), l, 0), range(T - 8, T));
    EXPECT_EQ(s.cache().length(l, 1), T);
    EXPECT_EQ(s.cache().length(l, 2), T);
  }
}

}  // namespace
