// Surrogate accuracy (docs/ALGORITHMS.md §5.5): squared Pearson correlation ("R²" in the paper) between
// true and predicted log-scores, per (layer, KV head), then averaged over all L*H heads.
#pragma once
#include <cstdint>
#include <vector>

#include "press/surrogate.h"
#include "train/dataset.h"

namespace kvzap {

class ThreadPool;

// Squared Pearson correlation of a[i * stride_a] and b[i * stride_b], i < n, computed in double
// (two passes). Returns 0 when either side has zero variance or n < 2 (no linear skill).
double squared_pearson(const float* a, const float* b, int64_t n, int64_t stride_a = 1, int64_t stride_b = 1);

struct R2Table {
  int n_layers = 0;
  int n_heads = 0;
  std::vector<double> r2;  // [L][H]
  double at(int layer, int head) const { return r2[size_t(layer) * n_heads + head]; }
  double mean() const;                 // over all L*H heads (the paper's figure)
  double layer_mean(int layer) const;  // over the heads of one layer
};

// Table from flat arrays y_true / y_pred [n][L][H].
R2Table r2_table(const float* y_true, const float* y_pred, int64_t n, int n_layers, int n_heads);

// Runs the surrogate on every record of `test` (layers in parallel on `pool` when given) and scores it.
// If predictions != nullptr it receives the predictions [n][L][H] (the true values are test.y_record(i)).
R2Table evaluate(const Surrogate& model, const Dataset& test, ThreadPool* pool = nullptr,
                 std::vector<float>* predictions = nullptr);

}  // namespace kvzap
