// Tests of the kvpress baseline presses (src/press/scorer_*.cpp, press/baselines.h). Each scorer runs
// on a small hand-built context (random queries, keys and values fed step by step into a bare
// KvCache, as Forward::step does) and its scores are compared with a naive recomputation of the
// press's definition written out here in double precision (docs/ALGORITHMS.md §8). The last group runs
// every press on the real model: ratio 0.5 on a 300-token context, then generation.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/kv_cache.h"
#include "common/fp16.h"
#include "fetch/model_store.h"
#include "engine/session.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "press/baseline_math.h"
#include "press/baselines.h"
#include "press/policy.h"
#include "press/press.h"
#include "press/small_config.h"
#include "test_support.h"

namespace {

using namespace kvzap;
constexpr float kInf = std::numeric_limits<float>::infinity();
using Scores = std::vector<std::vector<std::vector<double>>>;  // [layer][kv head][slot]

using press_test::small_config;
using press_test::rope_pair;
using press_test::rope_angle;
using press_test::rotate;

float f16_round(float x) { return fp16_to_fp32(fp32_to_fp16(x)); }

// A context of T tokens: per layer, queries [T][n_head][D], keys / values [T][n_head_kv][D]. Keys and
// values are f16-exact (what the cache stores); with `rope`, q/k are rotated copies of qpre/kpre.
struct Context {
  ModelConfig c;
  int64_t T = 0;
  std::vector<std::vector<float>> q, k, v, qpre, kpre;  // [layer][...]
  int D() const { return c.head_dim; }
  const float* key(int l, int h, int64_t i) const { return &k[(size_t)l][(size_t)((i * c.n_head_kv + h) * c.head_dim)]; }
  const float* value(int l, int h, int64_t i) const { return &v[(size_t)l][(size_t)((i * c.n_head_kv + h) * c.head_dim)]; }
  const float* query(int l, int hq, int64_t i) const { return &q[(size_t)l][(size_t)((i * c.n_head + hq) * c.head_dim)]; }
};

Context make_context(const ModelConfig& c, int64_t T, uint32_t seed, bool rope = false, float q_scale = 2.0f) {
  Context x;
  x.c = c;
  x.T = T;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int D = c.head_dim;
  for (int l = 0; l < c.n_layer; l++) {
    std::vector<float> q((size_t)(T * c.n_head * D)), k((size_t)(T * c.n_head_kv * D)), v(k.size());
    for (float& a : q) a = q_scale * u(rng);
    for (float& a : k) a = u(rng);
    for (float& a : v) a = u(rng);
    x.qpre.push_back(q);
    x.kpre.push_back(k);
    if (rope) {
      for (int64_t t = 0; t < T; t++) {
        for (int h = 0; h < c.n_head; h++) rotate(c, &q[(size_t)((t * c.n_head + h) * D)], t);
        for (int h = 0; h < c.n_head_kv; h++) rotate(c, &k[(size_t)((t * c.n_head_kv + h) * D)], t);
      }
    }
    for (float& a : k) a = f16_round(a);
    for (float& a : v) a = f16_round(a);
    x.q.push_back(q);
    x.k.push_back(k);
    x.v.push_back(v);
  }
  return x;
}

// Feeds the context in steps of `step` tokens, calling `observe` after each layer's append.
template <class Observe>
void feed(KvCache& cache, const Context& x, int64_t step, Observe observe) {
  const int H = x.c.n_head, Hkv = x.c.n_head_kv, D = x.D();
  for (int64_t t0 = 0; t0 < x.T; t0 += step) {
    const int64_t n = std::min(step, x.T - t0);
    std::vector<int32_t> pos((size_t)n);
    std::iota(pos.begin(), pos.end(), (int32_t)t0);
    for (int l = 0; l < x.c.n_layer; l++) {
      const float* k = &x.k[(size_t)l][(size_t)(t0 * Hkv * D)];
      const float* v = &x.v[(size_t)l][(size_t)(t0 * Hkv * D)];
      cache.append_layer(l, n, k, v, pos.data());
      cache.set_n_past(t0 + n);
      LayerStep st;
      st.layer = l;
      st.n_tok = n;
      st.pos = pos.data();
      st.q = &x.q[(size_t)l][(size_t)(t0 * H * D)];
      st.k = k;
      st.v = v;
      observe(st);
    }
  }
}

// Runs a scorer over the context prefilled in steps of `step`, returns its scores.
CacheScores run_scorer(Scorer& s, const Context& x, int64_t step) {
  KvCache cache(x.c.n_layer, x.c.n_head_kv, x.c.head_dim);
  s.reset();
  feed(cache, x, step, [&](const LayerStep& st) { s.observe_step(st, cache); });
  auto* cs = dynamic_cast<CacheScorer*>(&s);
  EXPECT_NE(cs, nullptr);
  CacheScores out;
  cs->score_cache(cache, out);
  return out;
}

// Runs a scorer under the ratio policy; returns the kept positions per stream.
std::vector<std::vector<std::vector<int32_t>>> run_ratio(std::unique_ptr<Scorer> s, const Context& x, double ratio,
                                                         const std::string& scope = "head", int64_t step = 1000000) {
  PressSpec o;
  o.name = "test";
  o.has_ratio = true;
  o.ratio = ratio;
  o.ratio_scope = scope;
  RatioPress press(std::move(s), o);
  KvCache cache(x.c.n_layer, x.c.n_head_kv, x.c.head_dim);
  press.start_context();
  feed(cache, x, step, [&](const LayerStep& st) { press.after_attention(st, cache); });
  press.finish_context(cache, nullptr);
  std::vector<std::vector<std::vector<int32_t>>> kept((size_t)x.c.n_layer, std::vector<std::vector<int32_t>>((size_t)x.c.n_head_kv));
  for (int l = 0; l < x.c.n_layer; l++)
    for (int h = 0; h < x.c.n_head_kv; h++)
      for (int64_t i = 0; i < cache.length(l, h); i++) kept[(size_t)l][(size_t)h].push_back(cache.position_at(l, h, i));
  return kept;
}

// The `keep` highest-scored slots, ascending (ties: the later slot is kept, the policy's order).
std::vector<int32_t> top_slots(const std::vector<double>& s, int64_t keep) {
  std::vector<int32_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return s[(size_t)a] > s[(size_t)b]; });
  idx.resize((size_t)keep);
  std::sort(idx.begin(), idx.end());
  return idx;
}

// |got - want| <= max(rel * |want|, abs) per entry; infinite entries must match exactly.
void expect_scores_near(const CacheScores& got, const Scores& want, double rel, const char* what, double abs = 1e-9) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t l = 0; l < want.size(); l++) {
    ASSERT_EQ(got[l].size(), want[l].size()) << what;
    for (size_t h = 0; h < want[l].size(); h++) {
      ASSERT_EQ(got[l][h].size(), want[l][h].size()) << what;
      for (size_t i = 0; i < want[l][h].size(); i++) {
        const double w = want[l][h][i], g = got[l][h][i];
        if (std::isinf(w)) {
          EXPECT_EQ(g, w) << what << " layer " << l << " head " << h << " slot " << i;
        } else {
          EXPECT_NEAR(g, w, std::max(rel * std::fabs(w), abs)) << what << " layer " << l << " head " << h << " slot " << i;
        }
      }
    }
  }
}

double dot(const float* a, const float* b, int n) {
  double s = 0;
  for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

// Softmax of scale * q.k_i over keys i in [0, n) of stream (l, hk).
std::vector<double> naive_softmax(const Context& x, int l, int hk, const float* q, int64_t n, double scale) {
  std::vector<double> p((size_t)n);
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; i++) mx = std::max(mx, p[(size_t)i] = scale * dot(q, x.key(l, hk, i), x.D()));
  double sum = 0;
  for (double& a : p) sum += (a = std::exp(a - mx));
  for (double& a : p) a /= sum;
  return p;
}

// torch avg_pool1d(k, stride 1, padding k/2), zero padding counted.
std::vector<double> naive_pool(const std::vector<double>& a, int k) {
  std::vector<double> out(a.size(), 0.0);
  for (int64_t i = 0; i < (int64_t)a.size(); i++)
    for (int64_t j = i - k / 2; j <= i + k / 2; j++)
      if (j >= 0 && j < (int64_t)a.size()) out[(size_t)i] += a[(size_t)j] / k;
  return out;
}

void naive_zscore(std::vector<double*> xs, size_t n_each) {
  double mean = 0, n = 0;
  for (double* x : xs)
    for (size_t i = 0; i < n_each; i++) mean += x[i], n++;
  mean /= n;
  double var = 0;
  for (double* x : xs)
    for (size_t i = 0; i < n_each; i++) var += (x[i] - mean) * (x[i] - mean);
  const double sd = std::max(std::sqrt(var / (n - 1)), 1e-6);
  for (double* x : xs)
    for (size_t i = 0; i < n_each; i++) x[i] = (x[i] - mean) / sd;
}

Scores naive_snapkv(const Context& x, int W = 64) {
  const int G = x.c.n_group(), D = x.D();
  Scores s((size_t)x.c.n_layer, std::vector<std::vector<double>>((size_t)x.c.n_head_kv));
  for (int l = 0; l < x.c.n_layer; l++)
    for (int hk = 0; hk < x.c.n_head_kv; hk++) {
      std::vector<double> acc((size_t)(x.T - W), 0.0);
      for (int g = 0; g < G; g++)
        for (int64_t j = x.T - W; j < x.T; j++) {
          const std::vector<double> p = naive_softmax(x, l, hk, x.query(l, hk * G + g, j), j + 1, 1.0 / std::sqrt((double)D));
          for (int64_t i = 0; i < x.T - W; i++) acc[(size_t)i] += p[(size_t)i] / W / G;
        }
      std::vector<double> pooled = naive_pool(acc, 5);
      pooled.resize((size_t)x.T, INFINITY);
      s[(size_t)l][(size_t)hk] = pooled;
    }
  return s;
}

// ---------------------------------------------------------------- shared arithmetic

TEST(BaselineMath, AveragePoolingAndZScoreMatchTorchDefinitions) {
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7};
  std::vector<float> out(x.size());
  avg_pool_same(x.data(), 7, 5, out.data());
  EXPECT_FLOAT_EQ(out[0], (1 + 2 + 3) / 5.0f);  // zero padding counts
  EXPECT_FLOAT_EQ(out[3], (2 + 3 + 4 + 5 + 6) / 5.0f);
  EXPECT_FLOAT_EQ(out[6], (5 + 6 + 7) / 5.0f);
  avg_pool_same(x.data(), 7, 3, out.data());
  EXPECT_FLOAT_EQ(out[0], 1.0f);
  std::vector<float> z = {1, 2, 3, 4};
  zscore_inplace(z.data(), 4);
  const double sd = std::sqrt((2.25 + 0.25 + 0.25 + 2.25) / 3.0);  // Bessel
  EXPECT_NEAR(z[0], -1.5 / sd, 1e-6);
  EXPECT_NEAR(z[3], 1.5 / sd, 1e-6);
}

TEST(BaselineMath, LeverageScoresMatchADirectInverse) {
  // With the identity as "sketch", the scores are exactly diag(X (X^T X + 0.01 I)^-1 X^T), X centred.
  const int n = 40, d = 6;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> keys((size_t)n * d);
  for (float& a : keys) a = nd(rng) + 3.0f;  // an offset that centring must remove
  keys[5 * d + 2] += 8.0f;                   // one outlier row
  std::vector<double> eye((size_t)d * d, 0.0);
  for (int i = 0; i < d; i++) eye[(size_t)i * d + i] = 1.0;
  std::vector<float> got((size_t)n);
  sketched_leverage(keys.data(), n, d, eye.data(), d, got.data());

  std::vector<double> mean((size_t)d, 0.0), X((size_t)n * d), A((size_t)d * 2 * d, 0.0);
  for (int i = 0; i < n; i++)
    for (int c = 0; c < d; c++) mean[(size_t)c] += keys[(size_t)(i * d + c)] / n;
  for (int i = 0; i < n; i++)
    for (int c = 0; c < d; c++) X[(size_t)(i * d + c)] = keys[(size_t)(i * d + c)] - mean[(size_t)c];
  // Gauss-Jordan on [X^T X + 0.01 I | I].
  for (int a = 0; a < d; a++) {
    for (int b = 0; b < d; b++) {
      double s = a == b ? 1e-2 : 0.0;
      for (int i = 0; i < n; i++) s += X[(size_t)(i * d + a)] * X[(size_t)(i * d + b)];
      A[(size_t)(a * 2 * d + b)] = s;
    }
    A[(size_t)(a * 2 * d + d + a)] = 1.0;
  }
  for (int col = 0; col < d; col++) {
    int piv = col;
    for (int r = col + 1; r < d; r++)
      if (std::fabs(A[(size_t)(r * 2 * d + col)]) > std::fabs(A[(size_t)(piv * 2 * d + col)])) piv = r;
    for (int c = 0; c < 2 * d; c++) std::swap(A[(size_t)(col * 2 * d + c)], A[(size_t)(piv * 2 * d + c)]);
    const double p = A[(size_t)(col * 2 * d + col)];
    for (int c = 0; c < 2 * d; c++) A[(size_t)(col * 2 * d + c)] /= p;
    for (int r = 0; r < d; r++)
      if (r != col) {
        const double f = A[(size_t)(r * 2 * d + col)];
        for (int c = 0; c < 2 * d; c++) A[(size_t)(r * 2 * d + c)] -= f * A[(size_t)(col * 2 * d + c)];
      }
  }
  double total = 0;
  for (int i = 0; i < n; i++) {
    double s = 0;
    for (int a = 0; a < d; a++)
      for (int b = 0; b < d; b++) s += X[(size_t)(i * d + a)] * A[(size_t)(a * 2 * d + d + b)] * X[(size_t)(i * d + b)];
    EXPECT_NEAR(got[(size_t)i], s, 1e-5 * std::max(1.0, s)) << i;
    total += s;
  }
  EXPECT_NEAR(total, d, 0.01);  // the trace of a projection (slightly less with the jitter)
  EXPECT_EQ(std::max_element(got.begin(), got.end()) - got.begin(), 5);
}

TEST(BaselineMath, WindowQueriesKeepTheLastRowsAcrossSteps) {
  const ModelConfig c = small_config();
  const Context x = make_context(c, 23, 1);
  for (int64_t step : {1, 3, 5, 23}) {
    WindowQueries w(c.n_layer, c.n_head, c.head_dim, 6);
    KvCache cache(c.n_layer, c.n_head_kv, c.head_dim);
    feed(cache, x, step, [&](const LayerStep& st) { w.push(st); });
    for (int l = 0; l < c.n_layer; l++) {
      ASSERT_EQ(w.size(l), 6);
      for (int j = 0; j < 6; j++) {
        EXPECT_EQ(w.positions(l)[j], 17 + j);
        EXPECT_EQ(w.rows(l)[(size_t)j * c.n_head * c.head_dim + 3], x.query(l, 0, 17 + j)[3]) << step;
      }
    }
  }
}

TEST(BaselineMath, RopeTableUndoesTheEngineRotation) {
  for (RopeMode mode : {RopeMode::HalfSplit, RopeMode::Adjacent}) {
    const ModelConfig c = small_config(mode);
    RopeTable rope(c);
    rope.reserve(100);
    std::vector<float> x = {0.3f, -1.f, 2.f, 0.5f, 0.f, 1.f, -0.7f, 0.2f}, y = x;
    rotate(c, y.data(), 77);
    rope.unrotate(y.data(), 77, 0);
    for (int i = 0; i < 8; i++) EXPECT_NEAR(y[(size_t)i], x[(size_t)i], 1e-4);
  }
}

TEST(BaselineMath, RopeTableUsesEachLayersBase) {
  // Gemma 3 style: layer 0 local (base 10^4), layer 1 global (base 10^6).
  ModelConfig c = small_config();
  c.layers.resize(2);
  c.layers[0].rope_base = 10000.0f;
  c.layers[1].rope_base = 1e6f;
  ModelConfig global = c;
  global.rope_base = 1e6f;
  RopeTable rope(c);
  rope.reserve(100);
  const std::vector<float> x = {0.3f, -1.f, 2.f, 0.5f, 0.f, 1.f, -0.7f, 0.2f};
  std::vector<float> y0 = x, y1 = x, wrong = x;
  rotate(c, y0.data(), 77);
  rotate(global, y1.data(), 77);
  rotate(global, wrong.data(), 77);
  rope.unrotate(y0.data(), 77, 0);
  rope.unrotate(y1.data(), 77, 1);
  rope.unrotate(wrong.data(), 77, 0);  // the other layer's base does not undo it
  double worst_wrong = 0;
  for (int i = 0; i < 8; i++) {
    EXPECT_NEAR(y0[(size_t)i], x[(size_t)i], 1e-4);
    EXPECT_NEAR(y1[(size_t)i], x[(size_t)i], 1e-4);
    worst_wrong = std::max(worst_wrong, (double)std::fabs(wrong[(size_t)i] - x[(size_t)i]));
  }
  EXPECT_GT(worst_wrong, 0.1);
  std::vector<double> c0, s0, c1, s1;
  rope.mean_rotation(0, 50, 10, c0, s0);
  rope.mean_rotation(1, 50, 10, c1, s1);
  EXPECT_NE(c0[1], c1[1]);  // frequency 1 turns at different rates under the two bases
  double want = 0;
  for (int p = 50; p < 60; p++) want += std::cos(rope_angle(global, p, 1)) / 10;
  EXPECT_NEAR(c1[1], want, 1e-5);
}

// ---------------------------------------------------------------- scorers vs their definitions

TEST(BaselineScorers, SnapKvIsWindowAttentionPooledAndGroupAveraged) {
  const ModelConfig c = small_config();
  const Context x = make_context(c, 100, 2);
  const Scores want = naive_snapkv(x);
  for (int64_t step : {100, 7, 1}) {
    auto s = make_snapkv_scorer(c);
    expect_scores_near(run_scorer(*s, x, step), want, 1e-4, "snapkv");
  }
  // Shorter than the window: an error, as kvpress asserts.
  auto s = make_snapkv_scorer(c);
  EXPECT_THROW(run_scorer(*s, make_context(c, 64, 3), 64), Error);
}

TEST(BaselineScorers, TovaIsTheLastTokensAttentionAveragedOverAllHeads) {
  const ModelConfig c = small_config();
  const Context x = make_context(c, 50, 4);
  Scores want((size_t)c.n_layer, std::vector<std::vector<double>>((size_t)c.n_head_kv));
  for (int l = 0; l < c.n_layer; l++) {
    std::vector<double> acc((size_t)x.T, 0.0);
    for (int hq = 0; hq < c.n_head; hq++) {
      const auto p = naive_softmax(x, l, hq / c.n_group(), x.query(l, hq, x.T - 1), x.T, 1.0 / std::sqrt(8.0));
      for (int64_t i = 0; i < x.T; i++) acc[(size_t)i] += p[(size_t)i] / c.n_head;
    }
    acc.back() = INFINITY;
    for (int hk = 0; hk < c.n_head_kv; hk++) want[(size_t)l][(size_t)hk] = acc;
  }
  for (int64_t step : {50, 6}) {
    auto s = make_tova_scorer(c);
    expect_scores_near(run_scorer(*s, x, step), want, 1e-4, "tova");
  }
}

TEST(BaselineScorers, ObservedAttentionAveragesTheAttentionEachKeyReceived) {
  const ModelConfig c = small_config();
  const Context x = make_context(c, 40, 5);
  const int G = c.n_group();
  Scores want((size_t)c.n_layer, std::vector<std::vector<double>>((size_t)c.n_head_kv, std::vector<double>((size_t)x.T, 0.0)));
  for (int l = 0; l < c.n_layer; l++)
    for (int hq = 0; hq < c.n_head; hq++)
      for (int64_t j = 0; j < x.T; j++) {
        const auto p = naive_softmax(x, l, hq / G, x.query(l, hq, j), j + 1, 1.0 / std::sqrt(8.0));
        for (int64_t i = 0; i <= j; i++) want[(size_t)l][(size_t)(hq / G)][(size_t)i] += p[(size_t)i] / (double)(x.T - i) / G;
      }
  for (int64_t step : {40, 9, 1}) {
    auto s = make_observed_attention_scorer(c);
    expect_scores_near(run_scorer(*s, x, step), want, 1e-4, "observed_attention");
  }
}

TEST(BaselineScorers, ExpectedAttentionUsesRotatedQueryStatisticsAndValueNorms) {
  for (RopeMode mode : {RopeMode::HalfSplit, RopeMode::Adjacent}) {
    const ModelConfig c = small_config(mode);
    const int64_t T = 60;
    const Context x = make_context(c, T, 6, /*rope=*/true, 0.7f);
    const int D = c.head_dim, G = c.n_group(), H = c.n_head;
    const double eps = 1e-2;
    // Rbar: the average over positions T .. T+511 of the full rotation matrices.
    std::vector<double> R((size_t)D * D, 0.0);
    for (int64_t p = T; p < T + 512; p++)
      for (int i = 0; i < D / 2; i++) {
        const auto [a, b] = rope_pair(c, i);
        const double th = rope_angle(c, p, i);
        R[(size_t)(a * D + a)] += std::cos(th) / 512;
        R[(size_t)(a * D + b)] -= std::sin(th) / 512;
        R[(size_t)(b * D + a)] += std::sin(th) / 512;
        R[(size_t)(b * D + b)] += std::cos(th) / 512;
      }
    Scores want((size_t)c.n_layer, std::vector<std::vector<double>>((size_t)c.n_head_kv)), plain = want;
    for (int l = 0; l < c.n_layer; l++)
      for (int hk = 0; hk < c.n_head_kv; hk++) {
        std::vector<double> acc((size_t)T, 0.0);
        for (int g = 0; g < G; g++) {
          const int hq = hk * G + g;
          std::vector<double> mu((size_t)D, 0.0), cov((size_t)D * D, 0.0);
          for (int64_t t = 4; t < T; t++)
            for (int a = 0; a < D; a++) mu[(size_t)a] += x.qpre[(size_t)l][(size_t)((t * H + hq) * D + a)] / (double)(T - 4);
          for (int64_t t = 4; t < T; t++)
            for (int a = 0; a < D; a++)
              for (int b = 0; b < D; b++)
                cov[(size_t)(a * D + b)] += (x.qpre[(size_t)l][(size_t)((t * H + hq) * D + a)] - mu[(size_t)a]) *
                                           (x.qpre[(size_t)l][(size_t)((t * H + hq) * D + b)] - mu[(size_t)b]) / (double)(T - 4);
          std::vector<double> mu2((size_t)D, 0.0), cov2((size_t)D * D, 0.0);
          for (int a = 0; a < D; a++)
            for (int b = 0; b < D; b++) mu2[(size_t)a] += R[(size_t)(a * D + b)] * mu[(size_t)b];
          for (int a = 0; a < D; a++)
            for (int b = 0; b < D; b++)
              for (int e = 0; e < D; e++)
                for (int f = 0; f < D; f++)
                  cov2[(size_t)(a * D + b)] += R[(size_t)(a * D + e)] * cov[(size_t)(e * D + f)] * R[(size_t)(b * D + f)];
          std::vector<double> logit((size_t)T, 0.0);
          double mx = -INFINITY, sum = 0;
          for (int64_t i = 4; i < T; i++) {
            const float* k = x.key(l, hk, i);
            double lin = 0, quad = 0;
            for (int a = 0; a < D; a++) lin += k[a] * mu2[(size_t)a];
            for (int a = 0; a < D; a++)
              for (int b = 0; b < D; b++) quad += k[a] * cov2[(size_t)(a * D + b)] * k[b];
            logit[(size_t)i] = lin / std::sqrt((double)D) + quad / (2.0 * D);
            mx = std::max(mx, logit[(size_t)i]);
          }
          for (int64_t i = 4; i < T; i++) sum += std::exp(logit[(size_t)i] - mx);
          for (int64_t i = 4; i < T; i++) acc[(size_t)i] += std::exp(logit[(size_t)i] - mx) / sum / G;
        }
        std::vector<double> s((size_t)T, INFINITY);
        for (int64_t i = 4; i < T; i++) s[(size_t)i] = (acc[(size_t)i] + eps) * std::sqrt(dot(x.value(l, hk, i), x.value(l, hk, i), D));
        want[(size_t)l][(size_t)hk] = s;
        for (int64_t i = 4; i < T; i++) s[(size_t)i] = acc[(size_t)i];  // use_vnorm off: the softmax alone
        plain[(size_t)l][(size_t)hk] = s;
      }
    for (int64_t step : {T, (int64_t)11}) {
      auto s = make_expected_attention_scorer(c, eps);
      expect_scores_near(run_scorer(*s, x, step), want, 2e-3, "expected_attention");
      auto p = make_expected_attention_scorer(c, eps, /*use_vnorm=*/false);
      expect_scores_near(run_scorer(*p, x, step), plain, 2e-3, "expected_attention without vnorm");
    }
  }
}

TEST(BaselineScorers, CriticalKvKeepsHalfTheBudgetThenWeighsByTheOutputProjectedValues) {
  // kvpress CriticalKVPress around ExpectedAttention without ||v|| (critical_expected_attention), with a
  // random W_O: the inner scores come from the scorer checked above; the CriticalKV step is written out here.
  const ModelConfig c = small_config();
  const int64_t T = 90;
  const Context x = make_context(c, T, 31, /*rope=*/true, 0.7f);
  const int D = c.head_dim, G = c.n_group(), E = c.n_embd, HD = c.n_head * c.head_dim;
  std::mt19937 rng(77);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  std::vector<std::vector<float>> wo((size_t)c.n_layer, std::vector<float>((size_t)E * HD));  // [layer][E][n_head * D]
  for (auto& w : wo)
    for (float& v : w) v = nd(rng);
  for (double ratio : {0.5, 0.25}) {
    auto inner = make_expected_attention_scorer(c, 1e-2, /*use_vnorm=*/false);
    const CacheScores s0 = run_scorer(*inner, x, T);
    Scores want((size_t)c.n_layer, std::vector<std::vector<double>>((size_t)c.n_head_kv));
    for (int l = 0; l < c.n_layer; l++) {
      double top = -INFINITY;  // the sinks enter with the layer's largest score + 1
      for (const auto& h : s0[(size_t)l])
        for (float v : h)
          if (std::isfinite(v)) top = std::max(top, (double)v);
      for (int hk = 0; hk < c.n_head_kv; hk++) {
        std::vector<double> s((size_t)T);
        for (int64_t i = 0; i < T; i++) s[(size_t)i] = std::isinf(s0[(size_t)l][(size_t)hk][(size_t)i]) ? (double)(float)(top + 1) : s0[(size_t)l][(size_t)hk][(size_t)i];
        const int64_t first = std::max<int64_t>(1, (int64_t)((1.0 - ratio) * (double)T * 0.5));
        const std::vector<int32_t> best = top_slots(s, first);
        std::vector<double>& w = want[(size_t)l][(size_t)hk];
        for (int64_t i = 0; i < T; i++) {
          double pn = 0;  // mean over the group of ||W_O^(q) v_i||_1
          for (int g = 0; g < G; g++)
            for (int e = 0; e < E; e++) {
              double y = 0;
              for (int d = 0; d < D; d++) y += (double)wo[(size_t)l][(size_t)(e * HD + (hk * G + g) * D + d)] * x.value(l, hk, i)[d];
              pn += std::fabs(y) / G;
            }
          w.push_back((s[(size_t)i] + 1e-4) * pn);
        }
        for (int32_t i : best) w[(size_t)i] = INFINITY;
      }
    }
    auto s = make_critical_scorer(make_expected_attention_scorer(c, 1e-2, false), c, wo, ratio);
    expect_scores_near(run_scorer(*s, x, T), want, 1e-4, "critical_expected_attention", 1e-7);
  }
}

TEST(BaselineScorers, KeyDiffIsMinusTheCosineToTheMeanNormalisedKey) {
  const ModelConfig c = small_config();
  const Context x = make_context(c, 30, 8);
  const int D = c.head_dim;
  Scores want((size_t)c.n_layer, std::vector<std::vector<double>>((size_t)c.n_head_kv));
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++) {
      std::vector<double> anchor((size_t)D, 0.0);
      for (int64_t i = 0; i < x.T; i++) {
        const double n = std::sqrt(dot(x.key(l, h, i), x.key(l, h, i), D));
        for (int d = 0; d < D; d++) anchor[(size_t)d] += x.key(l, h, i)[d] / n / (double)x.T;
      }
      double an = 0;
      for (double a : anchor) an += a * a;
      for (int64_t i = 0; i < x.T; i++) {
        double kd = 0;
        for (int d = 0; d < D; d++) kd += x.key(l, h, i)[d] * anchor[(size_t)d];
        want[(size_t)l][(size_t)h].push_back(-kd / std::sqrt(dot(x.key(l, h, i), x.key(l, h, i), D) * an));
      }
    }
  auto s = make_keydiff_scorer();
  expect_scores_near(run_scorer(*s, x, 30), want, 1e-5, "keydiff");
}

TEST(BaselineScorers, LagKvRanksTokensByTheirSpreadRelativeToTheNextPartition) {
  const ModelConfig c = small_config();
  const int64_t T = 4 + 3 * 128 + 10;  // partitions 0 and 1 scored; partition 2 + remainder kept
  const Context x = make_context(c, T, 9);
  const int D = c.head_dim;
  auto part_score = [&](int l, int h, bool keys, int64_t p0, int64_t t) {
    // std over channels of the token normalised by partition p0+128's per-channel min/max; then softmax.
    auto val = [&](int64_t i, int d) { return (double)(keys ? x.key(l, h, i) : x.value(l, h, i))[d]; };
    std::vector<double> stdv(128);
    for (int64_t u = 0; u < 128; u++) {
      std::vector<double> z((size_t)D);
      for (int d = 0; d < D; d++) {
        double lo = INFINITY, hi = -INFINITY;
        for (int64_t r = p0 + 128; r < p0 + 256; r++) lo = std::min(lo, val(r, d)), hi = std::max(hi, val(r, d));
        z[(size_t)d] = (val(p0 + u, d) - lo) / (hi - lo);
      }
      const double m = std::accumulate(z.begin(), z.end(), 0.0) / D;
      double var = 0;
      for (double a : z) var += (a - m) * (a - m);
      stdv[(size_t)u] = std::sqrt(var / (D - 1));
    }
    double sum = 0;
    for (double a : stdv) sum += std::exp(a);
    return std::exp(stdv[(size_t)t]) / sum;
  };
  Scores want((size_t)c.n_layer, std::vector<std::vector<double>>((size_t)c.n_head_kv));
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++) {
      std::vector<double> s((size_t)T, 1.0);
      for (int p = 0; p < 2; p++) {
        const int64_t p0 = 4 + p * 128;
        std::vector<double> sc(128);
        for (int64_t t = 0; t < 128; t++) sc[(size_t)t] = (part_score(l, h, true, p0, t) + part_score(l, h, false, p0, t)) / 2;
        for (int64_t t = 0; t < 128; t++) {
          int64_t rank = 0;  // how many tokens of the partition score lower
          for (int64_t u = 0; u < 128; u++) rank += sc[(size_t)u] < sc[(size_t)t] || (sc[(size_t)u] == sc[(size_t)t] && u < t);
          s[(size_t)(p0 + t)] = rank / 128.0;
        }
      }
      want[(size_t)l][(size_t)h] = s;
    }
  auto s = make_lagkv_scorer();
  expect_scores_near(run_scorer(*s, x, T), want, 1e-6, "lagkv");
  // cross_scoring: the averaged softmax itself, comparable across partitions.
  Scores cross = want;
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++)
      for (int p = 0; p < 2; p++)
        for (int64_t t = 0; t < 128; t++)
          cross[(size_t)l][(size_t)h][(size_t)(4 + p * 128 + t)] =
              (part_score(l, h, true, 4 + p * 128, t) + part_score(l, h, false, 4 + p * 128, t)) / 2;
  auto sc = make_lagkv_scorer(4, 128, true);
  expect_scores_near(run_scorer(*sc, x, T), cross, 1e-6, "lagkv cross_scoring");

  // Too short for two partitions: sinks 1, then the most recent tokens score highest.
  const Context shortx = make_context(c, 100, 10);
  const CacheScores got = run_scorer(*s, shortx, 100);
  for (int64_t i = 0; i < 100; i++) EXPECT_FLOAT_EQ(got[1][1][(size_t)i], i < 4 ? 1.0f : (float)(i - 4) / 96.0f);
}

// CurDKV by its definition: ||k||^2 and ||v||^2 each normalised within aligned windows of 16, combined by
// the leverage type, normalised to sum 1; the first 4 slots score 1.
// random_seed >= 0: kvpress's use_random_leverage, norms of x G for G = gaussian_sketch(seed, layer, 0, D, 20).
Scores naive_cur(const Context& x, int64_t T, CurLeverage type, int64_t random_seed = -1) {
  const ModelConfig& c = x.c;
  const int D = c.head_dim;
  Scores want((size_t)c.n_layer, std::vector<std::vector<double>>((size_t)c.n_head_kv));
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++) {
      std::vector<double> G;
      if (random_seed >= 0) G = gaussian_sketch((uint64_t)random_seed, l, 0, D, 20);
      auto energy = [&](const float* a) {
        if (G.empty()) return dot(a, a, D);
        double e = 0;
        for (int j = 0; j < 20; j++) {
          double p = 0;
          for (int d = 0; d < D; d++) p += (double)a[d] * G[(size_t)(d * 20 + j)];
          e += p * p;
        }
        return e;
      };
      std::vector<double> lev((size_t)T);
      for (int64_t i = 0; i < T; i++) {
        const int64_t w0 = i / 16 * 16, w1 = std::min<int64_t>(T, w0 + 16);
        double ks = 0, vs = 0;
        for (int64_t j = w0; j < w1; j++) ks += energy(x.key(l, h, j)), vs += energy(x.value(l, h, j));
        const double k = energy(x.key(l, h, i)) / ks, v = energy(x.value(l, h, i)) / vs;
        lev[(size_t)i] = type == CurLeverage::key ? k : type == CurLeverage::value ? v : type == CurLeverage::kv_avg ? (k + v) / 2 : k * v;
      }
      const double total = std::accumulate(lev.begin(), lev.end(), 0.0);
      for (int64_t i = 0; i < T; i++) want[(size_t)l][(size_t)h].push_back(i < 4 ? 1.0 : lev[(size_t)i] / total);
    }
  return want;
}

TEST(BaselineScorers, CurMultipliesWindowNormalisedKeyAndValueEnergies) {
  const ModelConfig c = small_config();
  const int64_t T = 45;  // two full windows of 16 and a partial one
  const Context x = make_context(c, T, 11);
  auto s = make_cur_scorer();
  expect_scores_near(run_scorer(*s, x, T), naive_cur(x, T, CurLeverage::kv_product), 1e-5, "cur");
}

TEST(BaselineScorers, CurLeverageTypesScoreKeysValuesOrTheirMean) {
  const ModelConfig c = small_config();
  const int64_t T = 45;
  const Context x = make_context(c, T, 11);
  for (CurLeverage type : {CurLeverage::key, CurLeverage::value, CurLeverage::kv_avg}) {
    auto s = make_cur_scorer(4, 16, true, type);
    expect_scores_near(run_scorer(*s, x, T), naive_cur(x, T, type), 1e-5,
                       ("cur leverage_type " + std::to_string((int)type)).c_str());
  }
}

TEST(BaselineScorers, CurRandomLeverageProjectsThroughTheSeededSketch) {
  const ModelConfig c = small_config();
  const int64_t T = 45;
  const Context x = make_context(c, T, 11);
  auto s = make_cur_scorer(4, 16, true, CurLeverage::kv_product, /*use_random_leverage=*/true, /*seed=*/7);
  const CacheScores got = run_scorer(*s, x, T);
  expect_scores_near(got, naive_cur(x, T, CurLeverage::kv_product, 7), 1e-5, "cur use_random_leverage");
  // Not the plain norms, and another seed draws another projection.
  auto other = make_cur_scorer(4, 16, true, CurLeverage::kv_product, true, 8);
  const Scores plain = naive_cur(x, T, CurLeverage::kv_product);
  const CacheScores got8 = run_scorer(*other, x, T);
  double d_plain = 0, d_seed = 0;
  for (size_t l = 0; l < got.size(); l++)
    for (size_t h = 0; h < got[l].size(); h++)
      for (size_t i = 4; i < got[l][h].size(); i++)
        d_plain += std::fabs(got[l][h][i] - plain[l][h][i]), d_seed += std::fabs(got[l][h][i] - got8[l][h][i]);
  EXPECT_GT(d_plain, 1e-3);
  EXPECT_GT(d_seed, 1e-3);
}

// Leverage of the pre-RoPE keys of slots [first, first + n) of stream (l, hk) (the cached keys rotated
// back), centred, through the sketch phi [D][k]: x_i^T (X^T X + 0.01 I)^-1 x_i with the inverse by
// Gauss-Jordan (kvpress LeverageScorePress's definition, its first jitter).
std::vector<double> naive_leverage(const Context& x, int l, int hk, int64_t first, int64_t n, const std::vector<double>& phi, int k) {
  const ModelConfig& c = x.c;
  const int D = c.head_dim;
  std::vector<double> K((size_t)(n * D)), mean((size_t)D, 0.0);
  for (int64_t i = 0; i < n; i++) {
    std::vector<float> key(x.key(l, hk, first + i), x.key(l, hk, first + i) + D);
    rotate(c, key.data(), first + i, -1.0);
    for (int d = 0; d < D; d++) K[(size_t)(i * D + d)] = key[(size_t)d], mean[(size_t)d] += key[(size_t)d] / (double)n;
  }
  std::vector<double> X((size_t)(n * k), 0.0);
  for (int64_t i = 0; i < n; i++)
    for (int d = 0; d < D; d++)
      for (int j = 0; j < k; j++) X[(size_t)(i * k + j)] += (K[(size_t)(i * D + d)] - mean[(size_t)d]) * phi[(size_t)(d * k + j)];
  std::vector<double> A((size_t)(k * 2 * k), 0.0);  // [G + 0.01 I | I] -> [I | (G + 0.01 I)^-1]
  for (int a = 0; a < k; a++) {
    for (int b = 0; b < k; b++) {
      double s = a == b ? 1e-2 : 0.0;
      for (int64_t i = 0; i < n; i++) s += X[(size_t)(i * k + a)] * X[(size_t)(i * k + b)];
      A[(size_t)(a * 2 * k + b)] = s;
    }
    A[(size_t)(a * 2 * k + k + a)] = 1;
  }
  for (int col = 0; col < k; col++) {
    const double p = A[(size_t)(col * 2 * k + col)];
    for (int cc = 0; cc < 2 * k; cc++) A[(size_t)(col * 2 * k + cc)] /= p;
    for (int r = 0; r < k; r++)
      if (r != col) {
        const double f = A[(size_t)(r * 2 * k + col)];
        for (int cc = 0; cc < 2 * k; cc++) A[(size_t)(r * 2 * k + cc)] -= f * A[(size_t)(col * 2 * k + cc)];
      }
  }
  std::vector<double> out((size_t)n);
  for (int64_t i = 0; i < n; i++) {
    double s = 0;
    for (int a = 0; a < k; a++)
      for (int b = 0; b < k; b++) s += X[(size_t)(i * k + a)] * A[(size_t)(a * 2 * k + k + b)] * X[(size_t)(i * k + b)];
    out[(size_t)i] = std::max(0.0, s);
  }
  return out;
}

TEST(BaselineScorers, CompactorBlendsLeverageAndTiledNonCausalAttention) {
  const ModelConfig c = small_config();
  const int64_t T = 8 + 256 + 90 + 4;  // one full tile and a partial one between the protected ends
  const Context x = make_context(c, T, 12, /*rope=*/true, 0.5f);
  const int D = c.head_dim, G = c.n_group(), Hkv = c.n_head_kv;
  const double blend = 0.4;
  const uint64_t seed = 5;
  const int64_t left = 8, right = 4, S = T - left - right;
  Scores want((size_t)c.n_layer, std::vector<std::vector<double>>((size_t)Hkv, std::vector<double>((size_t)T, INFINITY)));
  for (int l = 0; l < c.n_layer; l++) {
    std::vector<std::vector<double>> lev((size_t)Hkv, std::vector<double>((size_t)S)), att = lev;
    for (int hk = 0; hk < Hkv; hk++) {
      lev[(size_t)hk] = naive_leverage(x, l, hk, left, S, gaussian_sketch(seed, l, hk, D, 48), 48);
      // Non-causal attention within tiles [8, 264) and [264, T - 4), unscaled logits.
      std::vector<double> a((size_t)S, 0.0);
      for (int64_t t0 = left; t0 < T - right; t0 += 256) {
        const int64_t t1 = std::min(T - right, t0 + 256);
        for (int g = 0; g < G; g++)
          for (int64_t j = t0; j < t1; j++) {
            std::vector<double> p;
            double mx = -INFINITY, sum = 0;
            for (int64_t i = t0; i < t1; i++) p.push_back(dot(x.query(l, hk * G + g, j), x.key(l, hk, i), D)), mx = std::max(mx, p.back());
            for (double& e : p) sum += (e = std::exp(e - mx));
            for (int64_t i = t0; i < t1; i++) a[(size_t)(i - left)] += p[(size_t)(i - t0)] / sum / G;
          }
      }
      for (int64_t i = 0; i < S; i++) a[(size_t)i] *= std::sqrt(dot(x.value(l, hk, left + i), x.value(l, hk, left + i), D));
      att[(size_t)hk] = naive_pool(a, 3);
    }
    std::vector<double*> lp, ap;
    for (int hk = 0; hk < Hkv; hk++) lp.push_back(lev[(size_t)hk].data()), ap.push_back(att[(size_t)hk].data());
    naive_zscore(lp, (size_t)S);
    naive_zscore(ap, (size_t)S);
    for (int hk = 0; hk < Hkv; hk++)
      for (int64_t i = 0; i < S; i++) want[(size_t)l][(size_t)hk][(size_t)(left + i)] = blend * lev[(size_t)hk][(size_t)i] + att[(size_t)hk][(size_t)i];
  }
  // The tiles are consumed during the prefill: any step size gives the same scores.
  for (int64_t step : std::vector<int64_t>{T, 100, 37, 1}) {
    auto s = make_compactor_scorer(c, blend, seed);
    expect_scores_near(run_scorer(*s, x, step), want, 2e-3, "compactor", 2e-3);
  }
}

}  // namespace
namespace kvzap {
std::unique_ptr<Scorer> make_leverage_score_scorer(const ModelConfig& c, uint64_t seed, int sketch_dimension = 48);  // press/scorer_leverage_score.cpp
}  // namespace kvzap
namespace {

TEST(BaselineScorers, LeverageScoreIsSketchedPreRopeKeyLeverageZScoredPerLayer) {
  // kvpress LeverageScorePress: every position scored (no protected ends), z-scored over the layer.
  const ModelConfig c = small_config();
  const int64_t T = 150;
  const Context x = make_context(c, T, 21, /*rope=*/true, 0.5f);
  const int Hkv = c.n_head_kv;
  const uint64_t seed = 9;
  Scores want((size_t)c.n_layer, std::vector<std::vector<double>>((size_t)Hkv));
  for (int l = 0; l < c.n_layer; l++) {
    std::vector<double*> ptrs;
    for (int hk = 0; hk < Hkv; hk++) {
      want[(size_t)l][(size_t)hk] = naive_leverage(x, l, hk, 0, T, gaussian_sketch(seed, l, hk, c.head_dim, 48), 48);
      ptrs.push_back(want[(size_t)l][(size_t)hk].data());
    }
    naive_zscore(ptrs, (size_t)T);
  }
  for (int64_t step : {T, (int64_t)16}) {
    auto s = make_leverage_score_scorer(c, seed);
    expect_scores_near(run_scorer(*s, x, step), want, 2e-3, "leverage_score", 2e-3);
  }
}

TEST(BaselineScorers, NonCausalAttnPadsTheLastTileAsKvpress) {
  // kvpress 0.5.5 NonCausalAttnPress, written out on a padded 256 x 256 tile: the last tile's missing
  // rows are zero queries and its missing keys zero keys; padding rows get logit 0 everywhere, padding
  // columns -1e-9 (== 0 once exponentiated in f32). Tiles start at position 0; nothing is protected.
  const ModelConfig c = small_config();
  const int64_t T = 256 + 90;
  const Context x = make_context(c, T, 17, /*rope=*/true, 0.5f);
  const int D = c.head_dim, G = c.n_group(), Hkv = c.n_head_kv;
  Scores want((size_t)c.n_layer, std::vector<std::vector<double>>((size_t)Hkv));
  for (int l = 0; l < c.n_layer; l++) {
    std::vector<std::vector<double>> att((size_t)Hkv, std::vector<double>((size_t)T, 0.0));
    for (int hk = 0; hk < Hkv; hk++) {
      for (int64_t t0 = 0; t0 < T; t0 += 256) {
        for (int g = 0; g < G; g++)
          for (int64_t r = 0; r < 256; r++) {  // every row of the padded tile
            const int64_t j = t0 + r;
            std::vector<double> logit(256, 0.0);
            for (int64_t i = 0; i < 256; i++)
              if (j < T && t0 + i < T) logit[(size_t)i] = dot(x.query(l, hk * G + g, j), x.key(l, hk, t0 + i), D);
            double mx = -INFINITY, sum = 0;
            for (double v : logit) mx = std::max(mx, v);
            for (double& v : logit) sum += (v = std::exp(v - mx));
            for (int64_t i = 0; i < 256 && t0 + i < T; i++) att[(size_t)hk][(size_t)(t0 + i)] += logit[(size_t)i] / sum / G;
          }
      }
      for (int64_t i = 0; i < T; i++) att[(size_t)hk][(size_t)i] *= std::sqrt(dot(x.value(l, hk, i), x.value(l, hk, i), D));
      att[(size_t)hk] = naive_pool(att[(size_t)hk], 3);
    }
    std::vector<double*> ap;
    for (int hk = 0; hk < Hkv; hk++) ap.push_back(att[(size_t)hk].data());
    naive_zscore(ap, (size_t)T);
    for (int hk = 0; hk < Hkv; hk++) want[(size_t)l][(size_t)hk] = att[(size_t)hk];
  }
  for (int64_t step : std::vector<int64_t>{T, 100, 1}) {
    auto s = make_non_causal_scorer(c, {.sink_start = 0, .sink_end = 0, .leverage = false, .pad_last_tile = true});
    expect_scores_near(run_scorer(*s, x, step), want, 2e-3, "non_causal_attn", 2e-3);
  }
  // Without the padding (the real rows of the last tile only) the scores differ: the check can fail.
  auto plain = make_non_causal_scorer(c, {.sink_start = 0, .sink_end = 0, .leverage = false, .pad_last_tile = false});
  const CacheScores got = run_scorer(*plain, x, T);
  double worst = 0;
  for (int64_t i = 256; i < T; i++) worst = std::max(worst, std::fabs(got[0][0][(size_t)i] - want[0][0][(size_t)i]));
  EXPECT_GT(worst, 1e-2);
}

}  // namespace
namespace kvzap {
std::unique_ptr<Scorer> make_cap_scorer(const ModelConfig& c, double tau = 5.0, int64_t n_future_positions = 512,
                                        int64_t n_sink = 4, double epsilon = 1e-6);  // press/scorer_cap.cpp
std::unique_ptr<Scorer> make_block_keydiff_scorer(int64_t block_size = 128);            // press/scorer_block_keydiff.cpp
}  // namespace kvzap
namespace {

TEST(BaselineScorers, CapWeighsValueLeverageByAnchorSimilarity) {
  // kvpress CapPress written out: anchor = mean over future positions T..T+511 of the mean pre-RoPE query
  // rotated there; w = exp(5 cos - max); M = I + sum (w + 1e-6) v v^T, inverted by Gauss-Jordan.
  const ModelConfig c = small_config();
  const int64_t T = 150;
  const Context x = make_context(c, T, 23, /*rope=*/true, 0.5f);
  const int D = c.head_dim, G = c.n_group(), Hkv = c.n_head_kv, H = c.n_head;
  Scores want((size_t)c.n_layer, std::vector<std::vector<double>>((size_t)Hkv, std::vector<double>((size_t)T, INFINITY)));
  for (int l = 0; l < c.n_layer; l++)
    for (int hk = 0; hk < Hkv; hk++) {
      std::vector<double> acc((size_t)T, 0.0);
      for (int g = 0; g < G; g++) {
        const int hq = hk * G + g;
        std::vector<float> mu((size_t)D, 0.0f);
        for (int64_t t = 4; t < T; t++)
          for (int d = 0; d < D; d++) mu[(size_t)d] += x.qpre[(size_t)l][(size_t)((t * H + hq) * D + d)] / (float)(T - 4);
        std::vector<double> a((size_t)D, 0.0);
        for (int64_t p = T; p < T + 512; p++) {
          std::vector<float> r = mu;
          rotate(c, r.data(), p);
          for (int d = 0; d < D; d++) a[(size_t)d] += r[(size_t)d] / 512.0;
        }
        std::vector<double> w((size_t)T, 0.0);
        double mx = -INFINITY;
        for (int64_t i = 4; i < T; i++) {
          const float* k = x.key(l, hk, i);
          double dp = 0, an = 0, kn = 0;
          for (int d = 0; d < D; d++) dp += a[(size_t)d] * k[d], an += a[(size_t)d] * a[(size_t)d], kn += (double)k[d] * k[d];
          w[(size_t)i] = 5.0 * dp / std::sqrt(an) / std::sqrt(kn);
          mx = std::max(mx, w[(size_t)i]);
        }
        std::vector<double> A((size_t)(D * 2 * D), 0.0);
        for (int r = 0; r < D; r++) A[(size_t)(r * 2 * D + r)] = 1.0, A[(size_t)(r * 2 * D + D + r)] = 1.0;
        for (int64_t i = 4; i < T; i++) {
          w[(size_t)i] = std::exp(w[(size_t)i] - mx);
          const float* v = x.value(l, hk, i);
          for (int r = 0; r < D; r++)
            for (int q = 0; q < D; q++) A[(size_t)(r * 2 * D + q)] += (w[(size_t)i] + 1e-6) * v[r] * v[q];
        }
        for (int col = 0; col < D; col++) {
          const double pv = A[(size_t)(col * 2 * D + col)];
          for (int cc = 0; cc < 2 * D; cc++) A[(size_t)(col * 2 * D + cc)] /= pv;
          for (int r = 0; r < D; r++)
            if (r != col) {
              const double f = A[(size_t)(r * 2 * D + col)];
              for (int cc = 0; cc < 2 * D; cc++) A[(size_t)(r * 2 * D + cc)] -= f * A[(size_t)(col * 2 * D + cc)];
            }
        }
        for (int64_t i = 4; i < T; i++) {
          const float* v = x.value(l, hk, i);
          double lev = 0;
          for (int r = 0; r < D; r++)
            for (int q = 0; q < D; q++) lev += v[r] * A[(size_t)(r * 2 * D + D + q)] * v[q];
          acc[(size_t)i] += w[(size_t)i] * lev / G;
        }
      }
      for (int64_t i = 4; i < T; i++) want[(size_t)l][(size_t)hk][(size_t)i] = acc[(size_t)i];
    }
  for (int64_t step : std::vector<int64_t>{T, 7}) {
    auto s = make_cap_scorer(c);
    expect_scores_near(run_scorer(*s, x, step), want, 2e-3, "cap", 1e-6);
  }
}

TEST(BaselineScorers, BlockKeyDiffKeepsItsBudgetBlockByBlock) {
  // kvpress BlockPress(KeyDiffPress, 128) written out: start from the first n entries, then for each next
  // block score kept + block with KeyDiff over those entries only and keep the n best.
  const ModelConfig c = small_config();
  const int64_t T = 300;
  const Context x = make_context(c, T, 29, /*rope=*/true);
  const double ratio = 0.5;
  const int64_t n = (int64_t)((double)T * (1.0 - ratio));
  const auto kept = run_ratio(make_block_keydiff_scorer(), x, ratio, "global");  // its own budget: scope ignored
  bool differs_from_plain_keydiff = false;
  for (int l = 0; l < c.n_layer; l++)
    for (int hk = 0; hk < c.n_head_kv; hk++) {
      std::vector<int32_t> cur((size_t)n);
      std::iota(cur.begin(), cur.end(), 0);
      for (int64_t i = n; i < T; i += 128) {
        std::vector<int32_t> cand = cur;
        for (int64_t j = i; j < std::min<int64_t>(i + 128, T); j++) cand.push_back((int32_t)j);
        std::vector<double> anchor((size_t)c.head_dim, 0.0), s;
        for (int32_t p : cand) {
          const double nk = std::sqrt(dot(x.key(l, hk, p), x.key(l, hk, p), c.head_dim));
          for (int d = 0; d < c.head_dim; d++) anchor[(size_t)d] += x.key(l, hk, p)[d] / nk / (double)cand.size();
        }
        double an = 0;
        for (double a : anchor) an += a * a;
        for (int32_t p : cand) {
          double dp = 0;
          for (int d = 0; d < c.head_dim; d++) dp += x.key(l, hk, p)[d] * anchor[(size_t)d];
          s.push_back(-dp / std::sqrt(dot(x.key(l, hk, p), x.key(l, hk, p), c.head_dim)) / std::sqrt(an));
        }
        std::vector<int32_t> best;
        for (int64_t r : top_slots(s, n)) best.push_back(cand[(size_t)r]);
        cur = best;
      }
      std::sort(cur.begin(), cur.end());
      EXPECT_EQ(kept[(size_t)l][(size_t)hk], cur) << "layer " << l << " head " << hk;
      const auto plain = run_ratio(make_keydiff_scorer(), x, ratio, "head");
      differs_from_plain_keydiff |= plain[(size_t)l][(size_t)hk] != cur;
    }
  EXPECT_TRUE(differs_from_plain_keydiff);  // the blocks matter: the control can tell the two apart
}

// ---------------------------------------------------------------- budgets

TEST(BaselineBudgets, PyramidBudgetsFollowKvpressFormula) {
  // T = 300, ratio 0.5, window 64, beta 20: capacity 214, min 7.5 and max 292.5, max clipped to
  // T - window = 236 so min = 2 * 150 - 236 = 64; 30 layers step down by 172 / 29.
  EXPECT_EQ(pyramid_layer_budget(300, 0.5, 0, 30), 236);
  EXPECT_EQ(pyramid_layer_budget(300, 0.5, 29, 30), 64);
  EXPECT_EQ(pyramid_layer_budget(300, 0.5, 1, 30), 230);  // 236 - 5.93 = 230.07
  EXPECT_EQ(pyramid_layer_budget(300, 0.5, 15, 30), 147);  // 236 - 88.97 = 147.03
  // T = 100: max clips to 36 < min 64, infeasible -> uniform round(T * (1 - ratio)), halves to even.
  EXPECT_EQ(pyramid_layer_budget(100, 0.5, 0, 30), 50);
  EXPECT_EQ(pyramid_layer_budget(101, 0.5, 3, 30), 50);  // round(50.5) = 50
  EXPECT_EQ(pyramid_layer_budget(103, 0.5, 3, 30), 52);  // round(51.5) = 52
  // No clipping: T = 2000, ratio 0.9: capacity 264, min 10 < window -> infeasible -> 200.
  EXPECT_EQ(pyramid_layer_budget(2000, 0.9, 0, 30), 200);
  // T = 2000, ratio 0.3: capacity 1464, min 70, max 2730 -> clipped 1936, min 864; layer 0 1936.
  EXPECT_EQ(pyramid_layer_budget(2000, 0.3, 0, 30), 1936);
  EXPECT_EQ(pyramid_layer_budget(2000, 0.3, 29, 30), 864);
}

TEST(BaselineBudgets, PyramidKvKeepsItsLayerBudgetOfTheBestSnapKvScoresPerHead) {
  const ModelConfig c = small_config();  // 2 layers: layer 0 keeps max, layer 1 keeps min
  const Context x = make_context(c, 300, 13);
  const Scores snap = naive_snapkv(x);
  const auto kept = run_ratio(make_pyramidkv_scorer(c), x, 0.5, "global");
  for (int l = 0; l < 2; l++)
    for (int h = 0; h < c.n_head_kv; h++) {
      const int64_t keep = l == 0 ? 236 : 64;
      EXPECT_EQ(kept[(size_t)l][(size_t)h], top_slots(snap[(size_t)l][(size_t)h], keep)) << l << " " << h;
    }
}

// On a model with sliding-window layers the pyramid spans the judged (global) layers only, so their mean
// budget is still the ratio's: 4 layers, the last one sliding; layers 0..2 keep 236, 150, 64 of 300
// (spread over all 4 layers they would keep 236, 179, 121: 40 % evicted instead of 50 %).
TEST(BaselineBudgets, PyramidKvSpansTheJudgedLayersOnly) {
  ModelConfig c = small_config();
  c.n_layer = 4;
  const Context x = make_context(c, 300, 17);
  PressSpec o;
  o.name = "pyramidkv";
  o.has_ratio = true;
  o.ratio = 0.5;
  RatioPress press(make_pyramidkv_scorer(c), o);
  KvCache cache(c.n_layer, c.n_head_kv, c.head_dim);
  cache.set_layer_windows({0, 0, 0, 1000});  // layer 3 slides (its window holds the whole context here)
  press.start_context();
  feed(cache, x, 1000000, [&](const LayerStep& st) { press.after_attention(st, cache); });
  press.finish_context(cache, nullptr);
  const int64_t want[4] = {236, 150, 64, 300};
  for (int l = 0; l < 4; l++)
    for (int h = 0; h < c.n_head_kv; h++) EXPECT_EQ(cache.length(l, h), want[l]) << "layer " << l << " head " << h;
}

TEST(BaselineBudgets, AdaKvPoolsALayersBudgetWithASafeguardPerHead) {
  // Layer 0: head 0 scores far below head 1, so without the safeguard head 0 would lose everything.
  const int T = 50;
  KvCache cache(2, 2, 4);
  std::vector<float> kv((size_t)T * 2 * 4, 0.5f);
  std::vector<int32_t> pos(T);
  std::iota(pos.begin(), pos.end(), 0);
  for (int l = 0; l < 2; l++) cache.append_layer(l, T, kv.data(), kv.data(), pos.data());
  cache.set_n_past(T);
  CacheScores s(2, std::vector<std::vector<float>>(2, std::vector<float>(T)));
  for (int i = 0; i < T; i++) {
    s[0][0][(size_t)i] = (float)i;          // low
    s[0][1][(size_t)i] = 1000.0f + (float)i;  // high
    s[1][0][(size_t)i] = (float)((i * 7) % T);
    s[1][1][(size_t)i] = (float)((i * 13) % T) + 0.5f;
  }
  const double ratio = 0.7;
  EvictionMask drop = empty_mask(cache);
  mark_lowest(cache, s, ratio, RatioScope::AdaKv, drop);
  // Per head: n_kept = int(50 * 0.3) = 15, n_safe = int(15 * 0.2) = 3; the layer evicts 2 * 35 = 70.
  auto count = [&](int l, int h) { return (int)std::count(drop[(size_t)l * 2 + h].begin(), drop[(size_t)l * 2 + h].end(), 1); };
  EXPECT_EQ(count(0, 0) + count(0, 1), 70);
  EXPECT_EQ(count(0, 0), T - 3);  // only its 3 safeguarded best survive
  EXPECT_EQ(count(0, 1), 70 - (T - 3));
  for (int i = T - 3; i < T; i++) EXPECT_EQ(drop[0][(size_t)i], 0) << i;
  // Layer 1: the 70 lowest of the 100 scores, since no safeguarded entry is among them here.
  std::vector<std::pair<float, int>> all;
  for (int h = 0; h < 2; h++)
    for (int i = 0; i < T; i++) all.push_back({s[1][(size_t)h][(size_t)i], h * T + i});
  std::sort(all.begin(), all.end());
  for (int r = 0; r < 100; r++) EXPECT_EQ(drop[(size_t)2 + all[(size_t)r].second / T][(size_t)(all[(size_t)r].second % T)], r < 70 ? 1 : 0) << r;
  EXPECT_EQ(parse_ratio_scope("adakv"), RatioScope::AdaKv);
  // alpha_safeguard (kvpress AdaKVPress): 0.5 protects int(15 * 0.5) = 7 of head 0; 0 protects none (head 0
  // loses everything, no max(1, ...)); 0.01 protects at least 1.
  auto low_head_kept = [&](double alpha) {
    EvictionMask d = empty_mask(cache);
    mark_lowest(cache, s, ratio, RatioScope::AdaKv, d, false, alpha);
    return T - (int)std::count(d[0].begin(), d[0].end(), 1);
  };
  EXPECT_EQ(low_head_kept(0.5), 7);
  EXPECT_EQ(low_head_kept(0.0), 0);
  EXPECT_EQ(low_head_kept(0.01), 1);
}

TEST(BaselineBudgets, AdaKvWrapperAndChunkKvUnderTheRatioPolicy) {
  const ModelConfig c = small_config();
  const Context x = make_context(c, 150, 14);
  const Scores snap = naive_snapkv(x);
  // AdaKV(SnapKV): at most T - int(T * 0.5) evicted per head on average, pooled within each layer.
  const auto kept = run_ratio(make_adakv_scorer(make_snapkv_scorer(c)), x, 0.5, "global", 40);
  for (int l = 0; l < 2; l++) {
    std::vector<std::pair<double, int>> all;
    for (int h = 0; h < 2; h++)
      for (int i = 0; i < 150; i++) all.push_back({-snap[(size_t)l][(size_t)h][(size_t)i], h * 150 + i});
    std::stable_sort(all.begin(), all.end());  // best first
    std::set<int> want;
    for (int r = 0; r < 150; r++) want.insert(all[(size_t)r].second);  // safeguard (15 per head) not binding here
    std::set<int> got;
    for (int h = 0; h < 2; h++)
      for (int32_t p : kept[(size_t)l][(size_t)h]) got.insert(h * 150 + p);
    EXPECT_EQ(got, want) << "layer " << l;
  }
  // ChunkKV: 8 chunks (7 of 20 + one of 10), keeps int(8 * 0.5) = 4 by mean of SnapKV summed over heads.
  const auto ck = run_ratio(make_chunkkv_scorer(c), x, 0.5, "global");
  for (int l = 0; l < 2; l++) {
    double top = -INFINITY;
    for (int h = 0; h < 2; h++)
      for (double v : snap[(size_t)l][(size_t)h])
        if (std::isfinite(v)) top = std::max(top, v);
    std::vector<std::pair<double, int>> chunks;
    for (int ci = 0; ci < 8; ci++) {
      double m = 0;
      const int c0 = ci * 20, c1 = std::min(150, c0 + 20);
      for (int i = c0; i < c1; i++)
        for (int h = 0; h < 2; h++) m += std::isinf(snap[(size_t)l][(size_t)h][(size_t)i]) ? top + 1 : snap[(size_t)l][(size_t)h][(size_t)i];
      chunks.push_back({-m / (c1 - c0), ci});
    }
    std::sort(chunks.begin(), chunks.end());
    std::vector<int32_t> want;
    for (int r = 0; r < 4; r++)
      for (int i = chunks[(size_t)r].second * 20; i < std::min(150, chunks[(size_t)r].second * 20 + 20); i++) want.push_back(i);
    std::sort(want.begin(), want.end());
    EXPECT_EQ(ck[(size_t)l][0], want) << "layer " << l;
    EXPECT_EQ(ck[(size_t)l][1], want) << "layer " << l;
  }
}


TEST(BaselineBudgets, CriticalAdaKvSplitsTheLayerBudgetThenKeepsHalfOfEachHeadsShareOutright) {
  // kvpress CriticalAdaKVPress around ExpectedAttention without ||v||, written out per layer: safeguards,
  // per-head budgets from the layer's best n H, a first stage of half each budget, then (s + 1e-4) x pn.
  const ModelConfig c = small_config();
  const int64_t T = 90;
  const Context x = make_context(c, T, 41, /*rope=*/true, 0.7f);
  const int D = c.head_dim, G = c.n_group(), E = c.n_embd, HD = c.n_head * c.head_dim, H = c.n_head_kv;
  std::mt19937 rng(78);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  std::vector<std::vector<float>> wo((size_t)c.n_layer, std::vector<float>((size_t)E * HD));  // [layer][E][n_head * D]
  for (auto& w : wo)
    for (float& v : w) v = nd(rng);
  auto inner = make_expected_attention_scorer(c, 1e-2, /*use_vnorm=*/false);
  const CacheScores s0 = run_scorer(*inner, x, T);
  bool uneven = false;  // somewhere the heads' budgets differ (else this would be the head scope)
  for (double ratio : {0.5, 0.8}) {
    SCOPED_TRACE(ratio);
    const int64_t n = std::max<int64_t>(1, (int64_t)((double)T * (1.0 - ratio)));
    const int64_t n_safe = std::max<int64_t>(1, (int64_t)((double)n * 0.2));
    const double big = 1e30;  // stands for kvpress's finfo.max
    std::vector<std::vector<std::vector<int32_t>>> want((size_t)c.n_layer);
    for (int l = 0; l < c.n_layer; l++) {
      double top = -INFINITY;
      for (const auto& h : s0[(size_t)l])
        for (float v : h)
          if (std::isfinite(v)) top = std::max(top, (double)v);
      std::vector<std::vector<double>> s((size_t)H, std::vector<double>((size_t)T));
      std::vector<std::pair<double, int>> all;
      for (int h = 0; h < H; h++) {
        for (int64_t i = 0; i < T; i++) {
          const float v = s0[(size_t)l][(size_t)h][(size_t)i];
          s[(size_t)h][(size_t)i] = std::isinf(v) ? (double)(float)(top + 1) : v;
        }
        for (int32_t i : top_slots(s[(size_t)h], n_safe)) s[(size_t)h][(size_t)i] = big;
        for (int64_t i = 0; i < T; i++) all.push_back({s[(size_t)h][(size_t)i], h});
      }
      std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      std::vector<int64_t> budget((size_t)H, 0);
      for (int64_t i = 0; i < n * H; i++) budget[(size_t)all[(size_t)i].second]++;
      int64_t total = 0;
      for (int h = 0; h < H; h++) {
        total += budget[(size_t)h];
        EXPECT_GE(budget[(size_t)h], n_safe);
        for (int32_t i : top_slots(s[(size_t)h], budget[(size_t)h] / 2)) s[(size_t)h][(size_t)i] = big;
        std::vector<double> y((size_t)T);
        for (int64_t i = 0; i < T; i++) {
          double pn = 0;
          for (int g = 0; g < G; g++)
            for (int e = 0; e < E; e++) {
              double v = 0;
              for (int d = 0; d < D; d++) v += (double)wo[(size_t)l][(size_t)(e * HD + (h * G + g) * D + d)] * x.value(l, h, i)[d];
              pn += std::fabs(v) / G;
            }
          y[(size_t)i] = s[(size_t)h][(size_t)i] >= big ? INFINITY : (s[(size_t)h][(size_t)i] + 1e-4) * pn;
        }
        want[(size_t)l].push_back(top_slots(y, budget[(size_t)h]));
      }
      EXPECT_EQ(total, n * H);
      uneven |= budget[0] != budget[1];
    }
    const auto kept = run_ratio(make_critical_adakv_scorer(make_expected_attention_scorer(c, 1e-2, false), c, wo), x,
                                ratio, "head");  // its own budget: the scope does not apply
    EXPECT_EQ(kept, want);
  }
  EXPECT_TRUE(uneven);
}

}  // namespace
namespace kvzap {
std::unique_ptr<Scorer> make_entropy_gated_chunkkv_scorer(const ModelConfig& c, int64_t chunk_length = 10, int64_t low_entropy_chunk_length = 4);  // press/scorer_entropy_gated_chunkkv.cpp
}  // namespace kvzap
namespace {

TEST(BaselineBudgets, EntropyGatedChunkKvKeepsSpikyChunksOnlyInPartAndTopsUpTheBudget) {
  // kvpress EntropyGatedChunkKVPress(SnapKVPress, chunk_length 10, 4 slots from a spiky chunk), written out
  // on the SnapKV scores (checked above): the same kept slots in every head.
  const ModelConfig c = small_config();
  const int64_t T = 137;  // 13 chunks of 10 and one of 7
  const Context x = make_context(c, T, 51, /*rope=*/true, 2.0f);
  const int H = c.n_head_kv;
  auto snap = make_snapkv_scorer(c);
  const CacheScores sn = run_scorer(*snap, x, T);
  int n_spiky = 0, n_topped_up = 0;
  for (double ratio : {0.5, 0.8, 0.05}) {  // 0.05: every chunk taken, the top-up spends what the gate saved
    SCOPED_TRACE(ratio);
    std::vector<std::vector<std::vector<int32_t>>> want((size_t)c.n_layer);
    for (int l = 0; l < c.n_layer; l++) {
      double top = -INFINITY;
      for (const auto& h : sn[(size_t)l])
        for (float v : h)
          if (std::isfinite(v)) top = std::max(top, (double)v);
      std::vector<double> s((size_t)T, 0.0);
      for (int h = 0; h < H; h++)
        for (int64_t i = 0; i < T; i++) {
          const float v = sn[(size_t)l][(size_t)h][(size_t)i];
          s[(size_t)i] += std::isinf(v) ? (double)(float)top + 1 : v;
        }
      std::vector<double> mean, ent;
      for (int64_t c0 = 0; c0 < T; c0 += 10) {
        const int64_t c1 = std::min(T, c0 + 10);
        std::vector<double> p(s.begin() + c0, s.begin() + c1);
        mean.push_back(std::accumulate(p.begin(), p.end(), 0.0) / (double)p.size());
        const double lo = std::min(0.0, *std::min_element(p.begin(), p.end()));
        double sum = 0, e = 0;
        for (double& v : p) sum += (v -= lo);
        for (double v : p) e -= v / (sum + 1e-8) * std::log(v / (sum + 1e-8) + 1e-8);
        ent.push_back(p.size() == 1 ? 0.0 : std::clamp(e / std::log((double)p.size()), 0.0, 1.0));
      }
      auto lower_median = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[(v.size() - 1) / 2]; };
      const double m_score = lower_median(mean), m_ent = lower_median(ent);
      std::vector<int32_t> chunks(mean.size());
      std::iota(chunks.begin(), chunks.end(), 0);
      std::stable_sort(chunks.begin(), chunks.end(), [&](int32_t a, int32_t b) { return mean[(size_t)a] > mean[(size_t)b]; });
      int64_t budget = (int64_t)((double)T * (1.0 - ratio));
      std::set<int32_t> keep;
      for (int32_t ch : chunks) {
        if (budget <= 0) break;
        const int64_t c0 = ch * 10, c1 = std::min(T, c0 + 10);
        int64_t n = std::min(c1 - c0, budget);
        if (mean[(size_t)ch] >= m_score && ent[(size_t)ch] < m_ent) n = std::min<int64_t>(n, 4), n_spiky++;
        // Ties (the window's slots): the earlier slot first, as the press breaks them.
        std::vector<int32_t> idx((size_t)(c1 - c0));
        std::iota(idx.begin(), idx.end(), (int32_t)c0);
        std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return s[(size_t)a] > s[(size_t)b]; });
        for (int64_t r = 0; r < n; r++) keep.insert(idx[(size_t)r]);
        budget -= n;
      }
      n_topped_up += budget > 0;
      std::vector<int32_t> left;
      for (int32_t i = 0; i < (int32_t)T; i++)
        if (!keep.count(i)) left.push_back(i);
      std::stable_sort(left.begin(), left.end(), [&](int32_t a, int32_t b) { return s[(size_t)a] > s[(size_t)b]; });
      for (int64_t r = 0; r < std::min<int64_t>(budget, (int64_t)left.size()); r++) keep.insert(left[(size_t)r]);
      EXPECT_EQ((int64_t)keep.size(), (int64_t)((double)T * (1.0 - ratio)));
      for (int h = 0; h < H; h++) want[(size_t)l].push_back(std::vector<int32_t>(keep.begin(), keep.end()));
    }
    EXPECT_EQ(run_ratio(make_entropy_gated_chunkkv_scorer(c), x, ratio, "global"), want);  // the scope does not apply
  }
  EXPECT_GT(n_spiky, 0);  // the gate did cut some chunk short
  EXPECT_GT(n_topped_up, 0);
}

}  // namespace
namespace kvzap {
// press/scorer_chunk_snapkv.cpp
std::unique_ptr<Scorer> make_chunk_snapkv_scorer(const ModelConfig& c, int64_t chunk_length, int window, int kernel);
}  // namespace kvzap
namespace {

// kvpress ChunkPress(SnapKVPress) written out: SnapKV on each chunk's own keys, voted by the chunk's last W
// queries rotated (as kvpress takes the last W rotary angles of the whole input) for positions T - W .. T - 1.
Scores naive_chunk_snapkv(const Context& x, int64_t C, int W, int K, bool own_angles = false) {
  const int G = x.c.n_group(), D = x.D();
  Scores s((size_t)x.c.n_layer, std::vector<std::vector<double>>((size_t)x.c.n_head_kv, std::vector<double>((size_t)x.T, INFINITY)));
  for (int l = 0; l < x.c.n_layer; l++)
    for (int hk = 0; hk < x.c.n_head_kv; hk++)
      for (int64_t c0 = 0; c0 < x.T; c0 += C) {
        const int64_t n = std::min(C, x.T - c0), m = n - W;
        if (m <= 0) continue;  // a short last chunk: kept whole
        std::vector<double> acc((size_t)m, 0.0);
        for (int g = 0; g < G; g++)
          for (int64_t j = 0; j < W; j++) {
            const int64_t p = c0 + m + j;  // the query's own position
            std::vector<float> q(&x.qpre[(size_t)l][(size_t)((p * x.c.n_head + hk * G + g) * D)],
                                 &x.qpre[(size_t)l][(size_t)((p * x.c.n_head + hk * G + g) * D)] + D);
            rotate(x.c, q.data(), own_angles ? p : x.T - W + j);
            std::vector<double> logit((size_t)(m + j + 1));
            double mx = -INFINITY, sum = 0;
            for (int64_t i = 0; i <= m + j; i++)
              mx = std::max(mx, logit[(size_t)i] = dot(q.data(), x.key(l, hk, c0 + i), D) / std::sqrt((double)D));
            for (double& a : logit) sum += (a = std::exp(a - mx));
            for (int64_t i = 0; i < m; i++) acc[(size_t)i] += logit[(size_t)i] / sum / W / G;
          }
        const std::vector<double> pooled = naive_pool(acc, K);
        std::copy(pooled.begin(), pooled.end(), s[(size_t)l][(size_t)hk].begin() + c0);
      }
  return s;
}

TEST(BaselineBudgets, ChunkSnapKvRunsSnapKvOnEachChunkAndKeepsEachChunksShare) {
  const ModelConfig c = small_config();
  for (const int64_t T : {(int64_t)150, (int64_t)130}) {  // last chunk of 30 (scored), of 10 (<= the window: kept whole)
    SCOPED_TRACE(T);
    const Context x = make_context(c, T, 31, /*rope=*/true);
    const Scores want = naive_chunk_snapkv(x, 40, 16, 3);
    for (int64_t step : {T, (int64_t)7, (int64_t)1}) {
      auto s = make_chunk_snapkv_scorer(c, 40, 16, 3);
      expect_scores_near(run_scorer(*s, x, step), want, 1e-4, "chunk_snapkv");
    }
    // The queries' own angles would score differently: the re-rotation matters.
    const Scores own = naive_chunk_snapkv(x, 40, 16, 3, /*own_angles=*/true);
    EXPECT_GT(std::fabs(own[0][0][5] - want[0][0][5]), 1e-3 * std::fabs(want[0][0][5]));
    if (T == 150) EXPECT_EQ(own[0][0][125], want[0][0][125]);  // the last chunk's queries sit at those positions
    const double ratio = 0.4;
    const auto kept = run_ratio(make_chunk_snapkv_scorer(c, 40, 16, 3), x, ratio, "global", 9);
    for (int l = 0; l < c.n_layer; l++)
      for (int h = 0; h < c.n_head_kv; h++) {
        std::vector<int32_t> w;
        for (int64_t c0 = 0; c0 < T; c0 += 40) {
          const int64_t n = std::min<int64_t>(40, T - c0);
          if (n <= 16) {  // kept whole
            for (int64_t i = c0; i < T; i++) w.push_back((int32_t)i);
            continue;
          }
          const std::vector<double> part(want[(size_t)l][(size_t)h].begin() + c0, want[(size_t)l][(size_t)h].begin() + c0 + n);
          for (int32_t i : top_slots(part, std::max<int64_t>(1, (int64_t)((double)n * (1.0 - ratio))))) w.push_back((int32_t)c0 + i);
        }
        EXPECT_EQ(kept[(size_t)l][(size_t)h], w) << "layer " << l << " head " << h;
      }
  }
  // A chunk no longer than the window cannot vote.
  EXPECT_THROW(make_chunk_snapkv_scorer(c, 16, 16, 3), Error);
  EXPECT_THROW(make_chunk_snapkv_scorer(c, 40, 16, 4), Error);
}

}  // namespace
namespace kvzap {
std::unique_ptr<Scorer> make_chunk_keydiff_scorer(int64_t chunk_length);  // press/scorer_chunk_keydiff.cpp
}  // namespace kvzap
namespace {

TEST(BaselineBudgets, ChunkKeyDiffScoresEachChunkAgainstItsOwnAnchorAndKeepsEachChunksShare) {
  const ModelConfig c = small_config();
  const int64_t T = 110, C = 40;  // chunks of 40, 40 and 30
  const Context x = make_context(c, T, 33, /*rope=*/true);
  const int D = c.head_dim;
  Scores want((size_t)c.n_layer, std::vector<std::vector<double>>((size_t)c.n_head_kv));
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++)
      for (int64_t c0 = 0; c0 < T; c0 += C) {
        const int64_t n = std::min(C, T - c0);
        std::vector<double> anchor((size_t)D, 0.0);
        for (int64_t i = c0; i < c0 + n; i++) {
          const double nk = std::sqrt(dot(x.key(l, h, i), x.key(l, h, i), D));
          for (int d = 0; d < D; d++) anchor[(size_t)d] += x.key(l, h, i)[d] / nk / (double)n;
        }
        double an = 0;
        for (double a : anchor) an += a * a;
        for (int64_t i = c0; i < c0 + n; i++) {
          double kd = 0;
          for (int d = 0; d < D; d++) kd += x.key(l, h, i)[d] * anchor[(size_t)d];
          want[(size_t)l][(size_t)h].push_back(-kd / std::sqrt(dot(x.key(l, h, i), x.key(l, h, i), D) * an));
        }
      }
  auto s = make_chunk_keydiff_scorer(C);
  expect_scores_near(run_scorer(*s, x, 13), want, 1e-5, "chunk_keydiff");
  // One chunk covering the context is KeyDiff itself.
  auto whole = make_chunk_keydiff_scorer(1000);
  auto kd = make_keydiff_scorer();
  EXPECT_EQ(run_scorer(*whole, x, T), run_scorer(*kd, x, T));
  for (double ratio : {0.3, 0.5, 0.9}) {
    const auto kept = run_ratio(make_chunk_keydiff_scorer(C), x, ratio, "global");  // the scope does not apply
    for (int l = 0; l < c.n_layer; l++)
      for (int h = 0; h < c.n_head_kv; h++) {
        std::vector<int32_t> w;
        for (int64_t c0 = 0; c0 < T; c0 += C) {
          const int64_t n = std::min(C, T - c0);
          const std::vector<double> part(want[(size_t)l][(size_t)h].begin() + c0, want[(size_t)l][(size_t)h].begin() + c0 + n);
          for (int32_t i : top_slots(part, std::max<int64_t>(1, (int64_t)((double)n * (1.0 - ratio))))) w.push_back((int32_t)c0 + i);
        }
        EXPECT_EQ(kept[(size_t)l][(size_t)h], w) << "ratio " << ratio << " layer " << l << " head " << h;
      }
  }
  EXPECT_THROW(make_chunk_keydiff_scorer(0), Error);
}

}  // namespace
namespace kvzap {
std::unique_ptr<Scorer> make_chunk_tova_scorer(const ModelConfig& c, int64_t chunk_length);  // press/scorer_chunk_tova.cpp
}  // namespace kvzap
namespace {

// kvpress ChunkPress(TOVAPress) written out: per chunk, the chunk's last query (rotated, as kvpress takes the
// last rotary angle of the whole input, for position T - 1) over the chunk's keys, averaged over all heads.
Scores naive_chunk_tova(const Context& x, int64_t C, bool own_angle = false) {
  const int H = x.c.n_head, G = x.c.n_group(), D = x.D();
  Scores s((size_t)x.c.n_layer, std::vector<std::vector<double>>((size_t)x.c.n_head_kv, std::vector<double>((size_t)x.T, INFINITY)));
  for (int l = 0; l < x.c.n_layer; l++)
    for (int64_t c0 = 0; c0 < x.T; c0 += C) {
      const int64_t n = std::min(C, x.T - c0), p = c0 + n - 1;
      if (n < 2) continue;
      std::vector<double> acc((size_t)n, 0.0);
      for (int hq = 0; hq < H; hq++) {
        std::vector<float> q(&x.qpre[(size_t)l][(size_t)((p * H + hq) * D)], &x.qpre[(size_t)l][(size_t)((p * H + hq) * D)] + D);
        rotate(x.c, q.data(), own_angle ? p : x.T - 1);
        std::vector<double> logit((size_t)n);
        double mx = -INFINITY, sum = 0;
        for (int64_t i = 0; i < n; i++) mx = std::max(mx, logit[(size_t)i] = dot(q.data(), x.key(l, hq / G, c0 + i), D) / std::sqrt((double)D));
        for (double& a : logit) sum += (a = std::exp(a - mx));
        for (int64_t i = 0; i < n; i++) acc[(size_t)i] += logit[(size_t)i] / sum / H;
      }
      for (int hk = 0; hk < x.c.n_head_kv; hk++)
        for (int64_t i = 0; i < n - 1; i++) s[(size_t)l][(size_t)hk][(size_t)(c0 + i)] = acc[(size_t)i];
    }
  return s;
}

TEST(BaselineBudgets, ChunkTovaRunsTovaOnEachChunkAndKeepsEachChunksShare) {
  const ModelConfig c = small_config();
  for (const int64_t T : {(int64_t)110, (int64_t)81}) {  // chunks of 40, 40, 30 / 40, 40, 1 (a lone entry: kept)
    SCOPED_TRACE(T);
    const Context x = make_context(c, T, 35, /*rope=*/true);
    const Scores want = naive_chunk_tova(x, 40);
    for (int64_t step : {T, (int64_t)6, (int64_t)1}) {
      auto s = make_chunk_tova_scorer(c, 40);
      expect_scores_near(run_scorer(*s, x, step), want, 1e-4, "chunk_tova");
    }
    const Scores own = naive_chunk_tova(x, 40, /*own_angle=*/true);
    EXPECT_GT(std::fabs(own[0][0][5] - want[0][0][5]), 1e-3 * std::fabs(want[0][0][5]));  // the re-rotation matters
    const double ratio = 0.6;
    const auto kept = run_ratio(make_chunk_tova_scorer(c, 40), x, ratio, "global", 9);
    for (int l = 0; l < c.n_layer; l++)
      for (int h = 0; h < c.n_head_kv; h++) {
        std::vector<int32_t> w;
        for (int64_t c0 = 0; c0 < T; c0 += 40) {
          const int64_t n = std::min<int64_t>(40, T - c0);
          const std::vector<double> part(want[(size_t)l][(size_t)h].begin() + c0, want[(size_t)l][(size_t)h].begin() + c0 + n);
          for (int32_t i : top_slots(part, std::max<int64_t>(1, (int64_t)((double)n * (1.0 - ratio))))) w.push_back((int32_t)c0 + i);
        }
        EXPECT_EQ(kept[(size_t)l][(size_t)h], w) << "layer " << l << " head " << h;
      }
  }
  EXPECT_THROW(make_chunk_tova_scorer(c, 1), Error);
}

}  // namespace
namespace kvzap {
std::unique_ptr<Scorer> make_chunk_knorm_scorer(int64_t chunk_length);  // press/scorer_chunk_knorm.cpp
}  // namespace kvzap
namespace {

TEST(BaselineBudgets, ChunkKnormKeepsTheLowestNormKeysOfEachChunk) {
  const ModelConfig c = small_config();
  const int64_t T = 95, C = 30;  // chunks of 30, 30, 30 and 5
  const Context x = make_context(c, T, 37, /*rope=*/true);
  Scores want((size_t)c.n_layer, std::vector<std::vector<double>>((size_t)c.n_head_kv));
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++)
      for (int64_t i = 0; i < T; i++) want[(size_t)l][(size_t)h].push_back(-std::sqrt(dot(x.key(l, h, i), x.key(l, h, i), x.D())));
  auto s = make_chunk_knorm_scorer(C);
  expect_scores_near(run_scorer(*s, x, 11), want, 1e-6, "chunk_knorm");
  for (double ratio : {0.25, 0.5, 0.9}) {
    const auto kept = run_ratio(make_chunk_knorm_scorer(C), x, ratio, "layer");  // the scope does not apply
    bool uneven = false;  // the per-chunk budget is not the head's lowest norms overall
    for (int l = 0; l < c.n_layer; l++)
      for (int h = 0; h < c.n_head_kv; h++) {
        std::vector<int32_t> w;
        for (int64_t c0 = 0; c0 < T; c0 += C) {
          const int64_t n = std::min(C, T - c0);
          const std::vector<double> part(want[(size_t)l][(size_t)h].begin() + c0, want[(size_t)l][(size_t)h].begin() + c0 + n);
          for (int32_t i : top_slots(part, std::max<int64_t>(1, (int64_t)((double)n * (1.0 - ratio))))) w.push_back((int32_t)c0 + i);
        }
        EXPECT_EQ(kept[(size_t)l][(size_t)h], w) << "ratio " << ratio << " layer " << l << " head " << h;
        uneven |= top_slots(want[(size_t)l][(size_t)h], (int64_t)w.size()) != w;
      }
    EXPECT_TRUE(uneven) << ratio;
  }
  EXPECT_THROW(make_chunk_knorm_scorer(0), Error);
}

}  // namespace
namespace kvzap {
// press/scorer_chunk_expected_attention.cpp
std::unique_ptr<Scorer> make_chunk_expected_attention_scorer(const ModelConfig& c, int64_t chunk_length, double epsilon);
}  // namespace kvzap
namespace {

// kvpress ChunkPress(ExpectedAttentionPress) written out: per chunk of n entries, the query statistics of the
// chunk's pre-RoPE queries past its first 4, rotated by the rotation averaged over positions n .. n + 511.
Scores naive_chunk_expected_attention(const Context& x, int64_t C, double eps) {
  const int H = x.c.n_head, G = x.c.n_group(), D = x.D(), half = D / 2;
  Scores s((size_t)x.c.n_layer, std::vector<std::vector<double>>((size_t)x.c.n_head_kv, std::vector<double>((size_t)x.T, INFINITY)));
  for (int l = 0; l < x.c.n_layer; l++)
    for (int64_t c0 = 0; c0 < x.T; c0 += C) {
      const int64_t n = std::min(C, x.T - c0), m = n - 4;
      if (m <= 0) continue;
      std::vector<double> R((size_t)D * D, 0.0);
      for (int i = 0; i < half; i++) {
        double cb = 0, sb = 0;
        for (int64_t p = n; p < n + 512; p++) cb += std::cos(rope_angle(x.c, p, i)) / 512, sb += std::sin(rope_angle(x.c, p, i)) / 512;
        const auto [a, b] = rope_pair(x.c, i);
        R[(size_t)(a * D + a)] = cb, R[(size_t)(a * D + b)] = -sb, R[(size_t)(b * D + a)] = sb, R[(size_t)(b * D + b)] = cb;
      }
      for (int hk = 0; hk < x.c.n_head_kv; hk++) {
        std::vector<double> acc((size_t)m, 0.0);
        for (int g = 0; g < G; g++) {
          const int hq = hk * G + g;
          std::vector<double> mu((size_t)D, 0.0), cov((size_t)D * D, 0.0);
          auto q = [&](int64_t p, int a) { return (double)x.qpre[(size_t)l][(size_t)((p * H + hq) * D + a)]; };
          for (int64_t p = c0 + 4; p < c0 + n; p++)
            for (int a = 0; a < D; a++) mu[(size_t)a] += q(p, a) / m;
          for (int64_t p = c0 + 4; p < c0 + n; p++)
            for (int a = 0; a < D; a++)
              for (int b = 0; b < D; b++) cov[(size_t)(a * D + b)] += (q(p, a) - mu[(size_t)a]) * (q(p, b) - mu[(size_t)b]) / m;
          std::vector<double> mr((size_t)D, 0.0), cr((size_t)D * D, 0.0);
          for (int a = 0; a < D; a++)
            for (int b = 0; b < D; b++) mr[(size_t)a] += R[(size_t)(a * D + b)] * mu[(size_t)b];
          for (int a = 0; a < D; a++)
            for (int b = 0; b < D; b++)
              for (int e = 0; e < D; e++)
                for (int f = 0; f < D; f++) cr[(size_t)(a * D + b)] += R[(size_t)(a * D + e)] * cov[(size_t)(e * D + f)] * R[(size_t)(b * D + f)];
          std::vector<double> logit((size_t)m);
          double mx = -INFINITY, sum = 0;
          for (int64_t i = 0; i < m; i++) {
            const float* k = x.key(l, hk, c0 + 4 + i);
            double lin = 0, quad = 0;
            for (int a = 0; a < D; a++) {
              lin += k[a] * mr[(size_t)a];
              for (int b = 0; b < D; b++) quad += k[a] * cr[(size_t)(a * D + b)] * k[b];
            }
            mx = std::max(mx, logit[(size_t)i] = lin / std::sqrt((double)D) + quad / (2.0 * D));
          }
          for (double& a : logit) sum += (a = std::exp(a - mx));
          for (int64_t i = 0; i < m; i++) acc[(size_t)i] += logit[(size_t)i] / sum / G;
        }
        for (int64_t i = 0; i < m; i++) {
          const float* v = x.value(l, hk, c0 + 4 + i);
          s[(size_t)l][(size_t)hk][(size_t)(c0 + 4 + i)] = (acc[(size_t)i] + eps) * std::sqrt(dot(v, v, D));
        }
      }
    }
  return s;
}

TEST(BaselineBudgets, ChunkExpectedAttentionUsesEachChunksOwnQueryStatistics) {
  const ModelConfig c = small_config();
  for (const int64_t T : {(int64_t)100, (int64_t)83}) {  // chunks of 40, 40, 20 / 40, 40, 3 (all sinks: kept whole)
    SCOPED_TRACE(T);
    const Context x = make_context(c, T, 39, /*rope=*/true, 0.5f);
    const Scores want = naive_chunk_expected_attention(x, 40, 1e-2);
    for (int64_t step : {T, (int64_t)7, (int64_t)1}) {
      auto s = make_chunk_expected_attention_scorer(c, 40, 1e-2);
      expect_scores_near(run_scorer(*s, x, step), want, 1e-4, "chunk_expected_attention");
    }
    const double ratio = 0.5;
    const auto kept = run_ratio(make_chunk_expected_attention_scorer(c, 40, 1e-2), x, ratio, "global", 9);
    for (int l = 0; l < c.n_layer; l++)
      for (int h = 0; h < c.n_head_kv; h++) {
        std::vector<int32_t> w;
        for (int64_t c0 = 0; c0 < T; c0 += 40) {
          const int64_t n = std::min<int64_t>(40, T - c0);
          if (n <= 4) {  // kept whole
            for (int64_t i = c0; i < T; i++) w.push_back((int32_t)i);
            continue;
          }
          const std::vector<double> part(want[(size_t)l][(size_t)h].begin() + c0, want[(size_t)l][(size_t)h].begin() + c0 + n);
          for (int32_t i : top_slots(part, std::max<int64_t>(1, (int64_t)((double)n * (1.0 - ratio))))) w.push_back((int32_t)c0 + i);
        }
        EXPECT_EQ(kept[(size_t)l][(size_t)h], w) << "layer " << l << " head " << h;
      }
  }
  // One chunk over the context is ExpectedAttention, but for the future positions: n .. n + 511 both.
  const Context x = make_context(c, 60, 41, /*rope=*/true, 0.5f);
  auto one = make_chunk_expected_attention_scorer(c, 60, 1e-2);
  auto ea = make_expected_attention_scorer(c, 1e-2);
  expect_scores_near(run_scorer(*one, x, 60), [&] {
    const CacheScores e = run_scorer(*ea, x, 60);
    Scores d(e.size());
    for (size_t l = 0; l < e.size(); l++)
      for (const auto& h : e[l]) d[l].emplace_back(h.begin(), h.end());
    return d;
  }(), 1e-5, "one chunk");
  EXPECT_THROW(make_chunk_expected_attention_scorer(c, 4, 1e-2), Error);
}

// SimLayerKV (kvpress SimLayerKVPress): the last n_last queries' attention on a layer's ends, averaged over
// the window rows and every query head, decides whether the layer is lazy; a lazy layer keeps kvpress's
// keys[:n_initial] and keys[-n_recent + n_last:] in every head, the others keep everything.
TEST(BaselineBudgets, SimLayerKvCutsLazyLayersToKvpressSlices) {
  const ModelConfig c = small_config();
  const int64_t T = 60, n_initial = 4, n_recent = 16;
  const int n_last = 3;
  // Layer 0's window queries point at the sink key 1, layer 1's are flat: their end masses differ.
  Context x = make_context(c, T, 71);
  for (float& a : x.q[1]) a *= 0.05f;
  for (int64_t p = T - n_last; p < T; p++)
    for (int hq = 0; hq < c.n_head; hq++)
      for (int d = 0; d < c.head_dim; d++)
        x.q[0][(size_t)((p * c.n_head + hq) * c.head_dim + d)] = 6.0f * x.key(0, hq / c.n_group(), 1)[d];
  // Reference, in double: per layer, softmax over the keys each window row sees (causal), summed on
  // keys [0, n_initial) and [m - n_recent, m) with m = T - n_last, averaged over rows and query heads.
  const int D = c.head_dim, G = c.n_group();
  const double scale = 1.0 / std::sqrt((double)D);
  std::vector<double> mass((size_t)c.n_layer, 0.0);
  const int64_t m = T - n_last;
  for (int l = 0; l < c.n_layer; l++) {
    for (int hq = 0; hq < c.n_head; hq++)
      for (int64_t p = T - n_last; p < T; p++) {
        std::vector<double> e((size_t)(p + 1));
        double mx = -1e300, z = 0;
        for (int64_t i = 0; i <= p; i++) mx = std::max(mx, e[(size_t)i] = scale * dot(x.query(l, hq, p), x.key(l, hq / G, i), D));
        for (double& a : e) z += (a = std::exp(a - mx));
        for (int64_t i = 0; i < n_initial; i++) mass[(size_t)l] += e[(size_t)i] / z;
        for (int64_t i = m - n_recent; i < m; i++) mass[(size_t)l] += e[(size_t)i] / z;
      }
    mass[(size_t)l] /= (double)(n_last * c.n_head);
  }
  ASSERT_GT(std::fabs(mass[0] - mass[1]), 0.02) << mass[0] << " " << mass[1];
  const int lazy = mass[0] > mass[1] ? 0 : 1;
  std::vector<int32_t> all((size_t)T), ends;
  std::iota(all.begin(), all.end(), 0);
  for (int32_t i = 0; i < n_initial; i++) ends.push_back(i);
  for (int64_t i = T - (n_recent - n_last); i < T; i++) ends.push_back((int32_t)i);  // kvpress: keys[-n_recent + n_last:]
  ASSERT_EQ(ends.size(), (size_t)(n_initial + n_recent - n_last));

  auto kept_under = [&](double threshold, const Context& ctx) {
    PressSpec o;
    o.name = "simlayerkv";  // no ratio: the press sets its own budget
    RatioPress press(make_simlayerkv_scorer(c, threshold, n_last, n_recent, n_initial), o);
    KvCache cache(c.n_layer, c.n_head_kv, c.head_dim);
    press.start_context();
    feed(cache, ctx, 7, [&](const LayerStep& st) { press.after_attention(st, cache); });
    press.finish_context(cache, nullptr);
    EXPECT_EQ(press.name(), "simlayerkv (lazy layers)");
    std::vector<std::vector<std::vector<int32_t>>> kept((size_t)c.n_layer, std::vector<std::vector<int32_t>>((size_t)c.n_head_kv));
    for (int l = 0; l < c.n_layer; l++)
      for (int h = 0; h < c.n_head_kv; h++)
        for (int64_t i = 0; i < cache.length(l, h); i++) kept[(size_t)l][(size_t)h].push_back(cache.position_at(l, h, i));
    return kept;
  };
  // Between the two masses: exactly the lazier layer is cut to its ends, in every head.
  {
    const auto kept = kept_under((mass[0] + mass[1]) / 2, x);
    for (int l = 0; l < c.n_layer; l++)
      for (int h = 0; h < c.n_head_kv; h++) EXPECT_EQ(kept[(size_t)l][(size_t)h], l == lazy ? ends : all) << "layer " << l;
  }
  // The kernel's end mass is the reference's: just below it the layer is lazy, just above it not (strict >).
  for (double eps : {-1e-4, 1e-4}) {
    const auto kept = kept_under(mass[(size_t)lazy] + eps, x);
    for (int h = 0; h < c.n_head_kv; h++) EXPECT_EQ(kept[(size_t)lazy][(size_t)h], eps < 0 ? ends : all) << eps;
  }
  // Below both: every layer is lazy; threshold 1 (kvpress's default): none is, nothing is evicted.
  for (double threshold : {0.0, 1.0}) {
    const auto kept = kept_under(threshold, x);
    for (int l = 0; l < c.n_layer; l++)
      for (int h = 0; h < c.n_head_kv; h++) EXPECT_EQ(kept[(size_t)l][(size_t)h], threshold == 0 ? ends : all);
  }
  // A context of at most n_initial + n_recent + n_last tokens is left whole, however lazy.
  {
    const Context short_ctx = make_context(c, n_initial + n_recent + n_last, 72);
    const auto kept = kept_under(0.0, short_ctx);
    for (int l = 0; l < c.n_layer; l++)
      for (int h = 0; h < c.n_head_kv; h++) EXPECT_EQ(kept[(size_t)l][(size_t)h].size(), (size_t)short_ctx.T);
  }
  // kvpress's slice keys[-n_recent + n_last:] is not the recent end unless n_recent > n_last: refused.
  EXPECT_THROW(make_simlayerkv_scorer(c, 0.5, 4, 4, 4), Error);
}

TEST(BaselineBudgets, ProtectedEntriesSurviveEvenAGlobalBudget) {
  const ModelConfig c = small_config();
  const Context x = make_context(c, 120, 15);
  const auto kept = run_ratio(make_snapkv_scorer(c), x, 0.4, "global");  // 192 of the 224 scored entries
  int64_t total = 0;
  for (int l = 0; l < 2; l++)
    for (int h = 0; h < 2; h++) {
      const auto& k = kept[(size_t)l][(size_t)h];
      total += (int64_t)k.size();
      for (int32_t p = 56; p < 120; p++) EXPECT_TRUE(std::binary_search(k.begin(), k.end(), p)) << p;  // the window
    }
  EXPECT_EQ(total, 480 - 192);
}

// ---------------------------------------------------------------- with the real model

std::string model_path() {
  if (const char* m = std::getenv("KVZAP_MODEL"); m && *m) return m;
  return default_model_path();
}

class BaselinesWithModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (std::filesystem::exists(model_path())) model_ = Model::load(model_path());
  }
  static void TearDownTestSuite() { model_.reset(); }
  void SetUp() override {
    if (!model_) FAIL() << "model not found at " << model_path() << " (CI pulls it first: run `kvzap pull` or set KVZAP_MODEL)";
  }
  static std::vector<int32_t> context_ids(int64_t n) {
    std::string text;
    for (int i = 0; text.size() < 4000; i++)
      text += "The harbour master counted " + std::to_string(3 * i + 7) + " boats at dawn; the north pier held the "
              "blue trawlers and the fog lifted by nine. Entry " + std::to_string(i) + " is closed. ";
    std::vector<int32_t> ids = model_->tokenizer().encode(text, true);
    ids.resize((size_t)n);
    return ids;
  }
  static inline std::unique_ptr<Model> model_;
};

TEST_F(BaselinesWithModel, RegistryHoldsEveryBaselineButNotNoPress) {
  std::set<std::string> names;
  for (const ScorerEntry& e : scorer_registry()) {
    names.insert(e.name);
    EXPECT_FALSE(e.description.empty()) << e.name;
    // `kvzap presses` shows each press's standing against kvpress (docs/PARITY.md).
    EXPECT_FALSE(e.traits.kvpress_parity.empty()) << e.name;
  }
  for (const char* n : {"snapkv", "tova", "observed_attention", "expected_attention", "expected_attention_uniform",
                        "pyramidkv", "adakv_snapkv", "adakv_compactor", "keydiff", "lagkv", "chunkkv", "cur", "compactor",
                        "non_causal_attn", "cap", "block_keydiff", "critical_snapkv", "leverage_score", "critical_expected_attention",
                        "critical_adakv_expected_attention", "critical_adakv_snapkv",
                        "entropy_gated_chunkkv", "chunk_snapkv", "chunk_keydiff", "chunk_tova",
                        "chunk_knorm", "chunk_expected_attention"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_FALSE(names.count("no_press"));
  PressSpec o;
  o.name = "adakv_knorm";  // any press under AdaKV, by name
  o.has_ratio = true;
  o.ratio = 0.5;
  auto p = make_press(o, *model_);
  EXPECT_NE(p->name().find("adakv"), std::string::npos) << p->name();
  o.name = "adakv_expected_attention";  // already AdaKV in the registry: not wrapped twice
  EXPECT_NE(make_press(o, *model_)->name().find("adakv"), std::string::npos);
  o.name = "adakv_pyramidkv";
  EXPECT_THROW(make_press(o, *model_), Error);
  o.name = "snapkv";
  o.has_ratio = false;
  o.has_threshold = true;
  EXPECT_THROW(make_press(o, *model_), Error);
  // SimLayerKV sets its own budget (the registry says so): it runs without a ratio and refuses one.
  EXPECT_TRUE(press_traits("simlayerkv").own_budget);
  EXPECT_EQ(make_press(press_spec_from_json({{"press", "simlayerkv"}}), *model_)->name(), "simlayerkv (lazy layers)");
  for (const char* bad : {R"({"press": "simlayerkv", "ratio": 0.5})", R"({"press": "simlayerkv", "threshold": 0.5})",
                          R"({"press": "adakv_simlayerkv"})", R"({"press": "simlayerkv", "n_recent": 1, "n_last": 1})"}) {
    try {
      make_press(press_spec_from_json(nlohmann::json::parse(bad)), *model_);
      ADD_FAILURE() << bad << " was not refused";
    } catch (const Error& e) {
      if (std::string(bad).find("ratio") != std::string::npos)
        EXPECT_NE(std::string(e.what()).find("takes no ratio"), std::string::npos) << e.what();
    }
  }
}

// kvpress's own arguments reach the scorer: SnapKV's window_size (the window kept whole moves) and
// StreamingLLM's n_sink (more sinks kept).
TEST_F(BaselinesWithModel, PressParametersChangeWhatIsKept) {
  const ModelConfig& c = model_->config();
  const int64_t T = 300;
  const std::vector<int32_t> ids = context_ids(T);
  SessionOptions so;
  so.n_threads = 2;
  so.n_ctx = 512;
  Session s(*model_, so);
  auto kept_with = [&](const nlohmann::json& spec) {
    auto press = make_press(press_spec_from_json(spec), *model_);
    s.prefill_context(ids, press.get());
    return test::kept_positions(s.cache());
  };
  const test::KeptSet w64 = kept_with({{"press", "snapkv"}, {"ratio", 0.5}, {"ratio_scope", "head"}});
  const test::KeptSet w32 = kept_with({{"press", "snapkv"}, {"ratio", 0.5}, {"ratio_scope", "head"}, {"window_size", 32}});
  EXPECT_NE(w64, w32);
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++) {
      const int64_t len = s.cache().length(l, h);
      EXPECT_EQ(len, T / 2);
      EXPECT_EQ(s.cache().position_at(l, h, len - 32), T - 32);  // the 32-token window, kept whole
    }
  kept_with({{"press", "streaming_llm"}, {"ratio", 0.5}, {"ratio_scope", "head"}, {"n_sink", 10}});
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++) {
      EXPECT_EQ(s.cache().position_at(l, h, 9), 9);  // sinks 0..9
      EXPECT_EQ(s.cache().position_at(l, h, 10), T - (T / 2 - 10));  // then the most recent
    }
}

// The other presses' kvpress arguments reach their scorers: each value away from its default changes
// the kept sets, sinks are kept, and AdaKV's alpha_safeguard 1 protects every head's whole share (the
// per-head budget).
TEST_F(BaselinesWithModel, MorePressParametersChangeWhatIsKept) {
  const ModelConfig& c = model_->config();
  const int64_t T = 300;
  const std::vector<int32_t> ids = context_ids(T);
  SessionOptions so;
  so.n_threads = 2;
  so.n_ctx = 512;
  Session s(*model_, so);
  auto kept_with = [&](const nlohmann::json& spec) {
    auto press = make_press(press_spec_from_json(spec), *model_);
    s.prefill_context(ids, press.get());
    return test::kept_positions(s.cache());
  };
  struct Case {
    const char* press;
    nlohmann::json params;
  };
  const std::vector<Case> cases = {
      {"expected_attention_uniform", {{"n_future_positions", 16}}},
      {"expected_attention_uniform", {{"n_sink", 12}}},
      {"expected_attention_uniform", {{"use_covariance", 0}}},
      {"expected_attention_uniform", {{"use_vnorm", 0}}},
      {"expected_attention_uniform", {{"epsilon", 0.5}}},
      {"expected_attention", {{"alpha_safeguard", 0.8}}},
      {"expected_attention", {{"n_future_positions", 16}}},
      {"adakv_snapkv", {{"alpha_safeguard", 0.8}}},  // beyond the window's 64 (+inf): 0.8 x 150 protected
      {"adakv_snapkv", {{"window_size", 32}}},
      {"adakv_keydiff", {{"alpha_safeguard", 1.0}}},
      {"adakv_compactor", {{"alpha_safeguard", 1.0}}},
      {"lagkv", {{"lag_size", 64}}},
      {"lagkv", {{"n_sink", 30}}},
      {"block_keydiff", {{"block_size", 32}}},
      {"cur", {{"num_sinks", 40}}},
      {"cur", {{"local_window_size", 64}}},
      {"cur", {{"use_local_approximation", 0}}},
      {"non_causal_attn", {{"chunk_size", 64}}},
      {"compactor", {{"chunk_size", 64}}},
      {"compactor", {{"sink_size_start", 40}}},
      {"compactor", {{"sketch_dimension", 16}}},
      {"leverage_score", {{"sketch_dimension", 16}}},
      {"critical_snapkv", {{"first_stage_ratio", 0.0}}},
      {"critical_snapkv", {{"epsilon", 10.0}}},
      {"critical_expected_attention", {{"first_stage_ratio", 1.0}}},
      {"critical_adakv_snapkv", {{"alpha_safeguard", 1.0}}},
      {"critical_adakv_expected_attention", {{"first_stage_ratio", 0.0}}},
      {"cap", {{"tau", 0.5}}},
      {"cap", {{"n_future_positions", 16}}},
      {"adakv_cap", {{"alpha_safeguard", 1.0}}},
      {"entropy_gated_chunkkv", {{"chunk_length", 16}}},
      {"entropy_gated_chunkkv", {{"low_entropy_chunk_length", 1}}},
  };
  std::map<std::string, test::KeptSet> defaults;  // each press's kept set at its defaults, computed once
  for (const Case& k : cases) {
    if (!test::press_selected(k.press)) continue;
    SCOPED_TRACE(std::string(k.press) + " " + k.params.dump());
    nlohmann::json spec = {{"press", k.press}, {"ratio", 0.5}};
    auto base = defaults.find(k.press);
    if (base == defaults.end()) base = defaults.emplace(k.press, kept_with(spec)).first;
    spec.update(k.params);
    EXPECT_NE(kept_with(spec), base->second);
  }
  // Sinks: the first n_sink / num_sinks positions stay in every stream (at a ratio where LagKV's sinks and
  // kept tail, all scoring 1, fit the budget).
  for (const auto& [press, name] : std::vector<std::pair<const char*, const char*>>{
           {"expected_attention_uniform", "n_sink"}, {"lagkv", "n_sink"}, {"cur", "num_sinks"}, {"compactor", "sink_size_start"},
           {"cap", "n_sink"}}) {
    SCOPED_TRACE(press);
    kept_with({{"press", press}, {"ratio", 0.3}, {name, 40}});
    for (int l = 0; l < c.n_layer; l++)
      for (int h = 0; h < c.n_head_kv; h++) EXPECT_EQ(s.cache().position_at(l, h, 39), 39);
  }
  // alpha_safeguard 1: each head keeps its own share, as the per-head budget does.
  EXPECT_EQ(kept_with({{"press", "adakv_keydiff"}, {"ratio", 0.5}, {"alpha_safeguard", 1.0}}),
            kept_with({{"press", "keydiff"}, {"ratio", 0.5}, {"ratio_scope", "head"}}));
  EXPECT_EQ(kept_with({{"press", "expected_attention"}, {"ratio", 0.5}, {"alpha_safeguard", 1.0}}),
            kept_with({{"press", "expected_attention_uniform"}, {"ratio", 0.5}, {"ratio_scope", "head"}}));
  // A pair kvpress refuses, refused when the press is made.
  EXPECT_THROW(make_press(press_spec_from_json({{"press", "entropy_gated_chunkkv"}, {"ratio", 0.5}, {"chunk_length", 4}}),
                          *model_),
               Error);
}

TEST_F(BaselinesWithModel, EveryPressEvictsItsBudgetAndTheModelStillGenerates) {
  const ModelConfig& c = model_->config();
  const int64_t T = 300;
  const std::vector<int32_t> ids = context_ids(T);
  const int64_t per_layer = (int64_t)c.n_head_kv * T, total = per_layer * c.n_layer;
  SessionOptions so;
  so.n_threads = 2;
  so.n_ctx = 512;
  Session s(*model_, so);
  const std::vector<int32_t> question = model_->tokenizer().encode(" How many boats were counted at dawn?", false);
  for (const char* name : {"snapkv", "tova", "observed_attention", "expected_attention", "expected_attention_uniform",
                           "pyramidkv", "adakv_snapkv", "adakv_compactor", "keydiff", "lagkv", "chunkkv", "cur",
                           "compactor", "adakv_keydiff", "non_causal_attn", "cap", "block_keydiff", "critical_snapkv",
                           "leverage_score", "critical_expected_attention", "critical_adakv_expected_attention",
                           "critical_adakv_snapkv", "entropy_gated_chunkkv", "chunk_snapkv",
                           "chunk_keydiff", "chunk_tova", "chunk_knorm", "chunk_expected_attention"}) {
    if (!test::press_selected(name)) continue;
    SCOPED_TRACE(name);
    PressSpec o;
    o.name = name;
    o.has_ratio = true;
    o.ratio = 0.5;
    auto press = make_press(o, *model_);
    s.prefill_context(ids, press.get());
    int64_t want_evicted = total / 2;  // global: floor(0.5 * L * H * T)
    const std::string n = name;
    if (n == "pyramidkv") {
      want_evicted = 0;
      for (int l = 0; l < c.n_layer; l++) want_evicted += c.n_head_kv * (T - pyramid_layer_budget(T, 0.5, l, c.n_layer));
    } else if (n == "chunkkv") {
      want_evicted = (int64_t)c.n_layer * c.n_head_kv * (15 - 7) * 20;  // 15 chunks of 20, keeps int(7.5)
    }
    EXPECT_EQ(total - s.cache().entries_kept(), want_evicted);
    if (n == "pyramidkv")  // layer 0 keeps the most, the last layer the least
      EXPECT_GT(s.cache().entries_kept(0), s.cache().entries_kept(c.n_layer - 1));
    // The protected ends survive.
    for (int l = 0; l < c.n_layer; l++)
      for (int h = 0; h < c.n_head_kv; h++) {
        const int64_t len = s.cache().length(l, h);
        if (n == "snapkv" || n == "tova" || n == "pyramidkv" || n == "adakv_snapkv" || n == "critical_snapkv" ||
            n == "critical_adakv_snapkv" || n == "chunk_snapkv" || n == "chunk_tova")
          EXPECT_EQ(s.cache().position_at(l, h, len - 1), T - 1);
        // CriticalKV's first stage (int(150 / 2) = 75 entries) takes SnapKV's window whole.
        if (n == "snapkv" || n == "adakv_snapkv" || n == "critical_snapkv" || n == "chunk_snapkv")  // one chunk of 300
          EXPECT_EQ(s.cache().position_at(l, h, len - 64), T - 64);
        if (n == "expected_attention_uniform" || n == "cur" || n == "compactor" || n == "cap" || n == "chunk_expected_attention" ||
            n == "critical_expected_attention" || n == "critical_adakv_expected_attention")
          EXPECT_EQ(s.cache().position_at(l, h, 3), 3);
      }
    GenerateOptions g;
    g.max_new_tokens = 6;
    g.stop_at_eog = false;
    const GenerateResult r = s.generate(question, g);
    EXPECT_EQ(r.tokens.size(), 6u);
    EXPECT_FALSE(r.text.empty());
    for (int i = 0; i < c.n_vocab; i += 97) ASSERT_TRUE(std::isfinite(s.logits()[i]));
  }
}

}  // namespace
