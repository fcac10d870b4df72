// "cap" (docs/ALGORITHMS.md §8.16, kvpress CapPress): query-relevance-weighted leverage of the values.
// Per query head q: the anchor a = Rbar mean(pre-RoPE queries at positions >= 4), Rbar the RoPE rotation
// averaged over the next 512 positions (as expected_attention); for each non-sink key i (cached, after
// RoPE), s_i = clamp(cos(a, k_i), -1, 1) and the weight w_i = exp(tau s_i - max_j tau s_j), tau = 5. With
// the non-sink values v_i of the group's KV head, M = I + sum_j (w_j + 1e-6) v_j v_j^T (D x D) and the
// leverage l_i = v_i^T M^-1 v_i; score_i = w_i l_i, averaged over the G query heads. The 4 sinks are kept.
// tau, n_future_positions, n_sink and epsilon are press parameters (kvpress CapPress's arguments).
#include <algorithm>
#include <cmath>
#include <limits>

#include "kvzap/error.h"
#include "model/model.h"
#include "press/baselines.h"

namespace kvzap {
namespace {


// Cholesky factor of a symmetric positive definite A [n][n] in place (lower triangle L, A = L L^T).
void cholesky(std::vector<double>& A, int n) {
  for (int j = 0; j < n; j++) {
    double d = A[(size_t)j * n + j];
    for (int k = 0; k < j; k++) d -= A[(size_t)j * n + k] * A[(size_t)j * n + k];
    if (!(d > 0)) throw Error("internal: cap's capacity matrix is not positive definite");
    const double r = std::sqrt(d);
    A[(size_t)j * n + j] = r;
    for (int i = j + 1; i < n; i++) {
      double s = A[(size_t)i * n + j];
      for (int k = 0; k < j; k++) s -= A[(size_t)i * n + k] * A[(size_t)j * n + k];
      A[(size_t)i * n + j] = s / r;
    }
  }
}

// x = A^-1 b in place, from cholesky()'s factor.
void cholesky_solve(const std::vector<double>& Lf, int n, std::vector<double>& b) {
  for (int i = 0; i < n; i++) {  // L y = b
    double s = b[(size_t)i];
    for (int k = 0; k < i; k++) s -= Lf[(size_t)i * n + k] * b[(size_t)k];
    b[(size_t)i] = s / Lf[(size_t)i * n + i];
  }
  for (int i = n - 1; i >= 0; i--) {  // L^T x = y
    double s = b[(size_t)i];
    for (int k = i + 1; k < n; k++) s -= Lf[(size_t)k * n + i] * b[(size_t)k];
    b[(size_t)i] = s / Lf[(size_t)i * n + i];
  }
}

class CapScorer : public CacheContextScorer {
 public:
  CapScorer(const ModelConfig& c, double tau, int64_t n_future_positions, int64_t n_sink, double epsilon)
      : cfg_(c), tau_(tau), n_future_(n_future_positions), n_sink_(n_sink), epsilon_(epsilon), rope_(c),
        sum_q_((size_t)c.n_layer), n_((size_t)c.n_layer, 0) {
    reset();
  }

  void reset() override {
    for (auto& s : sum_q_) s.assign((size_t)cfg_.n_head * cfg_.head_dim, 0.0);
    std::fill(n_.begin(), n_.end(), 0);
  }

  // Sums the pre-RoPE queries at positions >= n_sink_.
  void observe_step(const LayerStep& step, const KvCache&) override {
    const int H = cfg_.n_head, D = cfg_.head_dim;
    const size_t l = (size_t)step.layer;
    int32_t max_pos = 0;
    for (int64_t t = 0; t < step.n_tok; t++) max_pos = std::max(max_pos, step.pos[t]);
    rope_.reserve((int64_t)max_pos + 1);
    std::vector<float> q((size_t)D);
    for (int64_t t = 0; t < step.n_tok; t++) {
      if (step.pos[t] < n_sink_) continue;
      n_[l]++;
      for (int h = 0; h < H; h++) {
        std::copy_n(step.q + (size_t)(t * H + h) * D, D, q.begin());
        rope_.unrotate(q.data(), step.pos[t], step.layer);
        for (int a = 0; a < D; a++) sum_q_[l][(size_t)(h * D + a)] += q[(size_t)a];
      }
    }
  }

  void score_cache(const KvCache& cache, CacheScores& out) override {
    const int64_t T = require_full_context(cache, "cap");
    const int L = cfg_.n_layer, Hkv = cfg_.n_head_kv, G = cfg_.n_group(), D = cfg_.head_dim;
    if (T <= n_sink_) throw Error("cap needs a context longer than its " + std::to_string(n_sink_) + " sink tokens");
    size_scores(cache, out);
    for (int l = 0; l < L; l++)
      if (judged_layer(cache, l) && n_[(size_t)l] != T - n_sink_) throw Error("internal: cap did not see the whole context prefill");
    std::vector<std::vector<double>> cbar((size_t)L), sbar((size_t)L);
    for (int l = 0; l < L; l++) rope_.mean_rotation(l, T, n_future_, cbar[(size_t)l], sbar[(size_t)l]);
    const int64_t n = T - n_sink_;
    parallel_for((int64_t)L * Hkv, [&](int64_t task, int) {
      const int l = (int)(task / Hkv), hk = (int)(task % Hkv);
      if (!judged_layer(cache, l)) return;
      std::vector<float> keys, values;
      stream_keys(cache, l, hk, keys);
      stream_values(cache, l, hk, values);
      std::vector<double> acc((size_t)n, 0.0), stat((size_t)n), w((size_t)n), anchor((size_t)D), M((size_t)D * D), x((size_t)D);
      for (int g = 0; g < G; g++) {
        const int hq = hk * G + g;
        // anchor = Rbar mean(q): each frequency's pair (a, b) turns by the averaged cos / sin.
        const double* s1 = &sum_q_[(size_t)l][(size_t)hq * D];
        for (int i = 0; i < D / 2; i++) {
          const auto [a, b] = rope_.pair(i);
          const double qa = s1[a] / (double)n_[(size_t)l], qb = s1[b] / (double)n_[(size_t)l];
          anchor[(size_t)a] = cbar[(size_t)l][(size_t)i] * qa - sbar[(size_t)l][(size_t)i] * qb;
          anchor[(size_t)b] = sbar[(size_t)l][(size_t)i] * qa + cbar[(size_t)l][(size_t)i] * qb;
        }
        double an = 0;
        for (double v : anchor) an += v * v;
        an = std::max(std::sqrt(an), 1e-12);  // F.normalize's eps
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i < n; i++) {
          const float* k = keys.data() + (size_t)(n_sink_ + i) * D;
          double dotp = 0, kn = 0;
          for (int a = 0; a < D; a++) dotp += anchor[(size_t)a] * k[a], kn += (double)k[a] * k[a];
          const double c = std::clamp(dotp / an / std::max(std::sqrt(kn), 1e-12), -1.0, 1.0);
          stat[(size_t)i] = tau_ * c;
          mx = std::max(mx, stat[(size_t)i]);
        }
        std::fill(M.begin(), M.end(), 0.0);
        for (int a = 0; a < D; a++) M[(size_t)a * D + a] = 1.0;
        for (int64_t i = 0; i < n; i++) {
          w[(size_t)i] = std::exp(stat[(size_t)i] - mx);
          const float* v = values.data() + (size_t)(n_sink_ + i) * D;
          const double f = w[(size_t)i] + epsilon_;
          for (int a = 0; a < D; a++)
            for (int b = 0; b <= a; b++) M[(size_t)a * D + b] += f * v[a] * v[b];
        }
        cholesky(M, D);  // reads the lower triangle only
        for (int64_t i = 0; i < n; i++) {
          const float* v = values.data() + (size_t)(n_sink_ + i) * D;
          for (int a = 0; a < D; a++) x[(size_t)a] = v[a];
          cholesky_solve(M, D, x);
          double lev = 0;
          for (int a = 0; a < D; a++) lev += (double)v[a] * x[(size_t)a];
          acc[(size_t)i] += w[(size_t)i] * lev;
        }
      }
      std::vector<float>& s = out[(size_t)l][(size_t)hk];
      for (int64_t i = 0; i < n_sink_; i++) s[(size_t)i] = std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < n; i++) s[(size_t)(n_sink_ + i)] = (float)(acc[(size_t)i] / G);
    });
  }

 private:
  ModelConfig cfg_;
  double tau_;                // kvpress tau: the relevance weights' temperature
  int64_t n_future_;   // kvpress n_future_positions
  int64_t n_sink_;             // kvpress n_sink
  double epsilon_;            // kvpress epsilon, added to the weights
  RopeTable rope_;
  std::vector<std::vector<double>> sum_q_;  // [layer][n_head][D]: sum of pre-RoPE queries (positions >= 4)
  std::vector<int64_t> n_;                  // [layer] queries summed
};

}  // namespace

// For the unit test (tests/unit/press/test_baseline_presses.cpp), which has no Model.
std::unique_ptr<Scorer> make_cap_scorer(const ModelConfig& c, double tau, int64_t n_future_positions, int64_t n_sink,
                                        double epsilon) {
  return std::make_unique<CapScorer>(c, tau, n_future_positions, n_sink, epsilon);
}

namespace {
RegisterScorer reg({"cap",
                    "CAP: value leverage (v^T (I + sum w v v^T)^-1 v) weighted by exp(5 cos(anchor, k)), anchor = "
                    "mean query rotated by the RoPE averaged over 512 future positions; first 4 tokens kept",
                    false,
                    [](const PressSpec& o, const Model& m) {
                      return make_cap_scorer(m.config(), press_param(o, "tau"), (int64_t)press_param(o, "n_future_positions"),
                                             (int64_t)press_param(o, "n_sink"), press_param(o, "epsilon"));
                    },
                    {.params = {{"tau", 5.0, 0, 1000, false, "the temperature of the query-relevance weights"},
                                {"n_future_positions", 512, 1, 65536, true, "the next positions the RoPE rotation is averaged over"},
                                {"n_sink", 4, 0, 1 << 20, true, "the first tokens always kept, their queries left out of the anchor"},
                                {"epsilon", 1e-6, 0, 1e6, false, "added to the weights in the capacity matrix"}},
                     .kvpress_parity = "exact (kvpress CapPress)"}});

}  // namespace
}  // namespace kvzap
