// "expected_attention" (docs/ALGORITHMS.md §8.8, kvpress ExpectedAttentionPress): the attention a key should
// get from future queries, modelled as Gaussian. Per query head, the pre-RoPE queries of the context
// (positions >= 4) give a mean mu and covariance Sigma (population); the RoPE rotation averaged over
// the next 512 positions, Rbar, moves them to mu' = Rbar mu, Sigma' = Rbar Sigma Rbar^T. A key k_i (as
// cached, after RoPE) gets logit k_i.mu'/sqrt(D) + k_i^T Sigma' k_i / (2D); softmax over the non-sink
// keys, mean over the group, times (score + epsilon) * ||v_i||. The 4 sink entries score +inf.
//
// kvpress builds mu and Sigma from the hidden states and W_q; here they come from the step's queries
// with RoPE undone, which is the same for models without QK-norm and also defined for Qwen3 (which
// kvpress rejects). Registry: "expected_attention" is AdaKV(ExpectedAttention, epsilon 1e-2) as in the
// kvpress leaderboard registry; "expected_attention_uniform" is the bare scorer (epsilon 1e-2).
// Without use_vnorm (kvpress use_vnorm=False, for the CriticalKV presses) the score is the group's mean
// softmax alone.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kvzap/error.h"
#include "model/model.h"
#include "press/baselines.h"
#include "press/query_stats.h"

namespace kvzap {
namespace {

class ExpectedAttentionScorer : public CacheContextScorer {
 public:
  explicit ExpectedAttentionScorer(const ModelConfig& c, const ExpectedAttentionOptions& o)
      : cfg_(c), epsilon_(o.epsilon), use_vnorm_(o.use_vnorm), use_covariance_(o.use_covariance), n_sink_(o.n_sink),
        n_future_(o.n_future_positions), stats_(o.stats), rope_(c), s1_((size_t)c.n_layer), s2_((size_t)c.n_layer), n_((size_t)c.n_layer, 0) {
    const size_t H = (size_t)c.n_head, D = (size_t)c.head_dim;
    for (int l = 0; l < c.n_layer && !stats_; l++) {  // with given statistics nothing is accumulated
      s1_[(size_t)l].assign(H * D, 0.0);
      s2_[(size_t)l].assign(H * D * D, 0.0);
    }
  }

  void reset() override {
    for (auto& s : s1_) std::fill(s.begin(), s.end(), 0.0);
    for (auto& s : s2_) std::fill(s.begin(), s.end(), 0.0);
    std::fill(n_.begin(), n_.end(), 0);
  }

  // Accumulates sum q and sum q q^T of the pre-RoPE queries at positions >= n_sink_.
  void observe_step(const LayerStep& step, const KvCache& cache) override {
    if (stats_) return;  // the statistics were computed beforehand
    const int H = cfg_.n_head, D = cfg_.head_dim;
    const size_t l = (size_t)step.layer;
    int32_t max_pos = 0;
    for (int64_t t = 0; t < step.n_tok; t++) max_pos = std::max(max_pos, step.pos[t]);
    rope_.reserve((int64_t)max_pos + 1);
    for (int64_t t = 0; t < step.n_tok; t++) n_[l] += step.pos[t] >= n_sink_;
    parallel_for(H, [&](int64_t h, int) {
      double* s1 = &s1_[l][(size_t)(h * D)];
      double* s2 = &s2_[l][(size_t)(h * D * D)];
      std::vector<float> q((size_t)D);
      std::vector<double> qd((size_t)D);
      for (int64_t t = 0; t < step.n_tok; t++) {
        if (step.pos[t] < n_sink_) continue;
        std::copy_n(step.q + (size_t)(t * H + h) * D, D, q.begin());
        rope_.unrotate(q.data(), step.pos[t], step.layer);
        for (int a = 0; a < D; a++) qd[(size_t)a] = q[(size_t)a];
        for (int a = 0; a < D; a++) {
          s1[a] += qd[(size_t)a];
          const double qa = qd[(size_t)a];
          double* row = s2 + (size_t)a * D;
          for (int b = 0; b < D; b++) row[b] += qa * qd[(size_t)b];
        }
      }
    });
  }

  void score_cache(const KvCache& cache, CacheScores& out) override {
    const int64_t T = require_full_context(cache, "expected_attention");
    const int L = cfg_.n_layer, Hkv = cfg_.n_head_kv, G = cfg_.n_group(), D = cfg_.head_dim;
    size_scores(cache, out);
    const int64_t n_sink = std::min<int64_t>(n_sink_, T);
    for (int l = 0; l < L; l++)
      for (int h = 0; h < Hkv && judged_layer(cache, l); h++)
        std::fill(out[(size_t)l][(size_t)h].begin(), out[(size_t)l][(size_t)h].begin() + n_sink,
                  std::numeric_limits<float>::infinity());
    if (T <= n_sink_) return;
    for (int l = 0; l < L; l++)
      if (!stats_ && judged_layer(cache, l) && n_[(size_t)l] != T - n_sink_) throw Error("internal: expected_attention did not see the whole context prefill");

    // Each layer's averaged rotation Rbar as a dense [D][D] matrix (2x2 blocks per frequency; layers
    // differ where their RoPE bases do, as Gemma 3's local and global layers).
    std::vector<std::vector<double>> Rs((size_t)L);
    for (int l = 0; l < L; l++) {
      std::vector<double> cbar, sbar;
      rope_.mean_rotation(l, T, n_future_, cbar, sbar);
      std::vector<double>& R = Rs[(size_t)l];
      R.assign((size_t)D * D, 0.0);
      for (int i = 0; i < D / 2; i++) {
        const auto [a, b] = rope_.pair(i);
        R[(size_t)a * D + a] = cbar[(size_t)i];
        R[(size_t)a * D + b] = -sbar[(size_t)i];
        R[(size_t)b * D + a] = sbar[(size_t)i];
        R[(size_t)b * D + b] = cbar[(size_t)i];
      }
    }
    const int64_t n = T - n_sink_;  // scored keys: slots [n_sink_, T)
    parallel_for((int64_t)L * Hkv, [&](int64_t task, int) {
      const int l = (int)(task / Hkv), hk = (int)(task % Hkv);
      if (!judged_layer(cache, l)) return;
      std::vector<float> keys, values, mu((size_t)D), cov((size_t)D * D), y((size_t)D), logits((size_t)n),
          acc((size_t)n, 0.0f);
      stream_keys(cache, l, hk, keys);
      stream_values(cache, l, hk, values);
      for (int g = 0; g < G; g++) {
        rotated_stats(l, hk * G + g, Rs[(size_t)l], mu, cov);
        for (int64_t i = 0; i < n; i++) {
          const float* k = keys.data() + (size_t)(n_sink_ + i) * D;
          logits[(size_t)i] = expected_attention_logit(k, mu.data(), cov.data(), D, use_covariance_, y.data());
        }
        add_softmax(logits, acc.data());
      }
      std::vector<float>& s = out[(size_t)l][(size_t)hk];
      for (int64_t i = 0; i < n; i++) {
        if (!use_vnorm_) {
          s[(size_t)(n_sink_ + i)] = acc[(size_t)i] / (float)G;
          continue;
        }
        const float* v = values.data() + (size_t)(n_sink_ + i) * D;
        double vn = 0;
        for (int a = 0; a < D; a++) vn += (double)v[a] * v[a];
        s[(size_t)(n_sink_ + i)] = (float)(((double)acc[(size_t)i] / G + epsilon_) * std::sqrt(vn));
      }
    });
  }

 private:
  // mu' = Rbar mu and Sigma' = Rbar Sigma Rbar^T of query head h in layer l, as floats.
  void rotated_stats(int l, int h, const std::vector<double>& R, std::vector<float>& mu_out, std::vector<float>& cov_out) const {
    const int D = cfg_.head_dim;
    if (stats_) {
      std::vector<double> mu((size_t)D), cov((size_t)D * D);  // [D], [D][D]: the stored statistics in double
      std::copy_n(stats_->mean_of(l, h), D, mu.begin());
      std::copy_n(stats_->cov_of(l, h), (size_t)D * D, cov.begin());
      rotate_query_stats(mu.data(), cov.data(), R.data(), D, mu_out.data(), cov_out.data());
      return;
    }
    rotated_query_stats(&s1_[(size_t)l][(size_t)h * D], &s2_[(size_t)l][(size_t)h * D * D], (double)n_[(size_t)l],
                        R.data(), D, mu_out.data(), cov_out.data());
  }

  ModelConfig cfg_;
  double epsilon_;
  bool use_vnorm_;  // false: no (score + epsilon) x ||v|| (CriticalKV weighs the values itself)
  bool use_covariance_;         // false: the logit is k.mu'/sqrt(D) alone
  int64_t n_sink_;               // kvpress n_sink: never scored (+inf), and their queries not counted
  int64_t n_future_;     // kvpress n_future_positions: RoPE averaged over these next positions
  std::shared_ptr<const QueryStats> stats_;  // non-null: expected_attention_stats (s1_, s2_, n_ unused)
  RopeTable rope_;
  std::vector<std::vector<double>> s1_;  // [layer][n_head][D]: sum of pre-RoPE queries
  std::vector<std::vector<double>> s2_;  // [layer][n_head][D][D]: sum of q q^T
  std::vector<int64_t> n_;               // [layer] queries accumulated
};

}  // namespace

std::unique_ptr<Scorer> make_expected_attention_scorer(const ModelConfig& c, const ExpectedAttentionOptions& o) {
  return std::make_unique<ExpectedAttentionScorer>(c, o);
}

std::unique_ptr<Scorer> make_expected_attention_scorer(const ModelConfig& c, double epsilon, bool use_vnorm) {
  return make_expected_attention_scorer(c, ExpectedAttentionOptions{.use_vnorm = use_vnorm, .epsilon = epsilon});
}

ExpectedAttentionOptions expected_attention_options(const PressSpec& o) {
  return {.n_future_positions = (int64_t)press_param(o, "n_future_positions"),
          .n_sink = (int64_t)press_param(o, "n_sink"),
          .use_covariance = press_param(o, "use_covariance") != 0,
          .use_vnorm = press_param(o, "use_vnorm") != 0,
          .epsilon = press_param(o, "epsilon")};
}

std::vector<PressParam> expected_attention_params() {
  return {{"n_future_positions", 512, 1, 65536, true, "the next positions the RoPE rotation is averaged over"},
          {"n_sink", 4, 0, 1 << 20, true, "the first tokens always kept, their queries left out of the statistics"},
          {"use_covariance", 1, 0, 1, true, "1: the queries' covariance term in the logit, 0: their mean alone"},
          {"use_vnorm", 1, 0, 1, true, "1: scores become (score + epsilon) x ||v||, 0: the expected attention alone"},
          {"epsilon", 1e-2, 0, 1e6, false, "added to the score before the ||v|| rescaling (kvpress default 0; "
                                          "kvzap runs the leaderboard's 1e-2)"}};
}

namespace {
std::vector<PressParam> adakv_expected_attention_params() {
  std::vector<PressParam> p = expected_attention_params();
  p.push_back(adakv_alpha_safeguard_param());
  return p;
}

RegisterScorer reg({"expected_attention",
                    "AdaKV(ExpectedAttention, eps 1e-2) as kvpress registers it: attention expected from future "
                    "queries (Gaussian stats of the context's queries, RoPE averaged over 512 positions) x ||v||",
                    false,
                    [](const PressSpec& o, const Model& m) {
                      return make_adakv_scorer(make_expected_attention_scorer(m.config(), expected_attention_options(o)),
                                               press_param(o, "alpha_safeguard"));
                    },
                    {.params = adakv_expected_attention_params(),
                     .kvpress_parity = "exact (kvpress AdaKVPress(ExpectedAttentionPress(epsilon=1e-2)))"}});
RegisterScorer reg_uniform({"expected_attention_uniform",
                            "ExpectedAttention (eps 1e-2) without AdaKV: the budget follows --ratio-scope", false,
                            [](const PressSpec& o, const Model& m) {
                              return make_expected_attention_scorer(m.config(), expected_attention_options(o));
                            },
                            {.params = expected_attention_params(),
                             .kvpress_parity = "exact (kvpress ExpectedAttentionPress(epsilon=1e-2))"}});
}  // namespace

}  // namespace kvzap
