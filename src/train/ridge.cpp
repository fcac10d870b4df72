#include "train/ridge.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/thread_pool.h"
#include "kvzap/error.h"

namespace kvzap {
namespace {

constexpr int64_t kChunk = 256;  // rows centred together before merging into the running statistics

// In-place Cholesky A = L L^T of a dense symmetric [n][n] matrix (lower triangle written).
// Returns false when A is not positive definite.
bool cholesky(std::vector<double>& a, int n) {
  for (int j = 0; j < n; ++j) {
    double d = a[size_t(j) * n + j];
    for (int k = 0; k < j; ++k) d -= a[size_t(j) * n + k] * a[size_t(j) * n + k];
    if (!(d > 0.0)) return false;
    const double ljj = std::sqrt(d);
    a[size_t(j) * n + j] = ljj;
    for (int i = j + 1; i < n; ++i) {
      double s = a[size_t(i) * n + j];
      const double* ri = &a[size_t(i) * n];
      const double* rj = &a[size_t(j) * n];
      for (int k = 0; k < j; ++k) s -= ri[k] * rj[k];
      a[size_t(i) * n + j] = s / ljj;
    }
  }
  return true;
}

// Solves L L^T x = b in place (b has n entries).
void cholesky_solve(const std::vector<double>& l, int n, double* b) {
  for (int i = 0; i < n; ++i) {
    double s = b[i];
    for (int k = 0; k < i; ++k) s -= l[size_t(i) * n + k] * b[k];
    b[i] = s / l[size_t(i) * n + i];
  }
  for (int i = n - 1; i >= 0; --i) {
    double s = b[i];
    for (int k = i + 1; k < n; ++k) s -= l[size_t(k) * n + i] * b[k];
    b[i] = s / l[size_t(i) * n + i];
  }
}

}  // namespace

RidgeAccumulator::RidgeAccumulator(int d_in, int n_out) : d_(d_in), k_(n_out), dp_((d_in + 7) / 8 * 8) {
  if (d_in <= 0 || n_out <= 0) throw Error("ridge: invalid dimensions");
  mean_x_.assign(size_t(d_), 0.0);
  mean_y_.assign(size_t(k_), 0.0);
  sxx_.assign(size_t(d_) * dp_, 0.0);
  sxy_.assign(size_t(d_) * k_, 0.0);
}

void RidgeAccumulator::add(const float* x, const float* y, int64_t n) {
  const int d = d_, k = k_, dp = dp_;
  xc_.resize(size_t(kChunk) * dp);
  xct_.resize(size_t(dp) * kChunk);
  yc_.resize(size_t(kChunk) * k);
  std::vector<double> mx(static_cast<size_t>(d));
  std::vector<double> my(static_cast<size_t>(k));
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t b = std::min(kChunk, n - start);
    const float* xb = x + start * d;
    const float* yb = y + start * k;
    // Chunk means and centred copies.
    std::fill(mx.begin(), mx.end(), 0.0);
    std::fill(my.begin(), my.end(), 0.0);
    for (int64_t r = 0; r < b; ++r) {
      for (int i = 0; i < d; ++i) mx[size_t(i)] += xb[r * d + i];
      for (int c = 0; c < k; ++c) my[size_t(c)] += yb[r * k + c];
    }
    for (auto& v : mx) v /= double(b);
    for (auto& v : my) v /= double(b);
    for (int64_t r = 0; r < b; ++r) {
      double* row = &xc_[size_t(r) * dp];
      for (int i = 0; i < d; ++i) row[i] = double(xb[r * d + i]) - mx[size_t(i)];
      for (int i = d; i < dp; ++i) row[i] = 0.0;
      for (int c = 0; c < k; ++c) yc_[size_t(r) * k + c] = double(yb[r * k + c]) - my[size_t(c)];
    }
    for (int i = 0; i < d; ++i)
      for (int64_t r = 0; r < b; ++r) xct_[size_t(i) * b + r] = xc_[size_t(r) * dp + i];
    // Upper block rows of Xc^T Xc, 32 rows at a time (the part left of the diagonal is skipped).
    for (int i0 = 0; i0 < d; i0 += 32) {
      const int m = std::min(32, d - i0);
      dense::gemm_nn(m, d - i0, b, &xct_[size_t(i0) * b], b, &xc_[size_t(i0)], dp, &sxx_[size_t(i0) * dp + i0], dp,
                     true);
    }
    dense::gemm_nn(d, k, b, xct_.data(), b, yc_.data(), k, sxy_.data(), k, true);
    // Merge: the scatter about the joint mean gains n_a n_b / n (mean_b - mean_a)(...)^T.
    const double na = double(n_), nb = double(b), nt = na + nb, f = na * nb / nt;
    std::vector<double>& dx = mx;  // reuse: dx = mean_b - mean_a
    for (int i = 0; i < d; ++i) dx[size_t(i)] -= mean_x_[size_t(i)];
    for (int c = 0; c < k; ++c) my[size_t(c)] -= mean_y_[size_t(c)];
    if (n_ > 0) {
      for (int i = 0; i < d; ++i) {
        const double fi = f * dx[size_t(i)];
        double* row = &sxx_[size_t(i) * dp];
        for (int j = i; j < d; ++j) row[j] += fi * dx[size_t(j)];
        for (int c = 0; c < k; ++c) sxy_[size_t(i) * k + c] += fi * my[size_t(c)];
      }
    }
    for (int i = 0; i < d; ++i) mean_x_[size_t(i)] += dx[size_t(i)] * (nb / nt);
    for (int c = 0; c < k; ++c) mean_y_[size_t(c)] += my[size_t(c)] * (nb / nt);
    n_ += b;
  }
}

RidgeResult RidgeAccumulator::solve(double alpha) const {
  if (n_ == 0) throw Error("ridge: no training samples");
  const int d = d_, k = k_;
  std::vector<double> a(size_t(d) * d);
  for (int i = 0; i < d; ++i)
    for (int j = i; j < d; ++j) a[size_t(i) * d + j] = a[size_t(j) * d + i] = sxx_[size_t(i) * dp_ + j];
  for (int i = 0; i < d; ++i) a[size_t(i) * d + i] += alpha;
  if (!cholesky(a, d))
    throw Error("ridge: X^T X + alpha I is not positive definite (alpha=" + std::to_string(alpha) +
                "; degenerate or non-finite training data)");
  RidgeResult r;
  r.d_in = d;
  r.n_out = k;
  r.weight.resize(size_t(k) * d);
  r.bias.resize(size_t(k));
  std::vector<double> col(static_cast<size_t>(d));
  for (int c = 0; c < k; ++c) {
    for (int i = 0; i < d; ++i) col[size_t(i)] = sxy_[size_t(i) * k + c];
    cholesky_solve(a, d, col.data());
    double b = mean_y_[size_t(c)];
    for (int i = 0; i < d; ++i) {
      r.weight[size_t(c) * d + i] = float(col[size_t(i)]);
      b -= mean_x_[size_t(i)] * col[size_t(i)];
    }
    r.bias[size_t(c)] = float(b);
  }
  for (float v : r.weight)
    if (!std::isfinite(v)) throw Error("ridge: non-finite coefficients (check the training data)");
  for (float v : r.bias)
    if (!std::isfinite(v)) throw Error("ridge: non-finite intercept (check the training data)");
  return r;
}

RidgeResult fit_ridge(const float* x, const float* y, int64_t n, int d_in, int n_out, double alpha) {
  RidgeAccumulator acc(d_in, n_out);
  acc.add(x, y, n);
  return acc.solve(alpha);
}

RidgeResult fit_ridge(const Dataset& data, int layer, double alpha) {
  if (layer < 0 || layer >= data.n_layers()) throw Error("ridge: layer " + std::to_string(layer) + " out of range");
  const int D = data.d_model(), H = data.n_heads();
  RidgeAccumulator acc(D, H);
  std::vector<float> xb(size_t(kChunk) * D), yb(size_t(kChunk) * H);
  for (int64_t s = 0; s < data.size(); s += kChunk) {
    const int64_t b = std::min(kChunk, data.size() - s);
    data.gather_range(layer, s, b, xb.data(), yb.data());
    acc.add(xb.data(), yb.data(), b);
  }
  return acc.solve(alpha);
}

Surrogate fit_linear_surrogate(const Dataset& data, double alpha, ThreadPool* pool, const RidgeProgress& progress) {
  const int L = data.n_layers(), D = data.d_model(), H = data.n_heads();
  if (data.size() == 0) throw Error("ridge: the training dataset is empty");
  std::vector<RidgeAccumulator> acc;
  acc.reserve(size_t(L));
  for (int l = 0; l < L; ++l) acc.emplace_back(D, H);
  const int n_threads = pool ? pool->size() : 1;
  std::vector<std::vector<float>> xb(size_t(n_threads), std::vector<float>(size_t(kChunk) * D));
  std::vector<std::vector<float>> yb(size_t(n_threads), std::vector<float>(size_t(kChunk) * H));
  // Chunks of kChunk records in file order, each layer in parallel: one sequential read of the data.
  constexpr int64_t kPass = kChunk * 16;
  for (int64_t s0 = 0; s0 < data.size(); s0 += kPass) {
    const int64_t s1 = std::min(data.size(), s0 + kPass);
    auto work = [&](int64_t l, int tid) {
      for (int64_t s = s0; s < s1; s += kChunk) {
        const int64_t b = std::min(kChunk, s1 - s);
        data.gather_range(int(l), s, b, xb[size_t(tid)].data(), yb[size_t(tid)].data());
        acc[size_t(l)].add(xb[size_t(tid)].data(), yb[size_t(tid)].data(), b);
      }
    };
    if (pool)
      pool->parallel_for(L, work);
    else
      for (int l = 0; l < L; ++l) work(l, 0);
    if (progress) progress(s1, data.size());
  }
  std::vector<SurrogateLayerWeights> layers(static_cast<size_t>(L));
  auto solve = [&](int64_t l, int) {
    RidgeResult r = acc[size_t(l)].solve(alpha);
    layers[size_t(l)].w1 = std::move(r.weight);
    layers[size_t(l)].b1 = std::move(r.bias);
  };
  // Solve errors must surface as kvzap::Error on this thread, so solve serially (cheap: L Choleskys).
  for (int l = 0; l < L; ++l) solve(l, 0);
  return Surrogate(D, H, 0, std::move(layers));
}

}  // namespace kvzap
