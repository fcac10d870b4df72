#include "train/mlp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>
#include <string>

#include "kernels/thread_pool.h"
#include "kvzap/error.h"
#include "common/rng.h"

namespace kvzap {
namespace {

uint64_t splitmix64(uint64_t x) { return mix64(x); }  // common/rng.h

// Uniform in [0, 1) from 53 random bits (portable, unlike std::uniform_real_distribution).
double uniform01(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1.0p-53; }

// Fisher-Yates with an explicit bounded draw (portable, unlike std::shuffle).
void shuffle(std::vector<int64_t>& v, std::mt19937_64& rng) {
  for (size_t i = v.size(); i > 1; --i) {
    const size_t j = size_t(rng() % i);
    std::swap(v[i - 1], v[j]);
  }
}

// Exact GELU pieces in the training precision: value and dGELU/dz.
inline float gelu_cdf(float z) { return 0.5f * (1.0f + std::erf(z * 0.70710678118654752f)); }
inline double gelu_cdf(double z) { return 0.5 * (1.0 + std::erf(z * 0.70710678118654752)); }
inline float gauss_pdf(float z) { return 0.39894228040143268f * std::exp(-0.5f * z * z); }
inline double gauss_pdf(double z) { return 0.39894228040143268 * std::exp(-0.5 * z * z); }

template <class T>
void grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

template <class T>
double mlp_layer_sse(const MlpShape& s, const T* params, const T* x, const T* y, int64_t n, T* grad,
                     double grad_scale, MlpWorkspace<T>& ws) {
  const int64_t D = s.d_in, Hd = s.hidden, H = s.d_out;
  const T* W1 = params + s.w1();
  const T* b1 = params + s.b1();
  const T* W2 = params + s.w2();
  const T* b2 = params + s.b2();
  grow(ws.w1t, size_t(D * Hd));
  grow(ws.z, size_t(n * Hd));
  grow(ws.a, size_t(n * Hd));
  grow(ws.dcdf, size_t(n * Hd));
  grow(ws.p, size_t(n * H));
  // Forward: z = x W1^T + b1, a = GELU(z), p = a W2^T + b2.
  for (int64_t o = 0; o < Hd; ++o)
    for (int64_t i = 0; i < D; ++i) ws.w1t[size_t(i * Hd + o)] = W1[o * D + i];
  for (int64_t t = 0; t < n; ++t) std::copy(b1, b1 + Hd, ws.z.data() + t * Hd);
  dense::gemm_nn(n, Hd, D, x, D, ws.w1t.data(), Hd, ws.z.data(), Hd, true);
  for (int64_t i = 0; i < n * Hd; ++i) {
    const T z = ws.z[size_t(i)];
    const T cdf = gelu_cdf(z);
    ws.a[size_t(i)] = z * cdf;
    if (grad) ws.dcdf[size_t(i)] = cdf + z * gauss_pdf(z);  // GELU'(z)
  }
  for (int64_t t = 0; t < n; ++t) std::copy(b2, b2 + H, ws.p.data() + t * H);
  dense::gemm_nt(n, H, Hd, ws.a.data(), Hd, W2, Hd, ws.p.data(), H, true);
  double sse = 0.0;
  for (int64_t i = 0; i < n * H; ++i) {
    const double e = double(ws.p[size_t(i)]) - double(y[i]);
    sse += e * e;
  }
  if (!grad) return sse;

  // Backward of grad_scale * sse.
  grow(ws.g, size_t(n * H));
  grow(ws.gt, size_t(H * n));
  grow(ws.da, size_t(n * Hd));
  grow(ws.dzt, size_t(Hd * n));
  T* gW1 = grad + s.w1();
  T* gb1 = grad + s.b1();
  T* gW2 = grad + s.w2();
  T* gb2 = grad + s.b2();
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const T g = T(2.0 * grad_scale) * (ws.p[size_t(t * H + h)] - y[t * H + h]);
      ws.g[size_t(t * H + h)] = g;
      ws.gt[size_t(h * n + t)] = g;
    }
  for (int64_t h = 0; h < H; ++h) {
    T acc = 0;
    for (int64_t t = 0; t < n; ++t) acc += ws.gt[size_t(h * n + t)];
    gb2[h] += acc;
  }
  dense::gemm_nn(H, Hd, n, ws.gt.data(), n, ws.a.data(), Hd, gW2, Hd, true);             // dW2 = g^T a
  dense::gemm_nn(n, Hd, H, ws.g.data(), H, W2, Hd, ws.da.data(), Hd, false);            // da = g W2
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < Hd; ++j)
      ws.dzt[size_t(j * n + t)] = ws.da[size_t(t * Hd + j)] * ws.dcdf[size_t(t * Hd + j)];  // dz^T
  for (int64_t j = 0; j < Hd; ++j) {
    T acc = 0;
    for (int64_t t = 0; t < n; ++t) acc += ws.dzt[size_t(j * n + t)];
    gb1[j] += acc;
  }
  dense::gemm_nn(Hd, D, n, ws.dzt.data(), n, x, D, gW1, D, true);                       // dW1 = dz^T x
  return sse;
}

template double mlp_layer_sse<float>(const MlpShape&, const float*, const float*, const float*, int64_t, float*,
                                     double, MlpWorkspace<float>&);
template double mlp_layer_sse<double>(const MlpShape&, const double*, const double*, const double*, int64_t,
                                      double*, double, MlpWorkspace<double>&);

std::vector<float> mlp_init_params(const MlpShape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> p(s.n_params());
  auto fill = [&](size_t off, size_t n, int fan_in) {
    const double bound = 1.0 / std::sqrt(double(fan_in));
    for (size_t i = 0; i < n; ++i) p[off + i] = float((2.0 * uniform01(rng) - 1.0) * bound);
  };
  fill(s.w1(), size_t(s.hidden) * s.d_in, s.d_in);
  fill(s.b1(), size_t(s.hidden), s.d_in);
  fill(s.w2(), size_t(s.d_out) * s.hidden, s.hidden);
  fill(s.b2(), size_t(s.d_out), s.hidden);
  return p;
}

std::vector<std::vector<float>> mlp_initial_params(const MlpShape& s, int n_layers, uint64_t seed) {
  std::vector<std::vector<float>> p(static_cast<size_t>(n_layers));
  for (int l = 0; l < n_layers; ++l) p[size_t(l)] = mlp_init_params(s, splitmix64(seed * 1000003ull + uint64_t(l)));
  return p;
}

Surrogate mlp_to_surrogate(const MlpShape& s, const std::vector<std::vector<float>>& params) {
  std::vector<SurrogateLayerWeights> layers(params.size());
  for (size_t l = 0; l < params.size(); ++l) {
    const std::vector<float>& p = params[l];
    if (p.size() != s.n_params()) throw Error("mlp: layer " + std::to_string(l) + " has the wrong parameter count");
    layers[l].w1.assign(p.begin() + long(s.w1()), p.begin() + long(s.b1()));
    layers[l].b1.assign(p.begin() + long(s.b1()), p.begin() + long(s.w2()));
    layers[l].w2.assign(p.begin() + long(s.w2()), p.begin() + long(s.b2()));
    layers[l].b2.assign(p.begin() + long(s.b2()), p.end());
  }
  return Surrogate(s.d_in, s.d_out, s.hidden, std::move(layers));
}

Surrogate train_mlp(const Dataset& data, const MlpOptions& o, const MlpProgress& progress, ThreadPool* pool) {
  const int L = data.n_layers(), D = data.d_model(), H = data.n_heads();
  const MlpShape shape{D, o.hidden_dim > 0 ? o.hidden_dim : std::max(1, D / 8), H};
  if (o.epochs <= 0 || o.batch_size <= 0 || !(o.lr > 0.0) || o.valid_fraction < 0.0 || o.valid_fraction >= 1.0)
    throw Error("mlp: invalid training options (epochs, batch_size and lr must be positive, "
                "valid_fraction in [0, 1))");
  const int64_t n = data.size();
  if (n == 0) throw Error("mlp: the training dataset is empty");

  // Monitoring split: a seeded permutation; the first ceil(fraction * n) pairs are held out.
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[size_t(i)] = i;
  std::mt19937_64 split_rng(splitmix64(o.seed ^ 0x5EED5B117ull));
  int64_t n_valid = 0;
  if (o.valid_fraction > 0.0) {
    shuffle(order, split_rng);
    n_valid = std::min<int64_t>(n - 1, int64_t(std::ceil(o.valid_fraction * double(n))));
  }
  std::vector<int64_t> valid(order.begin(), order.begin() + n_valid);
  std::vector<int64_t> train(order.begin() + n_valid, order.end());
  std::sort(valid.begin(), valid.end());  // sequential reads for evaluation
  std::sort(train.begin(), train.end());  // canonical order before the per-epoch shuffles
  const int64_t n_train = int64_t(train.size());

  const size_t P = shape.n_params();
  const size_t nL = static_cast<size_t>(L);
  std::vector<std::vector<float>> params = mlp_initial_params(shape, L, o.seed);
  std::vector<std::vector<float>> grads(nL, std::vector<float>(P));
  std::vector<std::vector<float>> m(nL, std::vector<float>(P, 0.0f));
  std::vector<std::vector<float>> v(nL, std::vector<float>(P, 0.0f));

  const int n_threads = pool ? pool->size() : 1;
  const int64_t B = o.batch_size;
  struct ThreadScratch {
    std::vector<float> x, y;
    MlpWorkspace<float> ws;
  };
  std::vector<ThreadScratch> scratch(static_cast<size_t>(n_threads));
  for (auto& s : scratch) {
    s.x.resize(size_t(B) * D);
    s.y.resize(size_t(B) * H);
  }
  std::vector<double> layer_sse(nL);
  std::vector<double> layer_sq(nL);
  auto for_layers = [&](const std::function<void(int64_t, int)>& fn) {
    if (pool)
      pool->parallel_for(L, fn);
    else
      for (int l = 0; l < L; ++l) fn(l, 0);
  };

  std::mt19937_64 shuffle_rng(splitmix64(o.seed ^ 0x5A0FF1Eull));
  int64_t step = 0;
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = o.lr * (1.0 + std::cos(std::numbers::pi * double(epoch) / double(o.epochs))) / 2.0;
    shuffle(train, shuffle_rng);
    double loss_sum = 0.0;
    for (int64_t b0 = 0; b0 < n_train; b0 += B) {
      const int64_t nb = std::min(B, n_train - b0);
      const int64_t* idx = train.data() + b0;
      const double scale = 1.0 / (double(nb) * L * H);  // loss = mean over rows x layers x heads
      for_layers([&](int64_t l, int tid) {
        ThreadScratch& s = scratch[size_t(tid)];
        data.gather(int(l), idx, nb, s.x.data(), s.y.data());
        std::vector<float>& g = grads[size_t(l)];
        std::fill(g.begin(), g.end(), 0.0f);
        layer_sse[size_t(l)] = mlp_layer_sse<float>(shape, params[size_t(l)].data(), s.x.data(), s.y.data(), nb,
                                                    g.data(), scale, s.ws);
        double sq = 0.0;
        for (float gi : g) sq += double(gi) * double(gi);
        layer_sq[size_t(l)] = sq;
      });
      double sse = 0.0, sq = 0.0;
      for (int l = 0; l < L; ++l) {
        sse += layer_sse[size_t(l)];
        sq += layer_sq[size_t(l)];
      }
      loss_sum += sse * scale * double(nb);
      // torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), clamped to 1.
      double clip = 1.0;
      if (o.grad_clip > 0.0) clip = std::min(1.0, o.grad_clip / (std::sqrt(sq) + 1e-6));
      ++step;
      const double bc1 = 1.0 - std::pow(o.beta1, double(step));
      const double bc2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, double(step)));
      const float decay = float(1.0 - lr * o.weight_decay);
      const float b1 = float(o.beta1), b2 = float(o.beta2);
      const float step_size = float(lr / bc1), inv_bc2_sqrt = float(1.0 / bc2_sqrt), eps = float(o.eps);
      const float fclip = float(clip);
      // torch.optim.AdamW: decoupled decay, then Adam with bias correction.
      for_layers([&](int64_t l, int) {
        float* p = params[size_t(l)].data();
        const float* g = grads[size_t(l)].data();
        float* ml = m[size_t(l)].data();
        float* vl = v[size_t(l)].data();
        for (size_t i = 0; i < P; ++i) {
          const float gi = g[i] * fclip;
          p[i] *= decay;
          ml[i] = b1 * ml[i] + (1.0f - b1) * gi;
          vl[i] = b2 * vl[i] + (1.0f - b2) * gi * gi;
          p[i] -= step_size * ml[i] / (std::sqrt(vl[i]) * inv_bc2_sqrt + eps);
        }
      });
    }
    double valid_loss = std::numeric_limits<double>::quiet_NaN();
    if (n_valid > 0) {
      for_layers([&](int64_t l, int tid) {
        ThreadScratch& s = scratch[size_t(tid)];
        double sse = 0.0;
        for (int64_t b0 = 0; b0 < n_valid; b0 += B) {
          const int64_t nb = std::min(B, n_valid - b0);
          data.gather(int(l), valid.data() + b0, nb, s.x.data(), s.y.data());
          sse += mlp_layer_sse<float>(shape, params[size_t(l)].data(), s.x.data(), s.y.data(), nb, nullptr, 0.0,
                                      s.ws);
        }
        layer_sse[size_t(l)] = sse;
      });
      double sse = 0.0;
      for (int l = 0; l < L; ++l) sse += layer_sse[size_t(l)];
      valid_loss = sse / (double(n_valid) * L * H);
    }
    if (progress) {
      MlpEpochReport r;
      r.epoch = epoch;
      r.epochs = o.epochs;
      r.lr = lr;
      r.train_loss = loss_sum / double(n_train);
      r.valid_loss = valid_loss;
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.n_train = n_train;
      r.n_valid = n_valid;
      progress(r);
    }
  }
  return mlp_to_surrogate(shape, params);
}

}  // namespace kvzap
