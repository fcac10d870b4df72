// Tests of the presses that read query statistics (issue 38): the statistics themselves
// (press/query_stats.h: QueryStatsCollector against a naive recomputation, the file, `kvzap query-stats`),
// qfilter (-(filter . k) on the cached keys) and expected_attention_stats (expected_attention's arithmetic
// with given statistics), and the errors when the statistics are missing or do not fit the model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/session.h"
#include "format/safetensors.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "press/baseline_math.h"
#include "press/press.h"
#include "press/query_stats.h"
#include "press/small_config.h"
#include "test_support.h"

namespace {

using namespace kvzap;
namespace fs = std::filesystem;

std::string tmp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("kvzap_qstats_" + std::to_string(::getpid()) + "_" + name)).string();
}

using press_test::small_config;
using press_test::rotate;

// Eigen-decomposition of a symmetric matrix by cyclic Jacobi rotations: the unit eigenvector of the
// largest eigenvalue (an independent route to the power iteration of top_eigenvector).
std::vector<double> jacobi_top_eigenvector(std::vector<double> a, int n, double* top_value) {
  std::vector<double> v((size_t)n * n, 0.0);
  for (int i = 0; i < n; i++) v[(size_t)i * n + i] = 1;
  for (int sweep = 0; sweep < 100; sweep++) {
    double off = 0;
    for (int p = 0; p < n; p++)
      for (int q = p + 1; q < n; q++) off += a[(size_t)p * n + q] * a[(size_t)p * n + q];
    if (off < 1e-24) break;
    for (int p = 0; p < n; p++)
      for (int q = p + 1; q < n; q++) {
        const double apq = a[(size_t)p * n + q];
        if (std::fabs(apq) < 1e-300) continue;
        const double theta = (a[(size_t)q * n + q] - a[(size_t)p * n + p]) / (2 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int k = 0; k < n; k++) {  // A <- J^T A J, V <- V J
          const double akp = a[(size_t)k * n + p], akq = a[(size_t)k * n + q];
          a[(size_t)k * n + p] = c * akp - s * akq;
          a[(size_t)k * n + q] = s * akp + c * akq;
        }
        for (int k = 0; k < n; k++) {
          const double apk = a[(size_t)p * n + k], aqk = a[(size_t)q * n + k];
          a[(size_t)p * n + k] = c * apk - s * aqk;
          a[(size_t)q * n + k] = s * apk + c * aqk;
        }
        for (int k = 0; k < n; k++) {
          const double vkp = v[(size_t)k * n + p], vkq = v[(size_t)k * n + q];
          v[(size_t)k * n + p] = c * vkp - s * vkq;
          v[(size_t)k * n + q] = s * vkp + c * vkq;
        }
      }
  }
  int best = 0;
  for (int i = 1; i < n; i++)
    if (a[(size_t)i * n + i] > a[(size_t)best * n + best]) best = i;
  *top_value = a[(size_t)best * n + best];
  std::vector<double> u((size_t)n);
  for (int k = 0; k < n; k++) u[(size_t)k] = v[(size_t)k * n + best];
  return u;
}

// Two "texts" (positions restarting at 0) of pre-RoPE queries with a non-zero mean, fed to the collector as
// the forward would (post-RoPE step.q), in steps of `step` tokens; the naive statistics recomputed here.
TEST(QueryStats, CollectorMatchesNaiveStatistics) {
  const ModelConfig c = small_config();
  const int L = c.n_layer, H = c.n_head, Hkv = c.n_head_kv, G = c.n_group(), D = c.head_dim;
  const int64_t n_sink = 4;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::vector<int64_t> lengths = {37, 23};
  // pre[text][layer]: [T][H][D] pre-RoPE queries; post: rotated.
  std::vector<std::vector<std::vector<float>>> pre, post;
  for (int64_t T : lengths) {
    pre.emplace_back(), post.emplace_back();
    for (int l = 0; l < L; l++) {
      std::vector<float> q((size_t)(T * H * D));
      for (int64_t t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
          for (int d = 0; d < D; d++) q[(size_t)((t * H + h) * D + d)] = nd(rng) + (d == 1 ? 3.0f + h : 0.0f) + 0.5f * d;
      std::vector<float> r = q;
      for (int64_t t = 0; t < T; t++)
        for (int h = 0; h < H; h++) rotate(c, &r[(size_t)((t * H + h) * D)], t);
      pre.back().push_back(q);
      post.back().push_back(r);
    }
  }
  QueryStatsCollector col(c, n_sink);
  KvCache cache(L, Hkv, D);
  for (size_t x = 0; x < lengths.size(); x++)
    for (int64_t t0 = 0; t0 < lengths[x]; t0 += 10) {
      const int64_t n = std::min<int64_t>(10, lengths[x] - t0);
      std::vector<int32_t> pos((size_t)n);
      std::iota(pos.begin(), pos.end(), (int32_t)t0);
      for (int l = 0; l < L; l++) {
        LayerStep st;
        st.layer = l;
        st.n_tok = n;
        st.pos = pos.data();
        st.q = &post[x][(size_t)l][(size_t)(t0 * H * D)];
        col.after_attention(st, cache);
      }
    }
  const QueryStats s = col.finish();
  const int64_t N = (lengths[0] - n_sink) + (lengths[1] - n_sink);
  EXPECT_EQ(s.n_queries, N);
  ASSERT_EQ(s.mean.size(), (size_t)L * H * D);
  ASSERT_EQ(s.cov.size(), (size_t)L * H * D * D);
  ASSERT_EQ(s.q_filters.size(), (size_t)L * Hkv * D);
  for (int l = 0; l < L; l++) {
    for (int h = 0; h < H; h++) {
      std::vector<double> mu((size_t)D, 0.0);
      for (size_t x = 0; x < lengths.size(); x++)
        for (int64_t t = n_sink; t < lengths[x]; t++)
          for (int d = 0; d < D; d++) mu[(size_t)d] += pre[x][(size_t)l][(size_t)((t * H + h) * D + d)] / (double)N;
      for (int d = 0; d < D; d++) EXPECT_NEAR(s.mean_of(l, h)[d], mu[(size_t)d], 1e-4) << l << " " << h;
      for (int a = 0; a < D; a++)
        for (int b = 0; b < D; b++) {
          double cv = 0;
          for (size_t x = 0; x < lengths.size(); x++)
            for (int64_t t = n_sink; t < lengths[x]; t++) {
              const float* q = &pre[x][(size_t)l][(size_t)((t * H + h) * D)];
              cv += (q[a] - mu[(size_t)a]) * (q[b] - mu[(size_t)b]);
            }
          EXPECT_NEAR(s.cov_of(l, h)[(size_t)a * D + b], cv / (double)(N - 1), 1e-3) << l << " " << h;
        }
    }
    for (int hk = 0; hk < Hkv; hk++) {
      std::vector<double> gram((size_t)D * D, 0.0), msum((size_t)D, 0.0);
      for (size_t x = 0; x < lengths.size(); x++)
        for (int64_t t = n_sink; t < lengths[x]; t++)
          for (int g = 0; g < G; g++) {
            const float* q = &post[x][(size_t)l][(size_t)((t * H + hk * G + g) * D)];
            for (int a = 0; a < D; a++) {
              msum[(size_t)a] += q[a];
              for (int b = 0; b < D; b++) gram[(size_t)a * D + b] += (double)q[a] * q[b];
            }
          }
      double top = 0;
      std::vector<double> u = jacobi_top_eigenvector(gram, D, &top);
      double dot = 0;
      for (int a = 0; a < D; a++) dot += u[(size_t)a] * msum[(size_t)a];
      if (dot < 0)
        for (double& x : u) x = -x;  // the convention: the queries' mean projection on u is positive
      const float* f = s.filter_of(l, hk);
      for (int a = 0; a < D; a++) EXPECT_NEAR(f[a], -u[(size_t)a], 1e-4) << "layer " << l << " KV head " << hk;
    }
  }
}

TEST(QueryStats, FileRoundTripAndShapeChecks) {
  const ModelConfig c = small_config();
  QueryStats s;
  s.n_layer = c.n_layer, s.n_head = c.n_head, s.n_head_kv = c.n_head_kv, s.head_dim = c.head_dim;
  s.n_queries = 123;
  s.mean.resize((size_t)c.n_layer * c.n_head * c.head_dim);
  s.cov.resize(s.mean.size() * c.head_dim);
  s.q_filters.resize((size_t)c.n_layer * c.n_head_kv * c.head_dim);
  for (size_t i = 0; i < s.mean.size(); i++) s.mean[i] = 0.25f * (float)i;
  for (size_t i = 0; i < s.cov.size(); i++) s.cov[i] = -0.5f * (float)i;
  for (size_t i = 0; i < s.q_filters.size(); i++) s.q_filters[i] = (float)i + 0.125f;
  const std::string path = tmp_path("roundtrip/qs.safetensors");
  s.save(path);
  const QueryStats r = QueryStats::load(path);
  EXPECT_EQ(r.n_queries, 123);
  EXPECT_EQ(r.mean, s.mean);
  EXPECT_EQ(r.cov, s.cov);
  EXPECT_EQ(r.q_filters, s.q_filters);
  EXPECT_NO_THROW(r.check_fits(c, path, "qfilter"));
  ModelConfig other = c;
  other.n_head_kv = 1;
  try {
    r.check_fits(other, path, "qfilter");
    ADD_FAILURE() << "a misfit was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not fit"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("kvzap query-stats"), std::string::npos) << e.what();
  }
  // A safetensors file of something else.
  const std::string foreign = tmp_path("foreign.safetensors");
  write_safetensors(foreign, {{"x", "F32", {2}, {1, 2}}});
  EXPECT_THROW(QueryStats::load(foreign), Error);
  fs::remove_all(fs::path(path).parent_path());
  fs::remove(foreign);
}

// ---------------------------------------------------------------- with the real model

class QueryStatsPresses : public test::DefaultModelTest {
 protected:
  static std::vector<int32_t> context_ids(int64_t n) {
    std::string text;
    for (int i = 0; text.size() < 6000; i++)
      text += "The harbour master counted " + std::to_string(3 * i + 7) + " boats at dawn; the north pier held the "
              "blue trawlers and the fog lifted by nine. Entry " + std::to_string(i) + " is closed. ";
    std::vector<int32_t> ids = model_->tokenizer().encode(text, true);
    ids.resize((size_t)n);
    return ids;
  }
  static SessionOptions session_options() {
    SessionOptions so;
    so.n_threads = 2;
    so.n_ctx = 1024;
    so.kv_type = KvType::F32;  // the cached keys are the scored ones, bit for bit
    return so;
  }
  // The statistics of `ids`' own queries (positions >= 4).
  static QueryStats stats_of(const std::vector<int32_t>& ids) {
    Session s(*model_, session_options());
    QueryStatsCollector col(model_->config(), 4);
    s.set_observer(&col);
    s.feed(ids);
    s.set_observer(nullptr);
    return col.finish();
  }
  // The press's scores by position (score_log) after prefilling `ids` under `spec`, and the session's cache.
  struct Run {
    std::vector<float> scores;  // [n_layer][n_head_kv][n_pos]
    int64_t n_pos = 0;
    test::KeptSet kept;
    std::vector<std::vector<float>> keys;  // [layer * n_head_kv + head]: kept keys [len][D]
  };
  static Run run(const nlohmann::json& spec, const std::vector<int32_t>& ids) {
    Session s(*model_, session_options());
    auto press = make_press(press_spec_from_json(spec), *model_);
    press->keep_scores(true);
    s.prefill_context(ids, press.get());
    const ScoreLog* log = press->score_log();
    Run r;
    r.n_pos = (int64_t)ids.size();
    const ModelConfig& c = model_->config();
    r.scores.resize((size_t)c.n_layer * c.n_head_kv * r.n_pos);
    for (int l = 0; l < c.n_layer; l++)
      for (int h = 0; h < c.n_head_kv; h++)
        for (int64_t p = 0; p < r.n_pos; p++)
          r.scores[((size_t)l * c.n_head_kv + h) * r.n_pos + p] =
              log->data()[((size_t)l * c.n_head_kv + h) * log->capacity() + p];
    r.kept = test::kept_positions(s.cache());
    for (int l = 0; l < c.n_layer; l++)
      for (int h = 0; h < c.n_head_kv; h++) {
        r.keys.emplace_back();
        stream_keys(s.cache(), l, h, r.keys.back());
      }
    return r;
  }
};

TEST_F(QueryStatsPresses, QFilterScoresAreMinusFilterDotKeyAndRankTheKeptSet) {
  const ModelConfig& c = model_->config();
  const int D = c.head_dim;
  // Any filters of the right shape: random unit vectors.
  QueryStats s;
  s.n_layer = c.n_layer, s.n_head = c.n_head, s.n_head_kv = c.n_head_kv, s.head_dim = D, s.n_queries = 2;
  s.mean.assign((size_t)c.n_layer * c.n_head * D, 0.0f);
  s.cov.assign(s.mean.size() * D, 0.0f);
  s.q_filters.resize((size_t)c.n_layer * c.n_head_kv * D);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (float& x : s.q_filters) x = nd(rng);
  const std::string path = tmp_path("random_filters.safetensors");
  s.save(path);
  const std::vector<int32_t> ids = context_ids(300);
  const Run r = run({{"press", "qfilter"}, {"ratio", 0.5}, {"ratio_scope", "head"}, {"surrogate", path}}, ids);
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++) {
      const size_t stream = (size_t)l * c.n_head_kv + h;
      const std::vector<int32_t>& kept = r.kept[stream];
      ASSERT_EQ((int64_t)kept.size(), 150) << l << " " << h;
      const float* f = s.filter_of(l, h);
      float min_kept = std::numeric_limits<float>::infinity();
      for (size_t i = 0; i < kept.size(); i++) {
        double want = 0;
        for (int d = 0; d < D; d++) want -= (double)f[d] * r.keys[stream][i * D + d];
        const float got = r.scores[stream * r.n_pos + kept[i]];
        ASSERT_NEAR(got, want, 1e-4 * (1 + std::fabs(want))) << "layer " << l << " head " << h << " pos " << kept[i];
        min_kept = std::min(min_kept, got);
      }
      const std::set<int32_t> ks(kept.begin(), kept.end());
      for (int64_t p = 0; p < r.n_pos; p++)
        if (!ks.count((int32_t)p)) EXPECT_LE(r.scores[stream * r.n_pos + p], min_kept) << "evicted " << p << " outranks a kept entry";
    }
  fs::remove(path);
}

// With the context's own statistics (covariance over N, as expected_attention takes it), the stats press is
// expected_attention_uniform; with other statistics its scores differ.
TEST_F(QueryStatsPresses, ExpectedAttentionStatsIsExpectedAttentionWithGivenStatistics) {
  const ModelConfig& c = model_->config();
  const std::vector<int32_t> ids = context_ids(300);
  QueryStats own = stats_of(ids);
  const double n = (double)own.n_queries;
  for (float& x : own.cov) x = (float)(x * (n - 1) / n);
  const std::string path = tmp_path("own.safetensors");
  own.save(path);
  const Run want = run({{"press", "expected_attention_uniform"}, {"ratio", 0.5}, {"ratio_scope", "head"}}, ids);
  const Run got = run({{"press", "expected_attention_stats"}, {"ratio", 0.5}, {"ratio_scope", "head"},
                       {"epsilon", 0.01}, {"surrogate", path}}, ids);
  int64_t compared = 0, same_kept = 0;
  for (size_t i = 0; i < want.scores.size(); i++) {
    const float a = want.scores[i], b = got.scores[i];
    if (std::isnan(a) || std::isinf(a)) {
      EXPECT_EQ(std::isinf(a), std::isinf(b)) << i;
      continue;
    }
    ASSERT_NEAR(b, a, 2e-3 * std::fabs(a) + 1e-7) << "entry " << i;
    compared++;
  }
  EXPECT_GT(compared, (int64_t)c.n_layer * c.n_head_kv * 100);
  for (size_t st = 0; st < want.kept.size(); st++) same_kept += want.kept[st] == got.kept[st];
  EXPECT_GE(same_kept, (int64_t)want.kept.size() * 9 / 10) << "kept sets differ beyond near-ties";

  // Statistics of another text: other scores.
  const QueryStats other = stats_of(model_->tokenizer().encode(test::slurp(std::string(KVZAP_SOURCE_DIR) + "/README.md").substr(0, 1500), true));
  const std::string path2 = tmp_path("other.safetensors");
  other.save(path2);
  const Run diff = run({{"press", "expected_attention_stats"}, {"ratio", 0.5}, {"ratio_scope", "head"}, {"surrogate", path2}}, ids);
  EXPECT_NE(diff.kept, got.kept);
  fs::remove(path);
  fs::remove(path2);
}

TEST_F(QueryStatsPresses, MissingOrMisfitStatisticsAreClearErrors) {
  for (const char* press : {"qfilter", "expected_attention_stats"}) {
    SCOPED_TRACE(press);
    const std::string missing = tmp_path("nowhere/query_stats.safetensors");
    try {
      make_press(press_spec_from_json({{"press", press}, {"ratio", 0.5}, {"surrogate", missing}}), *model_);
      ADD_FAILURE() << "missing statistics were accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("kvzap query-stats"), std::string::npos) << m;
      EXPECT_NE(m.find(missing), std::string::npos) << m;
    }
    const ModelConfig& c = model_->config();
    QueryStats s;  // one layer short
    s.n_layer = c.n_layer - 1, s.n_head = c.n_head, s.n_head_kv = c.n_head_kv, s.head_dim = c.head_dim, s.n_queries = 2;
    s.mean.assign((size_t)s.n_layer * s.n_head * s.head_dim, 0.0f);
    s.cov.assign(s.mean.size() * s.head_dim, 0.0f);
    s.q_filters.assign((size_t)s.n_layer * s.n_head_kv * s.head_dim, 1.0f);
    const std::string dir = tmp_path("short");
    s.save(dir + "/query_stats.safetensors");
    try {
      make_press(press_spec_from_json({{"press", press}, {"ratio", 0.5}, {"surrogate", dir}}), *model_);  // a folder
      ADD_FAILURE() << "statistics of another shape were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("do not fit"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("kvzap query-stats"), std::string::npos) << e.what();
    }
    fs::remove_all(dir);
  }
}

// `kvzap query-stats` on a few of the repository's documents: a file of the model's shapes, then the
// sign convention checked on the model: the half of the keys qfilter keeps receives more of the attention
// actually paid (observed_attention's scores, positions past the sinks) than the half it evicts.
TEST_F(QueryStatsPresses, CommandWritesStatisticsAndQFilterKeepsAttendedKeys) {
  const ModelConfig& c = model_->config();
  const std::string dir = tmp_path("cmd");
  fs::create_directories(dir);
  {
    std::ofstream list(dir + "/files.txt");
    for (const char* doc : {"docs/ALGORITHMS.md", "docs/TRAINING.md", "README.md", "docs/SERVER.md"})
      list << KVZAP_SOURCE_DIR << "/" << doc << "\n";
  }
  const std::string out = dir + "/stats.safetensors";
  const test::CommandResult cr = test::run_kvzap("query-stats -m '" + test::default_model_path() + "' --files '" + dir +
                                                 "/files.txt' --windows 4 --min-tokens 200 --max-tokens 400 -t 2 --out '" +
                                                 out + "'");
  ASSERT_EQ(cr.exit_code, 0) << cr.err;
  auto f = SafetensorsFile::open(out);
  EXPECT_EQ(f->tensor("query_mean").shape, (std::vector<int64_t>{c.n_layer, c.n_head, c.head_dim}));
  EXPECT_EQ(f->tensor("query_cov").shape, (std::vector<int64_t>{c.n_layer, c.n_head, c.head_dim, c.head_dim}));
  EXPECT_EQ(f->tensor("q_filters").shape, (std::vector<int64_t>{c.n_layer, c.n_head_kv, c.head_dim}));
  const QueryStats s = QueryStats::load(out);
  EXPECT_GE(s.n_queries, 4 * (200 - 4));
  EXPECT_LE(s.n_queries, 4 * (400 + 1 - 4));
  for (int l = 0; l < c.n_layer; l++)
    for (int hk = 0; hk < c.n_head_kv; hk++) {
      double n2 = 0;
      for (int d = 0; d < c.head_dim; d++) n2 += (double)s.filter_of(l, hk)[d] * s.filter_of(l, hk)[d];
      EXPECT_NEAR(n2, 1.0, 1e-5);
    }
  for (int a = 0; a < c.head_dim; a++) EXPECT_GE(s.cov_of(3, 2)[(size_t)a * c.head_dim + a], 0.0f);

  const std::vector<int32_t> ids = context_ids(400);
  const Run attn = run({{"press", "observed_attention"}, {"ratio", 0.5}, {"ratio_scope", "head"}}, ids);
  const Run qf = run({{"press", "qfilter"}, {"ratio", 0.5}, {"ratio_scope", "head"}, {"surrogate", out}}, ids);
  double kept_mass = 0, total_mass = 0;
  int heads_better = 0, heads = 0;
  for (size_t st = 0; st < qf.kept.size(); st++) {
    const std::set<int32_t> ks(qf.kept[st].begin(), qf.kept[st].end());
    double k = 0, e = 0;
    for (int64_t p = 4; p < attn.n_pos; p++) {
      const double a = attn.scores[st * attn.n_pos + p];
      (ks.count((int32_t)p) ? k : e) += a;
    }
    kept_mass += k, total_mass += k + e;
    heads_better += k > e;
    heads++;
  }
  const double frac = kept_mass / total_mass;
  std::printf("[qfilter] attention mass past the sinks on the kept half: %.3f; heads where kept > evicted: %d of %d\n",
              frac, heads_better, heads);
  EXPECT_GT(frac, 0.55);
  EXPECT_GT(heads_better, heads / 2);
  fs::remove_all(dir);
}

}  // namespace
