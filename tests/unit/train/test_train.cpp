// Surrogate training: the KVZD dataset file (resumable appends), ridge against an independent
// solver, MLP gradients against finite differences, one AdamW/cosine/clip step against an
// independent re-implementation, a small fit that must learn, determinism, and the R² metric.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/fp16.h"
#include "kernels/thread_pool.h"
#include "kvzap/error.h"
#include "train/dataset.h"
#include "train/metrics.h"
#include "train/mlp.h"
#include "train/ridge.h"
#include "test_support.h"

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;
using namespace kvzap;

namespace {

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("kvzap_test_train_" + std::to_string(::getpid()) + "_" + name);
}

std::vector<float> randn(std::mt19937& rng, size_t n, float mean = 0.0f, float sd = 1.0f) {
  std::normal_distribution<float> d(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Fills a dataset with x ~ N(0,1) (+ per-layer offsets) and y = f(x) per layer and head.
Dataset synthetic(int L, int D, int H, int64_t n, uint32_t seed, DatasetDtype dt, bool nonlinear) {
  Dataset ds({L, D, H, dt});
  std::mt19937 rng(seed);
  std::mt19937 wrng(1234);  // the target function is the same for every seed
  const std::vector<float> w = randn(wrng, size_t(L) * H * D, 0.0f, 0.3f);
  std::vector<float> x(size_t(L) * D), y(size_t(L) * H);
  for (int64_t i = 0; i < n; ++i) {
    x = randn(rng, x.size());
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        double z = 0.0;
        for (int d = 0; d < D; ++d) z += double(w[(size_t(l) * H + h) * D + d]) * x[size_t(l) * D + d];
        y[size_t(l) * H + h] = float(nonlinear ? std::tanh(z) * 2.0 + 0.5 * z * z - 3.0 : z - 4.0);
      }
    ds.append(uint32_t(i / 10), uint32_t(i % 10), x.data(), y.data());
  }
  return ds;
}

// Gaussian elimination with partial pivoting in long double on [n][n+1].
std::vector<long double> gauss_solve(std::vector<std::vector<long double>> a) {
  const size_t n = a.size();
  for (size_t c = 0; c < n; ++c) {
    size_t piv = c;
    for (size_t r = c + 1; r < n; ++r)
      if (std::fabs(a[r][c]) > std::fabs(a[piv][c])) piv = r;
    std::swap(a[c], a[piv]);
    for (size_t r = 0; r < n; ++r) {
      if (r == c) continue;
      const long double f = a[r][c] / a[c][c];
      for (size_t k = c; k <= n; ++k) a[r][k] -= f * a[c][k];
    }
  }
  std::vector<long double> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = a[i][n] / a[i][i];
  return x;
}

// Ridge with an unpenalised intercept, posed without centring: minimise
// |y - X w - b|^2 + alpha |w|^2 via the augmented normal equations [X 1]^T [X 1] + diag(alpha.., 0).
void independent_ridge(const std::vector<float>& x, const std::vector<float>& y, int64_t n, int d, int k, double alpha,
                       std::vector<double>& coef /*[k][d]*/, std::vector<double>& intercept) {
  coef.assign(size_t(k) * d, 0.0);
  intercept.assign(size_t(k), 0.0);
  const int m = d + 1;
  for (int c = 0; c < k; ++c) {
    std::vector<std::vector<long double>> a(size_t(m), std::vector<long double>(size_t(m) + 1, 0.0L));
    for (int64_t r = 0; r < n; ++r) {
      std::vector<long double> z(static_cast<size_t>(m));
      for (int i = 0; i < d; ++i) z[size_t(i)] = x[size_t(r) * d + i];
      z[size_t(d)] = 1.0L;
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < m; ++j) a[size_t(i)][size_t(j)] += z[size_t(i)] * z[size_t(j)];
        a[size_t(i)][size_t(m)] += z[size_t(i)] * (long double)y[size_t(r) * k + c];
      }
    }
    for (int i = 0; i < d; ++i) a[size_t(i)][size_t(i)] += alpha;
    const std::vector<long double> sol = gauss_solve(a);
    for (int i = 0; i < d; ++i) coef[size_t(c) * d + i] = double(sol[size_t(i)]);
    intercept[size_t(c)] = double(sol[size_t(d)]);
  }
}

}  // namespace

// ---------------------------------------------------------------- dataset

TEST(Dataset, InMemoryAndFileRoundTripPerDtype) {
  for (DatasetDtype dt : {DatasetDtype::F32, DatasetDtype::F16, DatasetDtype::BF16}) {
    const int L = 3, D = 5, H = 2;  // odd sizes exercise record padding
    std::mt19937 rng(4);
    Dataset ds({L, D, H, dt});
    std::vector<std::vector<float>> xs, ys;
    for (int i = 0; i < 7; ++i) {
      xs.push_back(randn(rng, size_t(L) * D, 0.0f, 3.0f));
      ys.push_back(randn(rng, size_t(L) * H));
      ds.append(uint32_t(100 + i / 3), uint32_t(i), xs.back().data(), ys.back().data());
    }
    const fs::path p = temp_path(std::string("rt_") + dataset_dtype_name(dt) + ".kvzd");
    ds.save(p.string());
    const Dataset back = Dataset::open(p.string());
    EXPECT_TRUE(back.is_mapped());
    EXPECT_EQ(back.shape(), ds.shape());
    ASSERT_EQ(back.size(), 7);
    for (int i = 0; i < 7; ++i) {
      EXPECT_EQ(back.group(i), uint32_t(100 + i / 3));
      EXPECT_EQ(back.position(i), uint32_t(i));
      for (int l = 0; l < L; ++l) {
        std::vector<float> row(static_cast<size_t>(D));
        back.x_row(i, l, row.data());
        for (int d = 0; d < D; ++d) {
          const float v = xs[size_t(i)][size_t(l) * D + d];
          const float expect = dt == DatasetDtype::F32 ? v
                               : dt == DatasetDtype::F16 ? fp16_to_fp32(fp32_to_fp16(v))
                                                        : bf16_to_fp32(fp32_to_bf16(v));
          EXPECT_EQ(row[size_t(d)], expect);
        }
        for (int h = 0; h < H; ++h) EXPECT_EQ(back.y(i, l, h), ys[size_t(i)][size_t(l) * H + h]);
      }
    }
    // gather == x_row, subset keeps records.
    const std::vector<int64_t> idx = {6, 0, 3};
    std::vector<float> gx(3 * D), gy(3 * H), row(static_cast<size_t>(D));
    back.gather(2, idx.data(), 3, gx.data(), gy.data());
    for (int r = 0; r < 3; ++r) {
      back.x_row(idx[size_t(r)], 2, row.data());
      for (int d = 0; d < D; ++d) EXPECT_EQ(gx[size_t(r) * D + d], row[size_t(d)]);
      EXPECT_EQ(gy[size_t(r) * H + 1], back.y(idx[size_t(r)], 2, 1));
    }
    const Dataset sub = back.subset(idx);
    ASSERT_EQ(sub.size(), 3);
    EXPECT_EQ(sub.position(0), 6u);
    EXPECT_EQ(sub.y(2, 1, 0), back.y(3, 1, 0));
    fs::remove(p);
  }
}

TEST(Dataset, PartialRecordIsIgnoredAndTruncatedOnAppend) {
  const DatasetShape shape{2, 4, 3, DatasetDtype::F16};
  const fs::path p = temp_path("append.kvzd");
  std::vector<float> x(8, 0.5f), y(6, -1.0f);
  {
    DatasetWriter w = DatasetWriter::create(p.string(), shape);
    for (int i = 0; i < 5; ++i) w.append(uint32_t(i < 3 ? 0 : 1), uint32_t(i), x.data(), y.data());
    EXPECT_EQ(w.size(), 5);
    EXPECT_EQ(*w.last_group(), 1u);
    EXPECT_EQ(w.last_group_count(), 2);
  }
  const size_t whole = fs::file_size(p);
  EXPECT_EQ(whole, 64 + 5 * shape.record_bytes());
  {  // simulate an interrupted append: half a record of garbage
    std::ofstream out(p, std::ios::binary | std::ios::app);
    const std::string junk(shape.record_bytes() / 2, '\x7f');
    out << junk;
  }
  EXPECT_EQ(Dataset::open(p.string()).size(), 5);
  {
    DatasetWriter w = DatasetWriter::open_append(p.string(), shape);
    EXPECT_EQ(w.size(), 5);
    EXPECT_EQ(fs::file_size(p), whole);  // partial record cut before appending
    EXPECT_EQ(*w.last_group(), 1u);
    EXPECT_EQ(w.last_group_count(), 2);
    w.drop_last_group();  // a collector restarting window 1
    EXPECT_EQ(w.size(), 3);
    EXPECT_EQ(*w.last_group(), 0u);
    EXPECT_EQ(w.last_group_count(), 3);
    x[0] = 2.0f;
    w.append(7, 9, x.data(), y.data());
    w.append(7, 10, x.data(), y.data());
    w.truncate(4);  // drops a buffered record
    EXPECT_EQ(w.last_group_count(), 1);
  }
  const Dataset ds = Dataset::open(p.string());
  ASSERT_EQ(ds.size(), 4);
  EXPECT_EQ(ds.group(3), 7u);
  EXPECT_EQ(ds.position(3), 9u);
  std::vector<float> row(4);
  ds.x_row(3, 0, row.data());
  EXPECT_EQ(row[0], 2.0f);
  {  // header count is kept in step with the data
    std::ifstream in(p, std::ios::binary);
    char h[64];
    in.read(h, 64);
    uint64_t n;
    std::memcpy(&n, h + 24, 8);
    EXPECT_EQ(n, 4u);
    EXPECT_EQ(std::string(h, 4), "KVZD");
  }
  // Appending with another shape is refused.
  try {
    DatasetWriter::open_append(p.string(), {2, 4, 2, DatasetDtype::F16});
    FAIL() << "shape mismatch accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("existing file has shape"), std::string::npos) << e.what();
  }
  fs::remove(p);
}

TEST(Dataset, CorruptFilesAreRejected) {
  const fs::path p = temp_path("bad.kvzd");
  {
    std::ofstream(p, std::ios::binary) << "KVZ";
  }
  EXPECT_THROW(Dataset::open(p.string()), Error);
  {
    std::ofstream out(p, std::ios::binary);
    out << std::string(64, '\0');
  }
  try {
    Dataset::open(p.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad magic"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
  }
  Dataset ok({1, 2, 1, DatasetDtype::F32});
  ok.save(p.string());
  {  // corrupt the dtype code
    std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(20);
    const uint32_t bad = 9;
    f.write(reinterpret_cast<const char*>(&bad), 4);
  }
  EXPECT_THROW(Dataset::open(p.string()), Error);
  EXPECT_THROW(Dataset::open(temp_path("missing.kvzd").string()), Error);
  EXPECT_THROW(Dataset({0, 2, 1, DatasetDtype::F32}), Error);
  EXPECT_THROW(parse_dataset_dtype("f8"), Error);
  EXPECT_EQ(parse_dataset_dtype("bf16"), DatasetDtype::BF16);
  fs::remove(p);
}

// ---------------------------------------------------------------- ridge

TEST(Ridge, MatchesIndependentNormalEquations) {
  std::mt19937 rng(5);
  for (const auto& [n, d, k, alpha] : std::vector<std::tuple<int64_t, int, int, double>>{
           {40, 6, 3, 1.0}, {700, 13, 2, 1.0}, {300, 9, 1, 25.0}, {20, 30, 2, 1.0}}) {
    // Offset features (mean 5) and correlated columns stress the centring.
    std::vector<float> x = randn(rng, size_t(n) * d, 5.0f, 1.0f);
    for (int64_t r = 0; r < n; ++r) x[size_t(r) * d + 1] = x[size_t(r) * d] * 0.9f + 0.1f * x[size_t(r) * d + 1];
    const std::vector<float> w = randn(rng, size_t(k) * d);
    std::vector<float> y(size_t(n) * k);
    std::normal_distribution<float> noise(0.0f, 0.5f);
    for (int64_t r = 0; r < n; ++r)
      for (int c = 0; c < k; ++c) {
        double s = -7.0 + c;
        for (int i = 0; i < d; ++i) s += double(w[size_t(c) * d + i]) * x[size_t(r) * d + i];
        y[size_t(r) * k + c] = float(s) + noise(rng);
      }
    const RidgeResult got = fit_ridge(x.data(), y.data(), n, d, k, alpha);
    std::vector<double> coef, icpt;
    independent_ridge(x, y, n, d, k, alpha, coef, icpt);
    ASSERT_EQ(got.weight.size(), coef.size());
    for (size_t i = 0; i < coef.size(); ++i) EXPECT_NEAR(got.weight[i], coef[i], 1e-4 * (1 + std::abs(coef[i])));
    for (int c = 0; c < k; ++c) EXPECT_NEAR(got.bias[size_t(c)], icpt[size_t(c)], 1e-3 * (1 + std::abs(icpt[size_t(c)])));
    // Chunking the input differently gives the same answer.
    RidgeAccumulator acc(d, k);
    for (int64_t s = 0; s < n; s += 17) acc.add(x.data() + s * d, y.data() + s * k, std::min<int64_t>(17, n - s));
    const RidgeResult got2 = acc.solve(alpha);
    for (size_t i = 0; i < coef.size(); ++i) EXPECT_NEAR(got2.weight[i], got.weight[i], 1e-5 * (1 + std::abs(coef[i])));
  }
}

TEST(Ridge, AlphaShrinksAndIsNotAppliedToIntercept) {
  // Constant-target data: the slope is zero for any alpha and the intercept equals the target mean.
  std::mt19937 rng(8);
  const int64_t n = 50;
  std::vector<float> x = randn(rng, size_t(n) * 2, 100.0f, 2.0f), y(size_t(n), 3.25f);
  const RidgeResult r = fit_ridge(x.data(), y.data(), n, 2, 1, 1e6);
  EXPECT_NEAR(r.bias[0], 3.25f, 1e-5);
  EXPECT_NEAR(r.weight[0], 0.0f, 1e-7);
  // Degenerate features with alpha = 0 are refused; empty input is refused.
  std::vector<float> xc(size_t(n) * 2, 1.0f);
  EXPECT_THROW(fit_ridge(xc.data(), y.data(), n, 2, 1, 0.0), Error);
  EXPECT_THROW(fit_ridge(xc.data(), y.data(), 0, 2, 1, 1.0), Error);
}

TEST(Ridge, DatasetPathsAgreeAndIgnoreThreadCount) {
  const Dataset ds = synthetic(3, 12, 2, 600, 1, DatasetDtype::F32, false);
  std::vector<float> x(size_t(ds.size()) * 12), y(size_t(ds.size()) * 2);
  ds.gather_range(1, 0, ds.size(), x.data(), y.data());
  const RidgeResult direct = fit_ridge(x.data(), y.data(), ds.size(), 12, 2, 1.0);
  const RidgeResult via = fit_ridge(ds, 1, 1.0);
  EXPECT_EQ(direct.weight, via.weight);
  ThreadPool one(1), two(2);
  int64_t last_done = 0;
  const Surrogate s1 = fit_linear_surrogate(ds, 1.0, &one, [&](int64_t done, int64_t total) {
    EXPECT_GT(done, last_done);
    EXPECT_EQ(total, 600);
    last_done = done;
  });
  EXPECT_EQ(last_done, 600);
  const Surrogate s2 = fit_linear_surrogate(ds, 1.0, &two);
  const Surrogate s0 = fit_linear_surrogate(ds, 1.0, nullptr);
  EXPECT_FALSE(s1.is_mlp());
  for (int l = 0; l < 3; ++l) {
    EXPECT_EQ(s1.layer(l).w1, s2.layer(l).w1);
    EXPECT_EQ(s1.layer(l).w1, s0.layer(l).w1);
    EXPECT_EQ(s1.layer(l).b1, s2.layer(l).b1);
  }
  for (size_t i = 0; i < via.weight.size(); ++i) EXPECT_NEAR(s1.layer(1).w1[i], via.weight[i], 1e-6);
  // Noise-free linear targets: near-perfect fit.
  const R2Table t = evaluate(s1, ds);
  EXPECT_GT(t.mean(), 0.999);
}

// ---------------------------------------------------------------- MLP

TEST(Mlp, GradientMatchesCentralDifferences) {
  const MlpShape s{40, 20, 3};
  const int64_t n = 9;
  std::mt19937 rng(6);
  const std::vector<float> pf = mlp_init_params(s, 77);
  std::vector<double> p(pf.begin(), pf.end());
  const std::vector<float> xf = randn(rng, size_t(n) * 40), yf = randn(rng, size_t(n) * 3);
  const std::vector<double> x(xf.begin(), xf.end()), y(yf.begin(), yf.end());
  MlpWorkspace<double> ws;
  const double scale = 0.37;
  std::vector<double> g(s.n_params(), 0.0);
  mlp_layer_sse<double>(s, p.data(), x.data(), y.data(), n, g.data(), scale, ws);
  double max_rel = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double h = 1e-5, keep = p[i];
    p[i] = keep + h;
    const double up = mlp_layer_sse<double>(s, p.data(), x.data(), y.data(), n, nullptr, 0.0, ws);
    p[i] = keep - h;
    const double down = mlp_layer_sse<double>(s, p.data(), x.data(), y.data(), n, nullptr, 0.0, ws);
    p[i] = keep;
    const double fd = scale * (up - down) / (2 * h);
    const double err = std::abs(fd - g[i]) / (1e-6 + std::abs(fd) + std::abs(g[i]));
    max_rel = std::max(max_rel, err);
    ASSERT_NEAR(g[i], fd, 1e-6 * (1 + std::abs(fd))) << "param " << i;
  }
  EXPECT_LT(max_rel, 1e-4);
  // The float path computes the same gradient.
  MlpWorkspace<float> wsf;
  std::vector<float> gf(s.n_params(), 0.0f);
  const double sse_f = mlp_layer_sse<float>(s, pf.data(), xf.data(), yf.data(), n, gf.data(), scale, wsf);
  const double sse_d = mlp_layer_sse<double>(s, p.data(), x.data(), y.data(), n, nullptr, 0.0, ws);
  EXPECT_NEAR(sse_f, sse_d, 1e-4 * sse_d);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(gf[i], g[i], 1e-4 * (1e-3 + std::abs(g[i]))) << i;
}

TEST(Mlp, InitMatchesPytorchLinearBounds) {
  const MlpShape s{64, 8, 3};
  const std::vector<float> p = mlp_init_params(s, 3);
  float max_w1 = 0, max_w2 = 0, max_b2 = 0;
  for (size_t i = s.w1(); i < s.b1(); ++i) max_w1 = std::max(max_w1, std::abs(p[i]));
  for (size_t i = s.w2(); i < s.b2(); ++i) max_w2 = std::max(max_w2, std::abs(p[i]));
  for (size_t i = s.b2(); i < s.n_params(); ++i) max_b2 = std::max(max_b2, std::abs(p[i]));
  EXPECT_LE(max_w1, 1.0f / 8.0f);           // 1/sqrt(64)
  EXPECT_GT(max_w1, 0.9f / 8.0f);           // 512 draws fill the range
  EXPECT_LE(max_w2, 1.0f / std::sqrt(8.0f));
  EXPECT_GT(max_w2, 0.5f / std::sqrt(8.0f));
  EXPECT_LE(max_b2, 1.0f / std::sqrt(8.0f));
  EXPECT_EQ(p, mlp_init_params(s, 3));
  EXPECT_NE(p, mlp_init_params(s, 4));
}

// Two epochs of one full batch each, compared with an independent double-precision AdamW /
// cosine / global-clip implementation started from the same initial parameters.
TEST(Mlp, OptimizerStepsMatchIndependentAdamW) {
  const int L = 2, D = 10, H = 2, Hd = 4;
  const int64_t n = 32;
  const Dataset ds = synthetic(L, D, H, n, 2, DatasetDtype::F32, true);
  MlpOptions o;
  o.hidden_dim = Hd;
  o.epochs = 2;
  o.batch_size = 64;  // one batch holds everything
  o.valid_fraction = 0.0;
  o.lr = 0.01;
  o.grad_clip = 0.05;  // small enough to clip
  o.seed = 99;
  const MlpShape s{D, Hd, H};
  std::vector<std::vector<double>> p(L), m(L), v(L);
  for (int l = 0; l < L; ++l) {
    const std::vector<float> init = mlp_initial_params(s, L, o.seed)[size_t(l)];
    p[size_t(l)].assign(init.begin(), init.end());
    m[size_t(l)].assign(init.size(), 0.0);
    v[size_t(l)].assign(init.size(), 0.0);
  }
  MlpWorkspace<double> ws;
  bool clipped = false;
  for (int epoch = 0; epoch < 2; ++epoch) {
    const double lr = o.lr * (1 + std::cos(M_PI * epoch / 2.0)) / 2;  // 0.01, then 0.005
    std::vector<std::vector<double>> g(L);
    double sq = 0;
    for (int l = 0; l < L; ++l) {
      std::vector<double> x(size_t(n) * D), y(size_t(n) * H);
      for (int64_t i = 0; i < n; ++i) {
        std::vector<float> row(static_cast<size_t>(D));
        ds.x_row(i, l, row.data());
        for (int d = 0; d < D; ++d) x[size_t(i) * D + d] = row[size_t(d)];
        for (int h = 0; h < H; ++h) y[size_t(i) * H + h] = ds.y(i, l, h);
      }
      g[size_t(l)].assign(s.n_params(), 0.0);
      mlp_layer_sse<double>(s, p[size_t(l)].data(), x.data(), y.data(), n, g[size_t(l)].data(), 1.0 / (n * L * H), ws);
      for (double gi : g[size_t(l)]) sq += gi * gi;
    }
    const double coef = std::min(1.0, o.grad_clip / (std::sqrt(sq) + 1e-6));
    clipped |= coef < 1.0;
    const int t = epoch + 1;
    for (int l = 0; l < L; ++l)
      for (size_t i = 0; i < s.n_params(); ++i) {
        const double gi = g[size_t(l)][i] * coef;
        double& pi = p[size_t(l)][i];
        pi -= lr * o.weight_decay * pi;
        m[size_t(l)][i] = 0.9 * m[size_t(l)][i] + 0.1 * gi;
        v[size_t(l)][i] = 0.999 * v[size_t(l)][i] + 0.001 * gi * gi;
        const double mh = m[size_t(l)][i] / (1 - std::pow(0.9, t)), vh = v[size_t(l)][i] / (1 - std::pow(0.999, t));
        pi -= lr * mh / (std::sqrt(vh) + 1e-8);
      }
  }
  EXPECT_TRUE(clipped);
  std::vector<double> lrs;
  const Surrogate got = train_mlp(ds, o, [&](const MlpEpochReport& r) { lrs.push_back(r.lr); });
  ASSERT_EQ(lrs.size(), 2u);
  EXPECT_DOUBLE_EQ(lrs[0], 0.01);
  EXPECT_NEAR(lrs[1], 0.005, 1e-15);
  for (int l = 0; l < L; ++l) {
    const SurrogateLayerWeights& w = got.layer(l);
    std::vector<float> flat;
    for (const auto* part : {&w.w1, &w.b1, &w.w2, &w.b2}) flat.insert(flat.end(), part->begin(), part->end());
    ASSERT_EQ(flat.size(), s.n_params());
    for (size_t i = 0; i < flat.size(); ++i) EXPECT_NEAR(flat[i], p[size_t(l)][i], 2e-5) << "layer " << l << " param " << i;
  }
}

TEST(Mlp, SmallFitLearnsAndIsDeterministic) {
  const int L = 2, D = 16, H = 2;
  const Dataset train = synthetic(L, D, H, 3000, 10, DatasetDtype::F16, true);
  const Dataset test = synthetic(L, D, H, 500, 11, DatasetDtype::F16, true);
  MlpOptions o;
  o.hidden_dim = 16;
  o.epochs = 12;
  o.batch_size = 64;
  o.seed = 5;
  std::vector<MlpEpochReport> reports;
  ThreadPool two(2);
  const Surrogate s = train_mlp(train, o, [&](const MlpEpochReport& r) { reports.push_back(r); }, &two);
  ASSERT_EQ(reports.size(), 12u);
  EXPECT_EQ(reports[0].n_valid, 150);  // ceil(5% of 3000)
  EXPECT_EQ(reports[0].n_train, 2850);
  EXPECT_TRUE(s.is_mlp());
  EXPECT_EQ(s.hidden_dim(), 16);
  EXPECT_LT(reports.back().train_loss, 0.3 * reports.front().train_loss);
  EXPECT_LT(reports.back().valid_loss, 0.3 * reports.front().valid_loss);
  // Better than a linear model on this nonlinear target, and well above chance.
  const R2Table mlp_r2 = evaluate(s, test, &two);
  const R2Table lin_r2 = evaluate(fit_linear_surrogate(train, 1.0, &two), test);
  EXPECT_GT(mlp_r2.mean(), 0.8);
  EXPECT_GT(mlp_r2.mean(), lin_r2.mean() + 0.1);
  // Same seed, different thread count: bitwise identical. Different seed: different.
  o.epochs = 2;
  ThreadPool one(1);
  const Surrogate a = train_mlp(train, o, {}, &one);
  const Surrogate b = train_mlp(train, o, {}, &two);
  o.seed = 6;
  const Surrogate c = train_mlp(train, o, {}, &two);
  for (int l = 0; l < L; ++l) {
    EXPECT_EQ(a.layer(l).w1, b.layer(l).w1);
    EXPECT_EQ(a.layer(l).b2, b.layer(l).b2);
  }
  EXPECT_NE(a.layer(0).w1, c.layer(0).w1);
}

TEST(Mlp, RejectsBadOptions) {
  const Dataset ds = synthetic(1, 8, 1, 10, 1, DatasetDtype::F32, false);
  MlpOptions o;
  o.epochs = 0;
  EXPECT_THROW(train_mlp(ds, o), Error);
  o = MlpOptions();
  o.valid_fraction = 1.0;
  EXPECT_THROW(train_mlp(ds, o), Error);
  EXPECT_THROW(train_mlp(Dataset({1, 8, 1, DatasetDtype::F32}), MlpOptions()), Error);
}

// ---------------------------------------------------------------- metrics

TEST(Metrics, SquaredPearson) {
  const float a[] = {1, 2, 3, 4}, b[] = {2, 1, 4, 3};
  // Worked by hand: deviations (-1.5,-.5,.5,1.5) and (-.5,-1.5,1.5,.5): r = 3 / 5.
  EXPECT_NEAR(squared_pearson(a, b, 4), 0.36, 1e-12);
  const float c[] = {5, 7, 9, 11};  // exact affine image of a
  EXPECT_NEAR(squared_pearson(a, c, 4), 1.0, 1e-12);
  const float d[] = {-3, -5, -7, -9};
  EXPECT_NEAR(squared_pearson(a, d, 4), 1.0, 1e-12);
  const float k[] = {2, 2, 2, 2};
  EXPECT_EQ(squared_pearson(a, k, 4), 0.0);
  // Strided access picks the right column.
  const float ab[] = {1, 2, 2, 1, 3, 4, 4, 3};
  EXPECT_NEAR(squared_pearson(ab, ab + 1, 4, 2, 2), 0.36, 1e-12);
  R2Table t;
  t.n_layers = 2;
  t.n_heads = 2;
  t.r2 = {0.1, 0.3, 0.5, 0.9};
  EXPECT_NEAR(t.mean(), 0.45, 1e-12);
  EXPECT_NEAR(t.layer_mean(1), 0.7, 1e-12);
  EXPECT_NEAR(t.at(1, 0), 0.5, 0.0);
}

TEST(Metrics, EvaluateChecksShapes) {
  const Dataset ds = synthetic(2, 8, 2, 20, 1, DatasetDtype::F32, false);
  const Surrogate s = fit_linear_surrogate(ds, 1.0);
  const Dataset other = synthetic(3, 8, 2, 20, 1, DatasetDtype::F32, false);
  EXPECT_THROW(evaluate(s, other), Error);
  std::vector<float> pred;
  const R2Table t = evaluate(s, ds, nullptr, &pred);
  ASSERT_EQ(pred.size(), size_t(20 * 2 * 2));
  std::vector<float> x(8), out(2);
  ds.x_row(13, 1, x.data());
  s.predict(1, x.data(), 1, out.data(), nullptr);
  EXPECT_EQ(pred[(13 * 2 + 1) * 2 + 1], out[1]);
  EXPECT_EQ(t.n_layers, 2);
}

// Exports a ridge problem and the engine's solution for tests/python/check_surrogate_roundtrip.py
// (which compares with numpy) when KVZAP_ROUNDTRIP_DIR is set.
TEST(Ridge, ExportForPythonCheck) {
  const char* env = std::getenv("KVZAP_ROUNDTRIP_DIR");
  std::mt19937 rng(31);
  const int64_t n = 400;
  const int d = 24, k = 3;
  std::vector<float> x = randn(rng, size_t(n) * d, 1.0f, 2.0f), y = randn(rng, size_t(n) * k);
  for (int64_t r = 0; r < n; ++r) y[size_t(r) * k] += 0.5f * x[size_t(r) * d] - x[size_t(r) * d + 5];
  const RidgeResult res = fit_ridge(x.data(), y.data(), n, d, k, 1.0);
  ASSERT_EQ(res.weight.size(), size_t(k) * d);
  // The planted relation of output 0 (0.5 x0 - x5) is recovered (the noise is unit variance).
  EXPECT_NEAR(res.weight[0], 0.5f, 0.1f);
  EXPECT_NEAR(res.weight[5], -1.0f, 0.1f);
  // The export for tests/python/check_surrogate_roundtrip.py (which fails when it is missing).
  if (!(env && *env)) return;
  const fs::path root = fs::path(env) / "ridge";
  fs::create_directories(root);
  auto dump = [&](const std::string& name, const std::vector<float>& v) {
    std::ofstream(root / name, std::ios::binary).write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 4));
  };
  dump("x.f32", x);
  dump("y.f32", y);
  dump("coef.f32", res.weight);
  dump("intercept.f32", res.bias);
  std::ofstream(root / "meta.json") << "{\"n\": " << n << ", \"d\": " << d << ", \"k\": " << k << ", \"alpha\": 1.0}\n";
}

// `kvzap train --max-pairs N` trains on the first N pairs rounded down to whole windows (a shorter
// collection's dataset), and says so in report.json; fewer pairs than the first window is an error.
TEST(TrainCli, MaxPairsTrainsOnWholeLeadingWindows) {
  const fs::path data = temp_path("maxpairs.kvzd"), out = temp_path("maxpairs_out");
  synthetic(2, 8, 2, 40, 3, DatasetDtype::F16, false).save(data.string());  // 4 windows of 10 pairs
  Dataset view = Dataset::open(data.string());
  view.limit(25);
  EXPECT_EQ(view.size(), 25);
  view.limit(100);
  EXPECT_EQ(view.size(), 25);  // limit never grows the view

  const std::string common = "train --data '" + data.string() + "' --test '" + data.string() + "' --out '" +
                             out.string() + "' --kind linear -t 1";
  const test::CommandResult ok = test::run_kvzap(common + " --max-pairs 25");
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  const nlohmann::json report = nlohmann::json::parse(test::slurp((out / "report.json").string()));
  EXPECT_EQ(report["options"]["n_train"], 20);
  EXPECT_EQ(report["options"]["max_pairs"], 25);
  const test::CommandResult bad = test::run_kvzap(common + " --max-pairs 5");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("first window"), std::string::npos) << bad.err;
  fs::remove(data);
  fs::remove_all(out);
}
