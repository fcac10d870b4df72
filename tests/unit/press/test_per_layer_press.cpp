// per_layer_<press> (kvpress PerLayerCompressionPress) and composed_<a>+<b> (kvpress ComposedPress), issue 38:
// the list of ratios in PressSpec::ratios, parsed and checked once (press_spec), counted against the model
// (or the stages) by make_press. Per layer: each layer keeps kvpress_n_kept(ratios[layer], T) of each head's
// entries, its best-scored ones. Composed: each stage keeps its share of what the previous kept (the
// product). Both free the entries for real.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvzap/error.h"
#include "model/model.h"
#include "press/baselines.h"
#include "press/policy.h"
#include "press/press.h"
#include "press/press_spec.h"
#include "kernels/thread_pool.h"
#include "test_support.h"
#include "press/scramble_scorer.h"

namespace kvzap {
namespace {

using nlohmann::json;

using test::ScrambleScorer;

constexpr int kLayers = 4, kHeads = 2, kDim = 4;

// Kept positions [layer][head] after a context of T tokens under `scorer` in the ratio policy.
std::vector<std::vector<std::vector<int32_t>>> run(std::unique_ptr<Scorer> scorer, double shown_ratio, int64_t T) {
  PressSpec o;
  o.name = "test";
  o.has_ratio = true;
  o.ratio = shown_ratio;
  o.ratio_scope = "head";
  RatioPress press(std::move(scorer), o);
  KvCache cache(kLayers, kHeads, kDim);
  press.start_context();
  std::vector<float> kv((size_t)(T * kHeads * kDim), 0.5f);
  std::vector<int32_t> pos((size_t)T);
  std::iota(pos.begin(), pos.end(), 0);
  for (int l = 0; l < kLayers; l++) {
    cache.append_layer(l, T, kv.data(), kv.data(), pos.data());
    LayerStep st;
    st.layer = l;
    st.n_tok = T;
    st.pos = pos.data();
    st.k = st.v = kv.data();
    press.after_attention(st, cache);
  }
  cache.set_n_past(T);
  press.finish_context(cache, nullptr);
  std::vector<std::vector<std::vector<int32_t>>> kept(kLayers, std::vector<std::vector<int32_t>>(kHeads));
  for (int l = 0; l < kLayers; l++)
    for (int h = 0; h < kHeads; h++)
      for (int64_t i = 0; i < cache.length(l, h); i++) kept[(size_t)l][(size_t)h].push_back(cache.position_at(l, h, i));
  return kept;
}

TEST(PerLayerPress, EachLayerKeepsKvpressCountOfItsBestEntries) {
  const std::vector<double> ratios = {0.0, 0.25, 0.5, 0.9};
  const int64_t T = 101;  // odd: int(T (1 - r)), not T - floor(r T)
  const auto kept = run(make_per_layer_scorer(std::make_unique<ScrambleScorer>(), ratios), 0.4125, T);
  for (int l = 0; l < kLayers; l++)
    for (int h = 0; h < kHeads; h++) {
      const int64_t n_kept = ratios[(size_t)l] > 0 ? (int64_t)((double)T * (1 - ratios[(size_t)l])) : T;
      std::vector<int32_t> order((size_t)T);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(),
                [&](int32_t a, int32_t b) { return ScrambleScorer::score(l, h, a) > ScrambleScorer::score(l, h, b); });
      std::vector<int32_t> want(order.begin(), order.begin() + n_kept);
      std::sort(want.begin(), want.end());
      EXPECT_EQ(kept[(size_t)l][(size_t)h], want) << "layer " << l << " head " << h;
    }
  EXPECT_EQ(kept[0][0].size(), (size_t)T);       // ratio 0: the layer stays whole
  EXPECT_EQ(kept[1][0].size(), (size_t)75);      // int(101 * 0.75)
  EXPECT_EQ(kept[2][1].size(), (size_t)50);      // int(101 * 0.5), one fewer than 101 - floor(50.5)
  EXPECT_EQ(kept[3][1].size(), (size_t)10);      // int(101 * 0.1)
  EXPECT_EQ(kvpress_n_kept(0.99, 5), 1);         // at least one stays
}

TEST(PerLayerPress, EveryRatioZeroKeepsEverything) {
  const auto kept = run(make_per_layer_scorer(std::make_unique<ScrambleScorer>(), {0, 0, 0, 0}), 0, 40);
  for (int l = 0; l < kLayers; l++)
    for (int h = 0; h < kHeads; h++) EXPECT_EQ(kept[(size_t)l][(size_t)h].size(), 40u);
}

std::string spec_error(const json& v) {
  try {
    press_spec_from_json(v);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(PerLayerPress, RatiosAreParsedOnceForEveryFrontEnd) {
  const PressSpec a = press_spec_from_json({{"press", "per_layer_knorm"}, {"ratios", {0.0, 0.25, 0.5}}});
  EXPECT_EQ(a.ratios, (std::vector<double>{0.0, 0.25, 0.5}));
  EXPECT_FALSE(a.has_ratio);
  const PressSpec b = press_spec_from_json({{"press", "per_layer_knorm"}, {"ratios", "0:0.25,0.5"}});  // the CLI's text form
  EXPECT_EQ(press_spec_key(&a), press_spec_key(&b));
  const PressSpec back = press_spec_from_json(press_spec_to_json(a));
  EXPECT_EQ(press_spec_key(&back), press_spec_key(&a));
  PressSpec c = a;
  c.ratios[2] = 0.5000001;
  EXPECT_NE(press_spec_key(&c), press_spec_key(&a));
  EXPECT_EQ(parse_ratio_list("0.1:0.2", "--press-ratios"), (std::vector<double>{0.1, 0.2}));
  // Parameters of the inner press are the wrapper's.
  EXPECT_EQ(press_param(press_spec_from_json({{"press", "per_layer_snapkv"}, {"ratios", {0.5}}, {"window_size", 16}}),
                        "window_size"), 16);

  EXPECT_NE(spec_error({{"press", "per_layer_knorm"}, {"ratios", {0.5, 1.0}}}).find("'press.ratios': ratio 1 is 1; each must be in [0, 1)"),
            std::string::npos) << spec_error({{"press", "per_layer_knorm"}, {"ratios", {0.5, 1.0}}});
  EXPECT_NE(spec_error({{"press", "per_layer_knorm"}, {"ratios", {-0.1}}}).find("in [0, 1)"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "per_layer_knorm"}, {"ratios", json::array()}}).find("press.ratios"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "per_layer_knorm"}, {"ratios", "0.1:x"}}).find("separated by ',' or ':'"), std::string::npos);
  EXPECT_NE(spec_error({{"press", "per_layer_knorm"}, {"ratios", {"a"}}}).find("press.ratios[0]"), std::string::npos);
  EXPECT_THROW(parse_ratio_list("", "--press-ratios"), Error);
  EXPECT_THROW(parse_ratio_list("0.5::0.5", "--press-ratios"), Error);
  EXPECT_THROW(parse_ratio_list("nan", "--press-ratios"), Error);
}

class PerLayerWithModel : public test::DefaultModelTest {
 protected:
  static PressSpec spec(const std::string& name, size_t n, double r = 0.5) {
    PressSpec s;
    s.name = name;
    s.ratios.assign(n, r);
    return s;
  }
  static std::string make_error(const PressSpec& s) {
    try {
      make_press(s, *model_);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  }
};

TEST_F(PerLayerWithModel, ThePressIsMadeOnlyWithOneValidRatioPerLayer) {
  const size_t L = (size_t)model_->config().n_layer;
  const auto press = make_press(spec("per_layer_knorm", L), *model_);
  EXPECT_NE(press->name().find("per_layer_knorm"), std::string::npos) << press->name();
  EXPECT_NE(press->name().find("per-layer"), std::string::npos) << press->name();
  EXPECT_EQ(make_press(spec("per_layer_snapkv", L, 0.0), *model_)->name().find("per_layer_snapkv"), 0u);

  const std::string few = make_error(spec("per_layer_knorm", L - 1));
  EXPECT_NE(few.find("needs one ratio per layer: the model has " + std::to_string(L) + " layers, " + std::to_string(L - 1) +
                     " ratios given"), std::string::npos) << few;
  EXPECT_NE(make_error(spec("per_layer_knorm", L + 1)).find("one ratio per layer"), std::string::npos);
  EXPECT_NE(make_error(spec("per_layer_knorm", 0)).find("one ratio per layer"), std::string::npos);
  EXPECT_NE(make_error(spec("per_layer_knorm", L, 1.0)).find("in [0, 1)"), std::string::npos);
  PressSpec with_ratio = spec("per_layer_knorm", L);
  with_ratio.has_ratio = true, with_ratio.ratio = 0.5;
  EXPECT_NE(make_error(with_ratio).find("not a single ratio"), std::string::npos) << make_error(with_ratio);
  PressSpec with_threshold = spec("per_layer_knorm", L);
  with_threshold.has_threshold = true;
  EXPECT_NE(make_error(with_threshold).find("not a threshold"), std::string::npos);
  EXPECT_NE(make_error(spec("per_layer_simlayerkv", L)).find("sets its own budget"), std::string::npos);
  EXPECT_NE(make_error(spec("per_layer_kvzip", L)).find("per-head ScorerPress"), std::string::npos) << make_error(spec("per_layer_kvzip", L));
  EXPECT_NE(make_error(spec("per_layer_pyramidkv", L)).find("splits its budget itself"), std::string::npos)
      << make_error(spec("per_layer_pyramidkv", L));
  EXPECT_NE(make_error(spec("per_layer_nonsense", L)).find("unknown press 'per_layer_nonsense'"), std::string::npos);
  PressSpec plain = spec("knorm", L);
  plain.has_ratio = true, plain.ratio = 0.5;
  EXPECT_NE(make_error(plain).find("takes no list of ratios"), std::string::npos) << make_error(plain);
}

// Drives a press (made by make_press) over a context of random keys on a bare cache shaped like the model.
class BareRunner : public ContextRunner {
 public:
  ThreadPool& threads() override { return pool_; }
  int64_t n_ctx() const override { return 4096; }
  int64_t max_step_tokens() const override { return 4096; }
  void run_on_scratch_fork(const KvCache&, const int32_t*, int64_t, LayerObserver&) override {
    throw Error("not in this test");
  }

 private:
  ThreadPool pool_{1};
};

struct BareRun {
  std::vector<std::vector<std::vector<int32_t>>> kept;   // [layer][head] positions
  std::vector<std::vector<std::vector<float>>> norm;     // [layer][head][position] ||k||
};

BareRun run_bare(Press& press, const ModelConfig& c, int64_t T) {
  const int L = c.n_layer, H = c.n_head_kv, D = c.head_dim;
  KvCache cache(L, H, D, nullptr, KvType::F32);
  BareRunner runner;
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0, 1);
  std::vector<int32_t> pos((size_t)T), ids((size_t)T, 1);
  std::iota(pos.begin(), pos.end(), 0);
  BareRun out;
  out.norm.assign((size_t)L, std::vector<std::vector<float>>((size_t)H, std::vector<float>((size_t)T)));
  press.begin_context(runner);
  for (int l = 0; l < L; l++) {
    std::vector<float> k((size_t)(T * H * D)), v((size_t)(T * H * D));
    for (float& x : k) x = g(rng);
    for (float& x : v) x = g(rng);
    for (int64_t t = 0; t < T; t++)
      for (int h = 0; h < H; h++) {
        double sq = 0;
        for (int d = 0; d < D; d++) sq += (double)k[((size_t)t * H + h) * D + d] * k[((size_t)t * H + h) * D + d];
        out.norm[(size_t)l][(size_t)h][(size_t)t] = (float)std::sqrt(sq);
      }
    cache.append_layer(l, T, k.data(), v.data(), pos.data());
    LayerStep st;
    st.layer = l;
    st.n_tok = T;
    st.pos = pos.data();
    st.k = k.data();
    st.v = v.data();
    press.after_attention(st, cache);
  }
  cache.set_n_past(T);
  const std::string question;
  ContextView view{cache, runner, ids, question};
  press.end_context(view);
  out.kept.assign((size_t)L, std::vector<std::vector<int32_t>>((size_t)H));
  for (int l = 0; l < L; l++)
    for (int h = 0; h < H; h++)
      for (int64_t i = 0; i < cache.length(l, h); i++) out.kept[(size_t)l][(size_t)h].push_back(cache.position_at(l, h, i));
  return out;
}

// The n lowest-norm positions of a stream, ascending (knorm keeps low-norm keys).
std::vector<int32_t> lowest_norms(const std::vector<float>& norm, int64_t n) {
  std::vector<int32_t> idx(norm.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return norm[(size_t)a] < norm[(size_t)b]; });
  idx.resize((size_t)n);
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST_F(PerLayerWithModel, PerLayerKnormFreesEachLayersShareOnTheModelsShape) {
  const ModelConfig& c = model_->config();
  PressSpec s;
  s.name = "per_layer_knorm";
  for (int l = 0; l < c.n_layer; l++) s.ratios.push_back(l == 0 ? 0.0 : 0.1 * (l % 10));
  auto press = make_press(s, *model_);
  const int64_t T = 97;
  const BareRun r = run_bare(*press, c, T);
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++)
      EXPECT_EQ(r.kept[(size_t)l][(size_t)h], lowest_norms(r.norm[(size_t)l][(size_t)h], kvpress_n_kept(s.ratios[(size_t)l], T)))
          << "layer " << l << " head " << h;
  EXPECT_EQ(r.kept[0][0].size(), (size_t)T);  // ratio 0: the whole layer
}

TEST_F(PerLayerWithModel, ComposedKeepsTheProductAndEachStageJudgesWhatThePreviousKept) {
  const ModelConfig& c = model_->config();
  PressSpec s;
  s.name = "composed_knorm+knorm";
  s.ratios = {0.5, 0.3};
  auto press = make_press(s, *model_);
  EXPECT_NE(press->name().find("composed_knorm+knorm"), std::string::npos) << press->name();
  const int64_t T = 101;
  const BareRun r = run_bare(*press, c, T);
  const int64_t n = kvpress_n_kept(0.3, kvpress_n_kept(0.5, T));  // int(int(101 * 0.5) * 0.7) = 35
  EXPECT_EQ(n, 35);
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++)
      EXPECT_EQ(r.kept[(size_t)l][(size_t)h], lowest_norms(r.norm[(size_t)l][(size_t)h], n)) << "layer " << l << " head " << h;
  // A copy outside a context is a fresh press that does the same.
  auto copy = press->clone();
  EXPECT_EQ(run_bare(*copy, c, T).kept, r.kept);

  // A ratio of 0 in a stage: that stage keeps everything it was given.
  s.ratios = {0.0, 0.5};
  auto half = make_press(s, *model_);
  const BareRun r0 = run_bare(*half, c, T);
  EXPECT_EQ(r0.kept[1][0].size(), (size_t)kvpress_n_kept(0.5, T));
}

TEST_F(PerLayerWithModel, ComposedSpecsAreCheckedWithClearErrors) {
  PressSpec s;
  s.name = "composed_snapkv+knorm";
  s.ratios = {0.3};
  EXPECT_NE(make_error(s).find("needs one ratio per stage: 2 presses, 1 ratio given"), std::string::npos) << make_error(s);
  s.ratios = {0.3, 0.3};
  EXPECT_EQ(make_error(s), "no error");
  s.ratios = {0.3, 1.0};
  EXPECT_NE(make_error(s).find("in [0, 1)"), std::string::npos);
  s.ratios = {0.3, 0.3};
  s.has_ratio = true, s.ratio = 0.3;
  EXPECT_NE(make_error(s).find("not a single ratio"), std::string::npos);
  s.has_ratio = false;
  s.name = "composed_knorm+snapkv";
  EXPECT_NE(make_error(s).find("later stage must score each entry alone"), std::string::npos) << make_error(s);
  s.name = "composed_knorm+kvzip";
  EXPECT_NE(make_error(s).find("per-head ratio"), std::string::npos) << make_error(s);
  s.name = "composed_knorm+nonsense";
  EXPECT_NE(make_error(s).find("'nonsense' is not a registered press"), std::string::npos) << make_error(s);
  s.name = "composed_knorm";
  s.ratios = {0.3};
  EXPECT_NE(make_error(s).find("at least two presses"), std::string::npos) << make_error(s);
  // The stages' parameters are the composition's; a spec names it like any press.
  const PressSpec j = press_spec_from_json({{"press", "composed_snapkv+knorm"}, {"ratios", {0.3, 0.3}}, {"window_size", 16}});
  EXPECT_EQ(press_param(j, "window_size"), 16);
  EXPECT_NE(find_press_entry("composed_snapkv+knorm"), nullptr);
  EXPECT_EQ(find_press_entry("composed_snapkv+nonsense"), nullptr);
  EXPECT_EQ(composed_stages("composed_snapkv+knorm"), (std::vector<std::string>{"snapkv", "knorm"}));
  EXPECT_TRUE(composed_stages("snapkv").empty());
}

// The CLI: --press-ratios reaches the spec; a wrong count is a clear error, not a crash.
TEST_F(PerLayerWithModel, CliPressRatiosReachTheSpecAndAreChecked) {
  const int L = model_->config().n_layer;
  std::string ratios;
  for (int l = 0; l < L; l++) ratios += (l ? ":" : "") + std::string(l == 0 ? "0" : "0.5");
  const test::CommandResult r = test::run_kvzap("generate -t 2 -p 'Hello there, how are you today? Fine.' -n 1 --json "
                                                "--press per_layer_knorm --press-ratios " + ratios);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const PressSpec s = press_spec_from_json(json::parse(r.out)["press_spec"]);
  ASSERT_EQ(s.ratios.size(), (size_t)L);
  EXPECT_EQ(s.ratios[0], 0);
  EXPECT_EQ(s.ratios[1], 0.5);
  const test::CommandResult few = test::run_kvzap("generate -t 2 -p 'Hello there' -n 1 --press per_layer_knorm --press-ratios 0.5:0.5");
  EXPECT_NE(few.exit_code, 0);
  EXPECT_NE(few.err.find("needs one ratio per layer"), std::string::npos) << few.err;
  const test::CommandResult bad = test::run_kvzap("generate -t 2 -p 'Hello there' -n 1 --press per_layer_knorm --press-ratios 0.5:1.2");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("'--press-ratios': ratio 1 is 1.2"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace kvzap
