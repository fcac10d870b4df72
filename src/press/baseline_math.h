// Arithmetic shared by the kvpress baseline scorers (docs/ALGORITHMS.md §8): plain functions on arrays,
// each checked against a naive computation in tests/unit/press/test_baseline_presses.cpp.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "cache/kv_cache.h"
#include "model/config.h"
#include "model/forward.h"

namespace kvzap {

// torch avg_pool1d(kernel k (odd), stride 1, padding k/2, count_include_pad=True):
// out[i] = (1/k) * sum of x[j] for |j - i| <= k/2, with x = 0 outside [0, n). out != x.
void avg_pool_same(const float* x, int64_t n, int k, float* out);

// In place: (x - mean) / max(std, 1e-6) over n values, std with Bessel's correction (torch .std()).
void zscore_inplace(float* x, int64_t n);

// One stream's entries in f32 (the cache stores f16): keys or values [len][D], positions [len].
void stream_keys(const KvCache& cache, int layer, int head, std::vector<float>& out);
void stream_values(const KvCache& cache, int layer, int head, std::vector<float>& out);
void stream_positions(const KvCache& cache, int layer, int head, std::vector<int32_t>& out);
// Keys of slots [first, first + n) of one stream in f32: out [n][D].
void stream_key_range(const KvCache& cache, int layer, int head, int64_t first, int64_t n, float* out);

// Softmax attention of n_rows query rows over keys given transposed, keys_t [D][n_keys]:
// probs[j][i] = softmax over i < n_visible[j] of scale * q_j . k_i, and 0 for i >= n_visible[j]
// (n_visible null: every row sees every key). Row j's query is at q + j * q_stride ([D]).
void attention_probs(const float* q, int64_t q_stride, int64_t n_rows, const int64_t* n_visible, const float* keys_t,
                     int64_t n_keys, int head_dim, float scale, float* probs);

// The engine's RoPE (same tables as Forward: model/blocks.h rope_table, each layer with its own base and
// frequency scale, e.g. Gemma 3's local and global layers), for scorers that undo it (pre-RoPE queries
// and keys) or average it over future positions.
class RopeTable {
 public:
  explicit RopeTable(const ModelConfig& c);
  // Grows the tables to cover positions [0, n_pos). Not thread-safe: call before parallel use.
  void reserve(int64_t n_pos);
  // The two components rotated together by frequency i (i < head_dim / 2).
  std::pair<int, int> pair(int i) const;
  // In place: undoes layer's rotation of position pos on one head vector [head_dim]. reserve(pos + 1) first.
  void unrotate(float* x, int32_t pos, int layer) const;
  // Mean over positions [p0, p0 + n) of cos and sin of each of layer's frequencies (reserves what it needs).
  void mean_rotation(int layer, int64_t p0, int64_t n, std::vector<double>& cos_mean, std::vector<double>& sin_mean);

 private:
  struct Table {
    float base, freq_scale;
    std::vector<float> cos, sin;  // [n_pos][head_dim / 2]
  };
  ModelConfig cfg_;
  int64_t n_pos_ = 0;
  std::vector<Table> tables_;     // one per distinct (base, freq_scale)
  std::vector<int> layer_table_;  // [n_layer] index into tables_
};

// The queries of the last `window` positions seen, per layer (SnapKV's and TOVA's observation window).
class WindowQueries {
 public:
  WindowQueries(int n_layer, int n_head, int head_dim, int window);
  void clear();
  // Keeps the last `window` query rows of everything pushed for step.layer.
  void push(const LayerStep& step);
  int64_t size(int layer) const { return count_[(size_t)layer]; }
  const float* rows(int layer) const { return q_[(size_t)layer].data(); }  // [size][n_head][head_dim], oldest first
  const int32_t* positions(int layer) const { return pos_[(size_t)layer].data(); }

 private:
  int n_head_, head_dim_, window_;
  std::vector<std::vector<float>> q_;      // [layer][window][n_head][head_dim]
  std::vector<std::vector<int32_t>> pos_;  // [layer][window]
  std::vector<int64_t> count_;
};

// KeyDiff (kvpress KeyDiffPress): -cos(k_i, anchor), anchor = the mean of the L2-normalised keys, over the
// rows `rows[0..n)` of keys [T][D] (rows null: rows 0..n-1); out [n], in double (block_keydiff compares
// them across blocks).
// ExpectedAttention's logit of key k (kvpress): for a query ~ N(mu, cov) (the rotated statistics),
// k.mu / sqrt(D) + k' cov k / (2 D); without the covariance (use_covariance=False) the mean's term alone.
// y: scratch [D]. Shared by expected_attention and chunk_expected_attention (same arithmetic, same bits).
// The query statistics ExpectedAttention scores with: from the sums s1 [D] and s2 [D][D] of n pre-RoPE
// queries, mean mu = s1 / n and covariance s2 / n - mu mu', rotated by the averaged RoPE matrix R [D][D]:
// mu_out = R mu, cov_out = R cov R' (in double, stored as float).
void rotated_query_stats(const double* s1, const double* s2, double n, const double* R, int D, float* mu_out, float* cov_out);
// The same rotation of a given mean mu [D] and covariance cov [D][D] (expected_attention_stats: statistics
// computed beforehand, press/query_stats.h): mu_out = R mu, cov_out = R cov R'.
void rotate_query_stats(const double* mu, const double* cov, const double* R, int D, float* mu_out, float* cov_out);
float expected_attention_logit(const float* k, const float* mu, const float* cov, int D, bool use_covariance, float* y);
// acc[i] += softmax(logits)[i] for every i (logits is overwritten).
void add_softmax(std::vector<float>& logits, float* acc);
void keydiff_scores(const float* keys, int D, const int64_t* rows, size_t n, double* out);

// A right Gaussian sketch for stream (layer, head): [d][k] entries N(0, 1) / sqrt(k), reproducible
// from (seed, layer, head).
std::vector<double> gaussian_sketch(uint64_t seed, int layer, int head, int d, int k);

// Approximate leverage scores (kvpress LeverageScorePress): X = (K - mean over rows of K) Phi,
// G = X^T X + jitter I (kvpress tries jitter 1e-2, then x10 on failure), score_i = max(0, x_i^T G^-1 x_i)
// by Cholesky. keys [n][d] (pre-RoPE), phi [d][k] as from gaussian_sketch; out [n].
void sketched_leverage(const float* keys, int64_t n, int d, const double* phi, int k, float* out);

}  // namespace kvzap
