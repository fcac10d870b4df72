// Shared transformer blocks (scalar, auto-vectorised; the heavy lifting is in kernels/matmul).
#pragma once
#include <cstdint>

#include "model/config.h"

namespace kvzap {

// out[i] = x[i] / rms(x) * gain[i]; the sum is accumulated in double as ggml does.
void rmsnorm(const float* x, const float* gain, float* out, int64_t n, float eps);
// Rotates one head vector in place at position pos (cos/sin from a precomputed table row).
void rope_apply(float* x, const float* cos_row, const float* sin_row, int head_dim, RopeMode mode);
// Fills cos/sin tables [n_pos][head_dim/2] the way ggml computes theta (float, iterative powers);
// freq_factors [head_dim/2] (optional) divide each frequency, as ggml's rope_freqs.
void rope_table(int64_t n_pos, int head_dim, float base, float freq_scale, float* cos_out, float* sin_out,
                const float* freq_factors = nullptr);
// x[i] = silu(gate[i]) * up[i]
void swiglu(float* gate, const float* up, int64_t n);
// gelu with the tanh approximation (exact formula, f32).
float gelu_tanh(float x);
// gate[i] = gelu_tanh(gate[i]) * up[i] in f32.
void geglu(float* gate, const float* up, int64_t n);
// The same with gelu taken as ggml's CPU path does: the input rounded to f16, the result looked up in an
// f16 table (|x| >= 10: 0 or x).
void geglu_f16_table(float* gate, const float* up, int64_t n);
// x[i] = cap * tanh(x[i] / cap) (final logit soft-capping).
void softcap(float* x, int64_t n, float cap);
// log-softmax value of index `id`, and argmax, over a row of logits.
double log_softmax_at(const float* logits, int64_t n, int64_t id, int64_t* argmax);

}  // namespace kvzap
