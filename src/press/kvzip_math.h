// The arithmetic shared by the KVzip/KVzip+ scorers (press/scorer_kvzip.cpp) and the KVzap training
// targets (train/targets.cpp): the value-contribution norms ||W_O^(q) v|| of KVzip+ and the
// "max over query rows of softmax attention" reduction (docs/ALGORITHMS.md §2.1, §3, §5.1).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvzap {

class Model;
class ThreadPool;

// ||W_O^(q) v|| for any value vector v of the KV head serving query head q (docs/ALGORITHMS.md §3), via
// the Gram matrices M_q = W_O^(q)^T W_O^(q) ([D][D], double, from the dequantised W_O):
// ||W_O^(q) v||^2 = v^T M_q v. Built once per model (about 1 s for SmolLM2-135M).
class OutputNorms {
 public:
  explicit OutputNorms(const Model& model);
  int head_dim() const { return D_; }
  // out[i] = ||W_O^(q) v_i|| for the n vectors v_i = v + i * stride ([D] floats each).
  void norms(int layer, int q_head, const float* v, int64_t stride, int64_t n, float* out) const;
  const double* gram(int layer, int q_head) const { return &gram_[(size_t)layer][(size_t)q_head * D_ * D_]; }

 private:
  int D_ = 0, H_ = 0;
  std::vector<std::vector<double>> gram_;  // [layer][n_head][D][D]
};

// 1 / ||x||_2 of each of n rows of length d (the KVzip+ row factor 1/||h_j||), computed in double.
void inverse_row_norms(const float* x, int64_t n, int64_t d, float* out);

// exp(x) for x <= 0 (softmax numerators), vectorisable, relative error below 2e-7; 0 below -87.
void exp_nonpositive_inplace(float* x, int64_t n);

// One KV head's share of a KVzip reduction. G query heads share the keys; query row j of group head g
// attends keys [0, min(n_keys, visible0 + j)) with softmax(q·k / sqrt(D)) and the weights of the
// scored columns c = col0 .. col0 + n_cols - 1 are multiplied by row_scale[j] * col_scale[g][c]:
//   out[c] = max over g, j of softmax_j(q_{g,j})[col0 + c] * row_scale[j] * col_scale[g][c - col0]
// (0 for a column no row sees). Keys are given transposed so the logits are one small GEMM.
struct ColumnMaxProblem {
  const float* q = nullptr;       // row j, group head g at q + j * q_row_stride + g * q_head_stride ([D])
  int64_t q_row_stride = 0;
  int64_t q_head_stride = 0;
  int64_t n_rows = 0;
  int n_group = 1;
  int head_dim = 0;
  const float* keys_t = nullptr;  // [D][n_keys]
  int64_t n_keys = 0;
  int64_t visible0 = 0;           // row j sees keys [0, visible0 + j)
  int64_t col0 = 0, n_cols = 0;
  const float* row_scale = nullptr;  // [n_rows] or null (1)
  const float* col_scale = nullptr;  // [n_group][n_cols] or null (1)
  float logit_scale = 0;             // q.k multiplier: the model's query scale (0 = 1/sqrt(head_dim))
};

// Scratch reused across calls (grows to the largest problem, then allocation-free).
struct ColumnMaxWorkspace {
  std::vector<std::vector<float>> logits;  // per thread [row_block][n_keys]
  std::vector<std::vector<float>> qs;      // per thread [row_block][D]
  std::vector<std::vector<float>> colmax;  // per thread [n_cols]
};

// Runs the reduction on `pool` (tasks = group heads x blocks of rows); out: [n_cols]. The result does
// not depend on the thread count (max is exact, each row's sums run on one thread in a fixed order).
void attention_column_max(const ColumnMaxProblem& p, ThreadPool& pool, ColumnMaxWorkspace& ws, float* out);

// Transposes n rows of d floats (row i at src + i * stride) into dst [d][n].
void transpose_rows(const float* src, int64_t stride, int64_t n, int64_t d, float* dst);

}  // namespace kvzap

namespace kvzap {

// Writes a little-endian float32 .npy file (format 1.0) of the given shape, for offline checks of
// what a scorer used (kvzap score --dump-layer). Throws kvzap::Error when the file cannot be written.
void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);

}  // namespace kvzap
