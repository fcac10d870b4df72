// Hyper-parameters of a decoder-only transformer, read from the model file (never hard-coded per model).
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace kvzap {

// Which elements RoPE rotates together (ggml's rope modes: normal vs NeoX): llama-in-GGUF rotates adjacent pairs
// (x[2i], x[2i+1]); Qwen and HF-layout Llama rotate halves (x[i], x[i + n_rot/2]).
enum class RopeMode { Adjacent, HalfSplit };

// The gated FFN's activation on the gate: SwiGLU (silu) or GeGLU (gelu, tanh approximation). GeGLU comes
// in two roundings: GeluTanh in f32 (Hugging Face folders, to match transformers) and GeluTanhF16, ggml's
// f16 lookup table (GGUF files, to match llama.cpp on the same file).
enum class FfnActivation { Silu, GeluTanh, GeluTanhF16 };

// What may differ between the layers of one model (filled by the loader for every architecture; the
// architecture's file overrides what its metadata says per layer).
struct LayerConfig {
  // 0: global (full causal) attention. W > 0: sliding window, a query at position p attends to
  // positions > p - W only, and the layer's cache frees what leaves the window.
  int32_t sliding_window = 0;
  float rope_base = 10000.0f;
  float rope_freq_scale = 1.0f;
  bool is_sliding() const { return sliding_window > 0; }
};

struct ModelConfig {
  std::string arch;        // general.architecture
  std::string name;        // general.name (informational)
  int n_layer = 0;
  int n_embd = 0;          // D_h
  int n_head = 0;          // query heads
  int n_head_kv = 0;       // KV heads
  int head_dim = 0;        // D
  int n_rot = 0;           // rotated dims per head
  int n_ff = 0;
  int n_vocab = 0;
  int n_ctx_train = 0;
  float rms_eps = 1e-5f;
  float rope_base = 10000.0f;
  float rope_freq_scale = 1.0f;
  RopeMode rope_mode = RopeMode::Adjacent;
  // [n_rot/2] divisor of each RoPE frequency (Llama 3.1's rope_scaling of type llama3), every layer;
  // empty: none.
  std::vector<float> rope_freq_factors;
  bool has_qkv_bias = false;  // qwen2
  bool has_qk_norm = false;   // qwen3 (and gemma3)
  FfnActivation ffn_act = FfnActivation::Silu;
  float embd_scale = 1.0f;          // token embeddings are multiplied by this (gemma3: sqrt(n_embd))
  float attn_scale = 0.0f;          // query scale before Q.K; 0 = 1/sqrt(head_dim)
  float final_logit_softcap = 0.0f;  // > 0: logits = cap * tanh(logits / cap)
  // [n_layer]: per-layer attention window and RoPE (rope_base / rope_freq_scale above are the global
  // layers' values, which scorers that recompute RoPE use).
  std::vector<LayerConfig> layers;

  int n_group() const { return n_head / n_head_kv; }  // query heads per KV head
  float query_scale() const { return attn_scale > 0 ? attn_scale : 1.0f / std::sqrt((float)head_dim); }
  bool has_sliding_layers() const {
    for (const LayerConfig& l : layers)
      if (l.is_sliding()) return true;
    return false;
  }
  // Bytes one token's K and V take in a full f16 cache, over all layers and KV heads.
  int64_t kv_bytes_per_token() const { return (int64_t)n_layer * n_head_kv * head_dim * 2 * 2; }
};

}  // namespace kvzap
