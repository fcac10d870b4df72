// KVzap surrogate (docs/ALGORITHMS.md §4.1, §4.2): one small model per transformer layer that maps the
// layer's attention input h (post input-RMSNorm, [D_h]) to predicted natural-log KVzip+ scores, one
// per KV head ([H]). Linear: y = W h + b. MLP: y = W2 GELU(W1 h + b1) + b2 with exact (erf) GELU and
// hidden width D_h/8 in the paper's checkpoints (any width is accepted here).
//
// On disk it is a kvpress/HF folder: config.json {"model_type":"kvzap", "input_dim", "output_dim",
// "hidden_dim" (null = linear), "n_modules"} + model.safetensors with PyTorch Linear layout
// (y = x W^T + b): linear `layers.{l}.weight` [H, D_h], `layers.{l}.bias` [H]; MLP
// `layers.{l}.0.weight` [hidden, D_h], `layers.{l}.0.bias` [hidden], `layers.{l}.2.weight`
// [H, hidden], `layers.{l}.2.bias` [H]. F32, BF16 or F16 weights are converted to f32 at load.
#pragma once
#include "kernels/thread_pool.h"
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvzap {

// Small row-major dense kernels shared by surrogate inference and training (src/train). Built for
// AVX-512, AVX2 and baseline x86-64 and chosen per call by active_isa() (kernels/isa_dispatch.h); the
// summation order is fixed, so results are deterministic for a given ISA.
namespace dense {
// C[M][N] = (accumulate ? C : 0) + A[M][K] · B[K][N]
void gemm_nn(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
             float* C, int64_t ldc, bool accumulate);
void gemm_nn(int64_t M, int64_t N, int64_t K, const double* A, int64_t lda, const double* B, int64_t ldb,
             double* C, int64_t ldc, bool accumulate);
// C[M][N] = (accumulate ? C : 0) + A[M][K] · Bt[N][K]^T  (dot-product form, for small N)
void gemm_nt(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* Bt, int64_t ldb,
             float* C, int64_t ldc, bool accumulate);
void gemm_nt(int64_t M, int64_t N, int64_t K, const double* A, int64_t lda, const double* Bt, int64_t ldb,
             double* C, int64_t ldc, bool accumulate);
// Exact GELU x * Phi(x) (PyTorch nn.GELU() default) and its derivative Phi(x) + x phi(x).
float gelu(float x);
double gelu(double x);
// x[i] = GELU(x[i]) with a vectorised erf (A&S 7.1.26, |error| <= ~3e-7): surrogate inference.
void gelu_inplace(float* x, int64_t n);
double gelu_grad(double x);
}  // namespace dense

// Weights of one layer's module, PyTorch Linear layout (row = output unit).
struct SurrogateLayerWeights {
  std::vector<float> w1;  // linear: [H][D_h]      MLP: [hidden][D_h]
  std::vector<float> b1;  // linear: [H]           MLP: [hidden]
  std::vector<float> w2;  // linear: empty         MLP: [H][hidden]
  std::vector<float> b2;  // linear: empty         MLP: [H]
};

class Surrogate {
 public:
  // hidden_dim == 0 means linear. Throws kvzap::Error when a vector has the wrong size.
  Surrogate(int input_dim, int output_dim, int hidden_dim, std::vector<SurrogateLayerWeights> layers);

  // Loads a kvpress-format folder; throws kvzap::Error("surrogate <dir>: <problem>").
  static std::unique_ptr<Surrogate> load(const std::string& dir);
  // Writes config.json + model.safetensors (F32) into dir (created if missing).
  void save(const std::string& dir) const;

  int n_layers() const { return int(layers_.size()); }
  int input_dim() const { return input_dim_; }    // D_h
  int output_dim() const { return output_dim_; }  // H
  int hidden_dim() const { return hidden_dim_; }  // 0 for linear
  bool is_mlp() const { return hidden_dim_ > 0; }
  int64_t n_params() const;
  const SurrogateLayerWeights& layer(int l) const { return layers_.at(size_t(l)); }

  // out[t][h] = prediction of layer `layer` for h[t]. h: [n_tok][input_dim], out: [n_tok][output_dim],
  // scratch: [n_tok][hidden_dim] floats (unused, may be null, for linear). No allocation.
  void predict(int layer, const float* h, int64_t n_tok, float* out, float* scratch) const;
  int64_t scratch_floats(int64_t n_tok) const { return n_tok * hidden_dim_; }
  // predict() over chunks of tokens on a pool (tokens are independent, so the result is bit-identical).
  // scratch: one buffer per pool thread, grown on first use.
  void predict_threaded(int layer, const float* h, int64_t n_tok, float* out, ThreadPool& pool,
                        std::vector<std::vector<float>>& scratch) const;

 private:
  int input_dim_ = 0, output_dim_ = 0, hidden_dim_ = 0;
  std::vector<SurrogateLayerWeights> layers_;
  std::vector<std::vector<float>> w1t_;  // MLP: per layer W1^T [D_h][hidden] for gemm_nn
};

// The default threshold recorded by `kvzap calibrate --write-default` in <surrogate_dir>/kvzap.json
// ({"default_threshold": T, ...}); nullopt when the file or the key is missing. Throws kvzap::Error
// when the file exists but is not valid JSON or the value is not a finite number.
std::optional<double> default_kvzap_threshold(const std::string& surrogate_dir);

}  // namespace kvzap
