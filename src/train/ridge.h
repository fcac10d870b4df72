// KVzap-Linear training (docs/ALGORITHMS.md §5.3): per layer, multi-output ridge regression with intercept
// and alpha = 1, i.e. scikit-learn Ridge() semantics: centre X and y, solve
// (Xc^T Xc + alpha I) W = Xc^T yc, intercept = mean(y) - mean(x) W; alpha does not touch the
// intercept. Statistics are accumulated in double in one streaming pass (chunk-centred scatter
// matrices merged pairwise, Chan et al.), then solved by Cholesky in double.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "press/surrogate.h"
#include "train/dataset.h"

namespace kvzap {

class ThreadPool;

struct RidgeResult {
  int d_in = 0;
  int n_out = 0;
  std::vector<float> weight;  // [n_out][d_in] (sklearn coef_)
  std::vector<float> bias;    // [n_out]       (sklearn intercept_)
};

// Centred sufficient statistics of (x, y) pairs; add() in any chunking gives the same solution up to
// rounding.
class RidgeAccumulator {
 public:
  RidgeAccumulator(int d_in, int n_out);
  void add(const float* x /*[n][d_in]*/, const float* y /*[n][n_out]*/, int64_t n);
  int64_t count() const { return n_; }
  // Throws kvzap::Error when empty, when the system is not positive definite (alpha <= 0 on
  // degenerate data) or when the result is not finite.
  RidgeResult solve(double alpha) const;

 private:
  int d_, k_, dp_;             // dp_: d rounded up to 8 (row stride of the scatter matrix)
  int64_t n_ = 0;
  std::vector<double> mean_x_;  // [d]
  std::vector<double> mean_y_;  // [k]
  std::vector<double> sxx_;     // [d][dp] upper triangle valid
  std::vector<double> sxy_;     // [d][k]
  std::vector<double> xc_, xct_, yc_;  // chunk buffers
};

// Plain arrays.
RidgeResult fit_ridge(const float* x /*[n][d_in]*/, const float* y /*[n][n_out]*/, int64_t n, int d_in,
                      int n_out, double alpha = 1.0);
// One layer of a dataset: x = h at that layer, y = its H log-scores.
RidgeResult fit_ridge(const Dataset& data, int layer, double alpha = 1.0);

// Every layer in one sequential pass over the records (layers in parallel on `pool` when given;
// the result does not depend on the thread count). progress(records_done, records_total).
using RidgeProgress = std::function<void(int64_t, int64_t)>;
Surrogate fit_linear_surrogate(const Dataset& data, double alpha = 1.0, ThreadPool* pool = nullptr,
                               const RidgeProgress& progress = {});

}  // namespace kvzap
