#include "press/baseline_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "common/fp16.h"
#include "kvzap/error.h"
#include "model/blocks.h"
#include "press/kvzip_math.h"
#include "common/rng.h"

namespace kvzap {

void avg_pool_same(const float* x, int64_t n, int k, float* out) {
  const int64_t r = k / 2;
  for (int64_t i = 0; i < n; i++) {
    double s = 0;
    for (int64_t j = std::max<int64_t>(0, i - r); j <= std::min<int64_t>(n - 1, i + r); j++) s += x[j];
    out[i] = (float)(s / k);
  }
}

void zscore_inplace(float* x, int64_t n) {
  if (n <= 0) return;
  double mean = 0;
  for (int64_t i = 0; i < n; i++) mean += x[i];
  mean /= (double)n;
  double var = 0;
  for (int64_t i = 0; i < n; i++) var += ((double)x[i] - mean) * ((double)x[i] - mean);
  // torch's unbiased std of one value is NaN; the clamp below then leaves NaN, as in kvpress.
  const double sd = n > 1 ? std::sqrt(var / (double)(n - 1)) : std::numeric_limits<double>::quiet_NaN();
  const double denom = std::isnan(sd) ? sd : std::max(sd, 1e-6);
  for (int64_t i = 0; i < n; i++) x[i] = (float)(((double)x[i] - mean) / denom);
}

namespace {

// A stream's keys or values as f32 [len][D], page by page, from either element type.
template <bool kKeys>
void stream_rows(const KvCache& cache, int layer, int head, std::vector<float>& out) {
  const int D = cache.head_dim();
  const int64_t len = cache.length(layer, head);
  out.resize((size_t)(len * D));
  const KvType type = cache.kv_type();
  const bool f32 = type == KvType::F32;
  int64_t i = 0;
  for (int p = 0; p < cache.n_pages(layer, head) && i < len; p++) {
    const void* src = kKeys ? cache.page_keys_raw(layer, head, p) : cache.page_values_raw(layer, head, p);
    const int64_t m = std::min<int64_t>(KvCache::kPageTokens, len - i);
    if (kv_type_quantized(type)) {  // row by row, as key_row / value_row dequantise
      for (int64_t e = 0; e < m; e++)
        kv_dequantize_row(type, (const uint8_t*)src + e * cache.row_bytes(), &out[(size_t)((i + e) * D)], D);
    } else if (f32) {
      std::memcpy(&out[(size_t)(i * D)], src, (size_t)(m * D) * sizeof(float));
    } else {
      const uint16_t* h = (const uint16_t*)src;
      for (int64_t e = 0; e < m * D; e++) out[(size_t)(i * D + e)] = fp16_to_fp32(h[e]);
    }
    i += m;
  }
}

}  // namespace

void stream_keys(const KvCache& cache, int layer, int head, std::vector<float>& out) { stream_rows<true>(cache, layer, head, out); }
void stream_values(const KvCache& cache, int layer, int head, std::vector<float>& out) { stream_rows<false>(cache, layer, head, out); }

void stream_positions(const KvCache& cache, int layer, int head, std::vector<int32_t>& out) {
  const int64_t len = cache.length(layer, head);
  out.resize((size_t)len);
  int64_t i = 0;
  for (int p = 0; p < cache.n_pages(layer, head) && i < len; p++) {
    const int32_t* src = cache.page_positions(layer, head, p);
    const int64_t m = std::min<int64_t>(KvCache::kPageTokens, len - i);
    std::memcpy(&out[(size_t)i], src, (size_t)m * sizeof(int32_t));
    i += m;
  }
}

void stream_key_range(const KvCache& cache, int layer, int head, int64_t first, int64_t n, float* out) {
  const int D = cache.head_dim();
  for (int64_t i = 0; i < n; i++) cache.key_row(layer, head, first + i, out + (size_t)(i * D));
}

namespace {
// Four floats as one SIMD register (GCC/Clang vector extension: SSE on x86-64 baseline).
typedef float V4 __attribute__((vector_size(16)));
}  // namespace

void attention_probs(const float* q, int64_t q_stride, int64_t n_rows, const int64_t* n_visible, const float* keys_t,
                     int64_t n_keys, int head_dim, float scale, float* probs) {
  // Logits of kRows rows x kCols keys accumulate in registers over d (a register-tiled small GEMM),
  // so every key element loaded serves kRows rows and nothing is stored until the tile is done.
  constexpr int64_t kRows = 4, kCols = 8;
  if (head_dim > 256) throw Error("attention scoring supports head dimensions up to 256, got " + std::to_string(head_dim));
  const int64_t D = head_dim;
  V4 qs[kRows][256];  // each query element broadcast to a register
  for (int64_t j0 = 0; j0 < n_rows; j0 += kRows) {
    const int64_t rows = std::min(kRows, n_rows - j0);
    int64_t vis[kRows], vis_max = 0;
    for (int64_t r = 0; r < kRows; r++) {
      vis[r] = r >= rows ? 0 : n_visible ? std::max<int64_t>(0, std::min(n_visible[j0 + r], n_keys)) : n_keys;
      vis_max = std::max(vis_max, vis[r]);
      for (int64_t d = 0; d < D; d++) qs[r][d] = V4{} + (r < rows ? q[(j0 + r) * q_stride + d] * scale : 0.0f);
    }
    int64_t i = 0;
    for (; i + kCols <= vis_max; i += kCols) {
      V4 acc[kRows][2] = {};
      for (int64_t d = 0; d < D; d++) {
        const float* kd = keys_t + (size_t)d * n_keys + i;
        V4 k0, k1;
        std::memcpy(&k0, kd, sizeof k0);
        std::memcpy(&k1, kd + 4, sizeof k1);
        for (int64_t r = 0; r < kRows; r++) {
          acc[r][0] += qs[r][d] * k0;
          acc[r][1] += qs[r][d] * k1;
        }
      }
      for (int64_t r = 0; r < rows; r++) std::memcpy(probs + (j0 + r) * n_keys + i, acc[r], sizeof acc[r]);
    }
    for (; i < vis_max; i++)  // the last few keys
      for (int64_t r = 0; r < rows; r++) {
        float a = 0;
        for (int64_t d = 0; d < D; d++) a += qs[r][d][0] * keys_t[(size_t)d * n_keys + i];
        probs[(j0 + r) * n_keys + i] = a;
      }
    for (int64_t r = 0; r < rows; r++) {
      float* row = probs + (j0 + r) * n_keys;
      const int64_t v = vis[r];
      std::fill(row + v, row + n_keys, 0.0f);  // masked keys (computed for the block's longest row)
      if (v <= 0) continue;
      const float mx = *std::max_element(row, row + v);
      for (int64_t k = 0; k < v; k++) row[k] -= mx;
      exp_nonpositive_inplace(row, v);
      float lanes[8] = {};  // eight partial sums (vectorisable), added in double
      int64_t k = 0;
      for (; k + 8 <= v; k += 8)
        for (int u = 0; u < 8; u++) lanes[u] += row[k + u];
      double sum = 0;
      for (; k < v; k++) sum += row[k];
      for (float x : lanes) sum += x;
      const float inv = (float)(1.0 / sum);
      for (int64_t k = 0; k < v; k++) row[k] *= inv;
    }
  }
}

RopeTable::RopeTable(const ModelConfig& c) : cfg_(c) {
  auto table_for = [&](float base, float scale) {
    for (size_t i = 0; i < tables_.size(); i++)
      if (tables_[i].base == base && tables_[i].freq_scale == scale) return (int)i;
    tables_.push_back({base, scale, {}, {}});
    return (int)tables_.size() - 1;
  };
  for (int l = 0; l < c.n_layer; l++)
    layer_table_.push_back(l < (int)c.layers.size() ? table_for(c.layers[(size_t)l].rope_base, c.layers[(size_t)l].rope_freq_scale)
                                                     : table_for(c.rope_base, c.rope_freq_scale));
}

void RopeTable::reserve(int64_t n_pos) {
  if (n_pos <= n_pos_) return;
  const int64_t n = std::max(n_pos, 2 * n_pos_);
  const int half = cfg_.head_dim / 2;
  for (Table& t : tables_) {
    t.cos.resize((size_t)(n * half));
    t.sin.resize((size_t)(n * half));
    rope_table(n, cfg_.head_dim, t.base, t.freq_scale, t.cos.data(), t.sin.data(),
               cfg_.rope_freq_factors.empty() ? nullptr : cfg_.rope_freq_factors.data());
  }
  n_pos_ = n;
}

std::pair<int, int> RopeTable::pair(int i) const {
  if (cfg_.rope_mode == RopeMode::Adjacent) return {2 * i, 2 * i + 1};
  return {i, i + cfg_.head_dim / 2};
}

void RopeTable::unrotate(float* x, int32_t pos, int layer) const {
  const int half = cfg_.head_dim / 2;
  const Table& t = tables_[(size_t)layer_table_[(size_t)layer]];
  const float* c = t.cos.data() + (size_t)pos * half;
  const float* s = t.sin.data() + (size_t)pos * half;
  for (int i = 0; i < half; i++) {
    const auto [a, b] = pair(i);
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * c[i] + x1 * s[i];
    x[b] = -x0 * s[i] + x1 * c[i];
  }
}

void RopeTable::mean_rotation(int layer, int64_t p0, int64_t n, std::vector<double>& cos_mean,
                              std::vector<double>& sin_mean) {
  const int half = cfg_.head_dim / 2;
  reserve(p0 + n);
  const Table& t = tables_[(size_t)layer_table_[(size_t)layer]];
  cos_mean.assign((size_t)half, 0.0);
  sin_mean.assign((size_t)half, 0.0);
  for (int64_t p = p0; p < p0 + n; p++)
    for (int i = 0; i < half; i++) {
      cos_mean[(size_t)i] += t.cos[(size_t)(p * half + i)];
      sin_mean[(size_t)i] += t.sin[(size_t)(p * half + i)];
    }
  for (int i = 0; i < half; i++) {
    cos_mean[(size_t)i] /= (double)n;
    sin_mean[(size_t)i] /= (double)n;
  }
}

WindowQueries::WindowQueries(int n_layer, int n_head, int head_dim, int window)
    : n_head_(n_head), head_dim_(head_dim), window_(window) {
  q_.assign((size_t)n_layer, std::vector<float>((size_t)window * n_head * head_dim));
  pos_.assign((size_t)n_layer, std::vector<int32_t>((size_t)window));
  count_.assign((size_t)n_layer, 0);
}

void WindowQueries::clear() { std::fill(count_.begin(), count_.end(), 0); }

void WindowQueries::push(const LayerStep& step) {
  const size_t row = (size_t)n_head_ * head_dim_;
  const size_t l = (size_t)step.layer;
  std::vector<float>& q = q_[l];
  std::vector<int32_t>& pos = pos_[l];
  int64_t& count = count_[l];
  const int64_t take = std::min<int64_t>(step.n_tok, window_);
  const int64_t keep = std::min<int64_t>(count, window_ - take);  // old rows that stay
  if (keep > 0 && count - keep > 0) {
    std::memmove(q.data(), q.data() + (size_t)(count - keep) * row, (size_t)keep * row * sizeof(float));
    std::memmove(pos.data(), pos.data() + (count - keep), (size_t)keep * sizeof(int32_t));
  }
  const int64_t first = step.n_tok - take;
  std::memcpy(q.data() + (size_t)keep * row, step.q + (size_t)first * row, (size_t)take * row * sizeof(float));
  std::memcpy(pos.data() + keep, step.pos + first, (size_t)take * sizeof(int32_t));
  count = keep + take;
}

void keydiff_scores(const float* keys, int D, const int64_t* rows, size_t n, double* out) {
  auto key = [&](size_t j) { return keys + (size_t)(rows ? rows[j] : (int64_t)j) * D; };
  std::vector<double> norm(n), anchor((size_t)D, 0.0);
  for (size_t j = 0; j < n; j++) {
    const float* k = key(j);
    double s = 0;
    for (int d = 0; d < D; d++) s += (double)k[d] * k[d];
    norm[j] = std::sqrt(s);
    const double inv = 1.0 / std::max(norm[j], 1e-12);  // F.normalize's eps
    for (int d = 0; d < D; d++) anchor[(size_t)d] += k[d] * inv;
  }
  double an = 0;
  for (double& a : anchor) {
    a /= (double)n;
    an += a * a;
  }
  an = std::sqrt(an);
  for (size_t j = 0; j < n; j++) {
    const float* k = key(j);
    double dot = 0;
    for (int d = 0; d < D; d++) dot += k[d] * anchor[(size_t)d];
    out[j] = -dot / std::max(norm[j] * an, 1e-8);  // cosine_similarity's eps
  }
}

std::vector<double> gaussian_sketch(uint64_t seed, int layer, int head, int d, int k) {
  // common/rng.h draws: the same sketch with every standard library (std::normal_distribution is not).
  Rng rng(seed * 0x9E3779B97F4A7C15ull + (uint64_t)layer * 1000003ull + (uint64_t)head);
  std::vector<double> phi((size_t)d * k);
  const double scale = 1.0 / std::sqrt((double)k);
  for (double& x : phi) x = standard_normal(rng) * scale;
  return phi;
}

namespace {

// Lower Cholesky factor of the k x k matrix a (in place, row-major); false if not positive definite.
bool cholesky(std::vector<double>& a, int k) {
  for (int j = 0; j < k; j++) {
    double s = a[(size_t)j * k + j];
    for (int p = 0; p < j; p++) s -= a[(size_t)j * k + p] * a[(size_t)j * k + p];
    if (!(s > 0)) return false;
    const double ljj = std::sqrt(s);
    a[(size_t)j * k + j] = ljj;
    for (int i = j + 1; i < k; i++) {
      double t = a[(size_t)i * k + j];
      for (int p = 0; p < j; p++) t -= a[(size_t)i * k + p] * a[(size_t)j * k + p];
      a[(size_t)i * k + j] = t / ljj;
    }
    for (int i = 0; i < j; i++) a[(size_t)i * k + j] = 0;
  }
  return true;
}

}  // namespace

void sketched_leverage(const float* keys, int64_t n, int d, const double* phi, int k, float* out) {
  if (n <= 0) return;
  std::vector<double> mean((size_t)d, 0.0);
  for (int64_t i = 0; i < n; i++)
    for (int c = 0; c < d; c++) mean[(size_t)c] += keys[(size_t)(i * d + c)];
  for (double& m : mean) m /= (double)n;
  // X = (K - mean) Phi: [n][k]
  std::vector<double> x((size_t)(n * k), 0.0);
  for (int64_t i = 0; i < n; i++) {
    double* xi = &x[(size_t)(i * k)];
    for (int c = 0; c < d; c++) {
      const double kc = keys[(size_t)(i * d + c)] - mean[(size_t)c];
      const double* pc = phi + (size_t)c * k;
      for (int j = 0; j < k; j++) xi[j] += kc * pc[j];
    }
  }
  std::vector<double> g((size_t)k * k, 0.0);
  for (int64_t i = 0; i < n; i++) {
    const double* xi = &x[(size_t)(i * k)];
    for (int a = 0; a < k; a++)
      for (int b = 0; b < k; b++) g[(size_t)a * k + b] += xi[a] * xi[b];
  }
  std::vector<double> l;
  double jitter = 1e-2;
  bool ok = false;
  for (int attempt = 0; attempt < 5 && !ok; attempt++) {
    l = g;
    for (int a = 0; a < k; a++) l[(size_t)a * k + a] += jitter;
    ok = cholesky(l, k);
    jitter *= 10;
  }
  if (!ok) throw Error("leverage scores: the sketched key Gram matrix is not positive definite");
  // score_i = ||L^-1 x_i||^2 = x_i^T G^-1 x_i (forward substitution).
  std::vector<double> y((size_t)k);
  for (int64_t i = 0; i < n; i++) {
    const double* xi = &x[(size_t)(i * k)];
    double s = 0;
    for (int a = 0; a < k; a++) {
      double t = xi[a];
      for (int p = 0; p < a; p++) t -= l[(size_t)a * k + p] * y[(size_t)p];
      y[(size_t)a] = t / l[(size_t)a * k + a];
      s += y[(size_t)a] * y[(size_t)a];
    }
    out[i] = (float)std::max(0.0, s);
  }
}

void rotated_query_stats(const double* s1, const double* s2, double n, const double* R, int D, float* mu_out, float* cov_out) {
  std::vector<double> mu((size_t)D), cov((size_t)D * D);
  for (int a = 0; a < D; a++) mu[(size_t)a] = s1[a] / n;
  for (int a = 0; a < D; a++)
    for (int b = 0; b < D; b++) cov[(size_t)a * D + b] = s2[(size_t)a * D + b] / n - mu[(size_t)a] * mu[(size_t)b];
  rotate_query_stats(mu.data(), cov.data(), R, D, mu_out, cov_out);
}

void rotate_query_stats(const double* mu, const double* cov, const double* R, int D, float* mu_out, float* cov_out) {
  std::vector<double> tmp((size_t)D * D, 0.0);
  for (int a = 0; a < D; a++) {
    double m = 0;
    for (int b = 0; b < D; b++) m += R[(size_t)a * D + b] * mu[b];
    mu_out[a] = (float)m;
  }
  for (int a = 0; a < D; a++)  // tmp = R cov
    for (int c = 0; c < D; c++) {
      const double r = R[(size_t)a * D + c];
      if (r == 0) continue;
      for (int b = 0; b < D; b++) tmp[(size_t)a * D + b] += r * cov[(size_t)c * D + b];
    }
  for (int a = 0; a < D; a++)  // cov' = tmp R^T
    for (int b = 0; b < D; b++) {
      double x = 0;
      for (int c = 0; c < D; c++) x += tmp[(size_t)a * D + c] * R[(size_t)b * D + c];
      cov_out[(size_t)a * D + b] = (float)x;
    }
}

float expected_attention_logit(const float* k, const float* mu, const float* cov, int D, bool use_covariance, float* y) {
  if (!use_covariance) {
    double lin = 0;
    for (int a = 0; a < D; a++) lin += (double)k[a] * mu[a];
    return (float)(lin / std::sqrt((double)D));
  }
  std::fill(y, y + D, 0.0f);
  for (int b = 0; b < D; b++) {  // y = cov k (cov symmetric: row b times k_b)
    const float kb = k[b];
    const float* cb = cov + (size_t)b * D;
    for (int a = 0; a < D; a++) y[a] += cb[a] * kb;
  }
  double lin = 0, quad = 0;
  for (int a = 0; a < D; a++) {
    lin += (double)k[a] * mu[a];
    quad += (double)k[a] * y[a];
  }
  return (float)(lin / std::sqrt((double)D) + quad / (2.0 * D));
}

void add_softmax(std::vector<float>& logits, float* acc) {
  float mx = -std::numeric_limits<float>::infinity();
  for (float x : logits) mx = std::max(mx, x);
  double sum = 0;
  for (float& x : logits) sum += (x = std::exp(x - mx));
  for (size_t i = 0; i < logits.size(); i++) acc[i] += (float)(logits[i] / sum);
}

}  // namespace kvzap
