// KVzap-MLP training (docs/ALGORITHMS.md §5.4): one D_h -> hidden -> H MLP (exact GELU) per layer, all layers
// trained together as one network with loss = MSE averaged over samples x layers x heads, as skorch
// does for kvpress's KVzapModel: AdamW (decoupled weight decay on every parameter), cosine-annealed
// learning rate stepped per epoch, global gradient-norm clipping over all layers' parameters,
// shuffled mini-batches (last one partial), optional held-out monitoring split (skorch
// ValidSplit(0.05): those pairs are not trained on). Weights are initialised like PyTorch Linear.
// Layers run in parallel on a ThreadPool; the result depends only on the seed, never on the thread
// count (each layer's arithmetic runs on one thread, cross-layer sums run in layer order).
// Arithmetic is fp32 (the reference moves the module to the data dtype, bf16, before training;
// docs/ALGORITHMS.md §5.4 expects small R² differences from that).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "press/surrogate.h"
#include "train/dataset.h"

namespace kvzap {

class ThreadPool;

struct MlpOptions {
  int hidden_dim = 0;             // 0 -> D_h / 8 (paper)
  int epochs = 15;
  int batch_size = 512;
  double lr = 5e-3;               // epoch e uses lr * (1 + cos(pi * e / epochs)) / 2
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  double grad_clip = 1.0;         // max global L2 norm; <= 0 disables clipping
  double valid_fraction = 0.05;   // held out for monitoring; 0 trains on everything
  uint64_t seed = 0;
};

struct MlpEpochReport {
  int epoch = 0;            // 0-based
  int epochs = 0;
  double lr = 0.0;          // learning rate used during this epoch
  double train_loss = 0.0;  // mean of the batch losses, weighted by batch size
  double valid_loss = 0.0;  // NaN without a validation split
  double seconds = 0.0;     // wall time of this epoch
  int64_t n_train = 0;
  int64_t n_valid = 0;
};
using MlpProgress = std::function<void(const MlpEpochReport&)>;

// Trains on `train` (every layer) and returns the MLP surrogate. pool == nullptr runs on the calling
// thread. Throws kvzap::Error on bad options or an empty dataset.
Surrogate train_mlp(const Dataset& train, const MlpOptions& options, const MlpProgress& progress = {},
                    ThreadPool* pool = nullptr);

// ---- Building blocks (exposed for tests and for callers that want their own loop) ----

// Flat parameter vector of one layer's MLP: [W1 hidden x d_in][b1 hidden][W2 d_out x hidden][b2 d_out].
struct MlpShape {
  int d_in = 0, hidden = 0, d_out = 0;
  size_t w1() const { return 0; }
  size_t b1() const { return size_t(hidden) * d_in; }
  size_t w2() const { return b1() + size_t(hidden); }
  size_t b2() const { return w2() + size_t(d_out) * hidden; }
  size_t n_params() const { return b2() + size_t(d_out); }
};

// Scratch for mlp_layer_sse with up to `rows` rows (grows on demand; reuse it across calls).
template <class T>
struct MlpWorkspace {
  std::vector<T> w1t, z, a, dcdf, p, g, gt, da, dzt;
};

// Sum over rows and outputs of (pred - y)^2 for one layer's MLP on x [n][d_in], y [n][d_out].
// When grad != nullptr, adds grad_scale * d(sum)/d(params) into grad (same layout as params).
template <class T>
double mlp_layer_sse(const MlpShape& shape, const T* params, const T* x, const T* y, int64_t n, T* grad,
                     double grad_scale, MlpWorkspace<T>& ws);

// PyTorch nn.Linear default init (kaiming_uniform(a=sqrt(5)) == U(+-1/sqrt(fan_in)) for W, same bound
// for b), drawn from a 64-bit Mersenne twister seeded with `seed`, in the order W1, b1, W2, b2.
std::vector<float> mlp_init_params(const MlpShape& shape, uint64_t seed);

// Initial parameters of every layer exactly as train_mlp draws them (layer l from a seed derived
// from (seed, l)).
std::vector<std::vector<float>> mlp_initial_params(const MlpShape& shape, int n_layers, uint64_t seed);

// Converts per-layer flat parameter vectors into a Surrogate.
Surrogate mlp_to_surrogate(const MlpShape& shape, const std::vector<std::vector<float>>& params);

}  // namespace kvzap
