// "chunk_expected_attention" (docs/ALGORITHMS.md §8.28, kvpress ChunkPress(ExpectedAttentionPress(epsilon=1e-2),
// chunk_length=1024)): ExpectedAttention (§8.8) on each chunk of chunk_length slots alone (the remainder is one
// more chunk). Per chunk of n entries: the pre-RoPE queries of the chunk from its 5th entry on give each
// query head a mean and covariance (population); the RoPE rotation averaged over positions n .. n + 511 (kvpress
// counts them from the chunk's own length) moves them; a key of the chunk past its first 4 gets logit
// k.mu'/sqrt(D) + k^T Sigma' k / (2D), softmax over those keys, mean over the group, then (score + epsilon) x
// ||v||. The chunk's first 4 entries score +inf. Each (layer, KV head) keeps max(1, int(n (1 - ratio))) of the
// n entries of every chunk (the ratio scope does not apply). A last chunk of at most 4 entries (kvpress
// asserts there) is kept whole.
//
// A whole chunk is scored as soon as the prefill has passed it (its statistics, keys and values are all
// known then), so only the open chunk's query sums are held.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "kvzap/error.h"
#include "model/model.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

constexpr int kSinks = 4;
constexpr int kFuturePositions = 512;

class ChunkExpectedAttentionScorer : public CacheContextScorer, public ChunkBudget {
 public:
  ChunkExpectedAttentionScorer(const ModelConfig& c, int64_t chunk, double epsilon)
      : ChunkBudget(chunk, kSinks), cfg_(c), epsilon_(epsilon), rope_(c), layers_((size_t)c.n_layer) {
    if (chunk <= kSinks)
      throw Error("chunk_expected_attention's chunk_length must exceed its " + std::to_string(kSinks) + " sinks, got " +
                  std::to_string(chunk));
    reset();
  }

  void reset() override {
    const size_t H = (size_t)cfg_.n_head, D = (size_t)cfg_.head_dim;
    for (Layer& s : layers_) {
      s.open = -1;
      s.n = 0;
      s.s1.assign(H * D, 0.0);
      s.s2.assign(H * D * D, 0.0);
      s.scored = 0;
      s.vnorm.assign((size_t)cfg_.n_head_kv, {});
      s.scores.assign((size_t)cfg_.n_head_kv, {});
    }
  }

  void observe_step(const LayerStep& step, const KvCache& cache) override {
    const int l = step.layer, H = cfg_.n_head, Hkv = cfg_.n_head_kv, D = cfg_.head_dim;
    Layer& s = layers_[(size_t)l];
    int32_t max_pos = 0;
    for (int64_t t = 0; t < step.n_tok; t++) max_pos = std::max(max_pos, step.pos[t]);
    rope_.reserve((int64_t)max_pos + 1);
    for (int h = 0; h < Hkv; h++) {  // ||v|| of every entry, by position
      std::vector<float>& vn = s.vnorm[(size_t)h];
      if ((int64_t)vn.size() <= max_pos) vn.resize((size_t)max_pos + 1, 0.0f);
      for (int64_t t = 0; t < step.n_tok; t++) {
        const float* v = step.v + ((size_t)t * Hkv + h) * D;
        double sq = 0;
        for (int d = 0; d < D; d++) sq += (double)v[d] * v[d];
        vn[(size_t)step.pos[t]] = (float)std::sqrt(sq);
      }
    }
    // Segments of the step inside one chunk; a segment that ends a chunk closes it.
    for (int64_t t0 = 0; t0 < step.n_tok;) {
      const int64_t c = step.pos[t0] / chunk_;
      int64_t t1 = t0;
      while (t1 < step.n_tok && step.pos[t1] / chunk_ == c) t1++;
      if (c != s.open) {
        if (step.pos[t0] % chunk_ != 0) throw Error("internal: chunk_expected_attention saw a chunk from its middle");
        s.open = c;
        s.n = 0;
        std::fill(s.s1.begin(), s.s1.end(), 0.0);
        std::fill(s.s2.begin(), s.s2.end(), 0.0);
      }
      for (int64_t t = t0; t < t1; t++) s.n += step.pos[t] % chunk_ >= kSinks;
      parallel_for(H, [&](int64_t h, int) {
        double* s1 = &s.s1[(size_t)(h * D)];
        double* s2 = &s.s2[(size_t)(h * D * D)];
        std::vector<float> q((size_t)D);
        for (int64_t t = t0; t < t1; t++) {
          if (step.pos[t] % chunk_ < kSinks) continue;
          std::copy_n(step.q + (size_t)(t * H + h) * D, D, q.begin());
          rope_.unrotate(q.data(), step.pos[t], l);
          for (int a = 0; a < D; a++) {
            const double qa = q[(size_t)a];
            s1[a] += qa;
            double* row = s2 + (size_t)a * D;
            for (int b = 0; b < D; b++) row[b] += qa * (double)q[(size_t)b];
          }
        }
      });
      if (step.pos[t1 - 1] % chunk_ == chunk_ - 1 && judged_layer(cache, l)) score_chunk(cache, l, c, chunk_);
      t0 = t1;
    }
  }

  void score_cache(const KvCache& cache, CacheScores& out) override {
    const int64_t T = require_full_context(cache, "chunk_expected_attention");
    size_scores(cache, out);
    if (T == 0) return;
    const int64_t n_chunks = (T + chunk_ - 1) / chunk_;
    for (int l = 0; l < cfg_.n_layer; l++) {
      if (!judged_layer(cache, l)) continue;
      Layer& s = layers_[(size_t)l];
      if (T % chunk_ != 0 && s.scored == n_chunks - 1) {
        if (s.open != n_chunks - 1) throw Error("internal: chunk_expected_attention did not see the last chunk");
        score_chunk(cache, l, n_chunks - 1, T - (n_chunks - 1) * chunk_);
      }
      if (s.scored != n_chunks) throw Error("internal: chunk_expected_attention did not see the whole context prefill");
      for (int h = 0; h < cfg_.n_head_kv; h++)
        std::copy_n(s.scores[(size_t)h].begin(), T, out[(size_t)l][(size_t)h].begin());
    }
  }

 private:
  struct Layer {
    int64_t open = -1;                      // the chunk whose queries are being summed
    int64_t n = 0;                          // queries summed (chunk entries past the sinks)
    std::vector<double> s1, s2;             // [n_head][D], [n_head][D][D]: sums of pre-RoPE q and q q^T
    int64_t scored = 0;                     // chunks scored
    std::vector<std::vector<float>> vnorm;  // [n_head_kv][position]
    std::vector<std::vector<float>> scores; // [n_head_kv][position] of the scored chunks
  };

  // The averaged rotation over positions [n, n + 512) of layer l as a dense [D][D] matrix.
  const std::vector<double>& rbar(int l, int64_t n) {
    std::vector<double>& R = rbar_[{l, n}];
    if (!R.empty()) return R;
    const int D = cfg_.head_dim;
    std::vector<double> cbar, sbar;
    rope_.mean_rotation(l, n, kFuturePositions, cbar, sbar);
    R.assign((size_t)D * D, 0.0);
    for (int i = 0; i < D / 2; i++) {
      const auto [a, b] = rope_.pair(i);
      R[(size_t)a * D + a] = cbar[(size_t)i];
      R[(size_t)a * D + b] = -sbar[(size_t)i];
      R[(size_t)b * D + a] = sbar[(size_t)i];
      R[(size_t)b * D + b] = cbar[(size_t)i];
    }
    return R;
  }

  // Scores chunk c (n entries) of layer l from the open sums and the cache's keys.
  void score_chunk(const KvCache& cache, int l, int64_t c, int64_t n) {
    const int Hkv = cfg_.n_head_kv, G = cfg_.n_group(), D = cfg_.head_dim;
    Layer& s = layers_[(size_t)l];
    if (s.open != c || s.scored != c) throw Error("internal: chunk_expected_attention scores its chunks out of order");
    const int64_t c0 = c * chunk_, m = n - kSinks;  // scored keys: slots [c0 + kSinks, c0 + n)
    for (int h = 0; h < Hkv; h++) {
      if (cache.length(l, h) < c0 + n) throw Error("internal: chunk_expected_attention's chunk is not in the cache");
      s.scores[(size_t)h].resize((size_t)(c0 + n), std::numeric_limits<float>::infinity());
      std::fill(s.scores[(size_t)h].begin() + c0, s.scores[(size_t)h].begin() + c0 + n, std::numeric_limits<float>::infinity());
    }
    s.scored = c + 1;
    if (m <= 0) return;  // no key past the sinks: kept whole
    const std::vector<double>& R = rbar(l, n);
    parallel_for(Hkv, [&](int64_t hk, int) {
      std::vector<float> keys((size_t)(m * D)), mu((size_t)D), cov((size_t)D * D), y((size_t)D), logits((size_t)m),
          acc((size_t)m, 0.0f);
      stream_key_range(cache, l, (int)hk, c0 + kSinks, m, keys.data());
      for (int g = 0; g < G; g++) {
        rotated_stats(s, (int)hk * G + g, R, mu, cov);
        for (int64_t i = 0; i < m; i++) {
          const float* k = keys.data() + (size_t)i * D;
          logits[(size_t)i] = expected_attention_logit(k, mu.data(), cov.data(), D, /*use_covariance=*/true, y.data());
        }
        add_softmax(logits, acc.data());
      }
      std::vector<float>& out = s.scores[(size_t)hk];
      const std::vector<float>& vn = s.vnorm[(size_t)hk];
      for (int64_t i = 0; i < m; i++) {
        const int64_t p = c0 + kSinks + i;
        out[(size_t)p] = (float)(((double)acc[(size_t)i] / G + epsilon_) * (double)vn[(size_t)p]);
      }
    });
  }

  // mu' = Rbar mu and Sigma' = Rbar Sigma Rbar^T of query head h over the open chunk, as floats.
  void rotated_stats(const Layer& s, int h, const std::vector<double>& R, std::vector<float>& mu_out,
                     std::vector<float>& cov_out) const {
    const int D = cfg_.head_dim;
    rotated_query_stats(&s.s1[(size_t)h * D], &s.s2[(size_t)h * D * D], (double)s.n, R.data(), D, mu_out.data(),
                        cov_out.data());
  }

  ModelConfig cfg_;
  double epsilon_;
  RopeTable rope_;
  std::vector<Layer> layers_;
  std::map<std::pair<int, int64_t>, std::vector<double>> rbar_;  // (layer, chunk length) -> Rbar
};

}  // namespace

// For the unit test (tests/unit/press/test_baseline_presses.cpp), which has no Model.
std::unique_ptr<Scorer> make_chunk_expected_attention_scorer(const ModelConfig& c, int64_t chunk_length, double epsilon) {
  return std::make_unique<ChunkExpectedAttentionScorer>(c, chunk_length, epsilon);
}

namespace {
RegisterScorer reg({"chunk_expected_attention",
                    "ChunkPress(ExpectedAttention, eps 1e-2): ExpectedAttention on each 1024-token chunk alone (the "
                    "chunk's query statistics), each chunk keeping its share (the ratio scope does not apply)",
                    false,
                    [](const PressSpec& o, const Model& m) {
                      return make_chunk_expected_attention_scorer(m.config(), (int64_t)press_param(o, "chunk_length"),
                                                                  press_param(o, "epsilon"));
                    },
                    {.params = {{"chunk_length", 1024, 5, 1 << 20, true, "slots per chunk, each compressed alone"},
                                {"epsilon", 1e-2, 0, 1, false, "added to the attention before the ||v|| weighting"}},
                     .kvpress_parity = "exact (kvpress ChunkPress(ExpectedAttentionPress(epsilon=1e-2)))"}});
}  // namespace

}  // namespace kvzap
