#include "train/metrics.h"

#include <algorithm>
#include <string>

#include "kernels/thread_pool.h"
#include "kvzap/error.h"

namespace kvzap {

double squared_pearson(const float* a, const float* b, int64_t n, int64_t stride_a, int64_t stride_b) {
  if (n < 2) return 0.0;
  double ma = 0.0, mb = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    ma += a[i * stride_a];
    mb += b[i * stride_b];
  }
  ma /= double(n);
  mb /= double(n);
  double saa = 0.0, sbb = 0.0, sab = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double da = a[i * stride_a] - ma, db = b[i * stride_b] - mb;
    saa += da * da;
    sbb += db * db;
    sab += da * db;
  }
  if (!(saa > 0.0) || !(sbb > 0.0)) return 0.0;
  return (sab * sab) / (saa * sbb);
}

double R2Table::mean() const {
  if (r2.empty()) return 0.0;
  double s = 0.0;
  for (double v : r2) s += v;
  return s / double(r2.size());
}

double R2Table::layer_mean(int layer) const {
  double s = 0.0;
  for (int h = 0; h < n_heads; ++h) s += at(layer, h);
  return n_heads > 0 ? s / n_heads : 0.0;
}

R2Table r2_table(const float* y_true, const float* y_pred, int64_t n, int n_layers, int n_heads) {
  R2Table t;
  t.n_layers = n_layers;
  t.n_heads = n_heads;
  t.r2.resize(size_t(n_layers) * n_heads);
  const int64_t stride = int64_t(n_layers) * n_heads;
  for (int l = 0; l < n_layers; ++l)
    for (int h = 0; h < n_heads; ++h) {
      const int64_t off = int64_t(l) * n_heads + h;
      t.r2[size_t(off)] = squared_pearson(y_true + off, y_pred + off, n, stride, stride);
    }
  return t;
}

R2Table evaluate(const Surrogate& model, const Dataset& test, ThreadPool* pool, std::vector<float>* predictions) {
  const int L = test.n_layers(), D = test.d_model(), H = test.n_heads();
  if (model.n_layers() != L || model.input_dim() != D || model.output_dim() != H)
    throw Error("evaluate: surrogate shape (L=" + std::to_string(model.n_layers()) + ", D_h=" +
                std::to_string(model.input_dim()) + ", H=" + std::to_string(model.output_dim()) +
                ") does not match the dataset (L=" + std::to_string(L) + ", D_h=" + std::to_string(D) +
                ", H=" + std::to_string(H) + ")");
  const int64_t n = test.size();
  std::vector<float> local;
  std::vector<float>& pred = predictions ? *predictions : local;
  pred.assign(size_t(n) * L * H, 0.0f);
  std::vector<float> truth(size_t(n) * L * H);
  for (int64_t i = 0; i < n; ++i) std::copy_n(test.y_record(i), size_t(L) * H, truth.begin() + i * L * H);

  constexpr int64_t kChunk = 256;
  const int n_threads = pool ? pool->size() : 1;
  struct Scratch {
    std::vector<float> x, out, hidden;
  };
  std::vector<Scratch> scratch(static_cast<size_t>(n_threads));
  for (auto& s : scratch) {
    s.x.resize(size_t(kChunk) * D);
    s.out.resize(size_t(kChunk) * H);
    s.hidden.resize(size_t(std::max<int64_t>(1, model.scratch_floats(kChunk))));
  }
  auto work = [&](int64_t l, int tid) {
    Scratch& s = scratch[size_t(tid)];
    for (int64_t b0 = 0; b0 < n; b0 += kChunk) {
      const int64_t nb = std::min(kChunk, n - b0);
      test.gather_range(int(l), b0, nb, s.x.data(), nullptr);
      model.predict(int(l), s.x.data(), nb, s.out.data(), s.hidden.data());
      for (int64_t r = 0; r < nb; ++r)
        std::copy_n(s.out.data() + r * H, H, pred.begin() + ((b0 + r) * L + l) * H);
    }
  };
  if (pool)
    pool->parallel_for(L, work);
  else
    for (int l = 0; l < L; ++l) work(l, 0);
  return r2_table(truth.data(), pred.data(), n, L, H);
}

}  // namespace kvzap
