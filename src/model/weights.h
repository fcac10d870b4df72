// Typed views into the mapped model file (zero-copy), one struct per transformer layer.
#pragma once
#include <vector>

#include "kernels/matmul.h"

namespace kvzap {

struct LayerWeights {
  const float* attn_norm = nullptr;  // [n_embd]
  WeightMatrix wq, wk, wv, wo;       // [n_head*D x n_embd], [n_head_kv*D x n_embd] x2, [n_embd x n_head*D]
  const float* bq = nullptr;         // optional biases (qwen2): [n_head*D], [n_head_kv*D] x2
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* q_norm = nullptr;     // optional per-head RMSNorm gains (qwen3): [D]
  const float* k_norm = nullptr;
  const float* attn_post_norm = nullptr;  // optional RMSNorm gains on the attention output (gemma3): [n_embd]
  const float* ffn_norm = nullptr;   // [n_embd]
  const float* ffn_post_norm = nullptr;   // optional RMSNorm gains on the FFN output (gemma3): [n_embd]
  WeightMatrix gate, up, down;       // [n_ff x n_embd] x2, [n_embd x n_ff]
};

struct ModelWeights {
  WeightMatrix token_embd;           // [n_vocab x n_embd]
  const float* output_norm = nullptr;
  WeightMatrix output;               // [n_vocab x n_embd]; aliases token_embd when tied
  std::vector<LayerWeights> layers;
  std::vector<std::vector<float>> owned;  // f32 copies of norm/bias vectors stored as f16/bf16
  std::vector<std::vector<uint8_t>> owned_bytes;  // matrices re-encoded at load (HF --quantize, unaligned)
};

}  // namespace kvzap
