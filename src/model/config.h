// Hyper-parameters of a decoder-only transformer, read from the model file (never hard-coded per model).
#pragma once
#include <cstdint>
#include <string>

namespace kvzap {

// Which elements RoPE rotates together (cpp-engines.md §2.5): llama-in-GGUF rotates adjacent pairs
// (x[2i], x[2i+1]); Qwen and HF-layout Llama rotate halves (x[i], x[i + n_rot/2]).
enum class RopeMode { Adjacent, HalfSplit };

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
  bool has_qkv_bias = false;  // qwen2
  bool has_qk_norm = false;   // qwen3

  int n_group() const { return n_head / n_head_kv; }  // query heads per KV head
  // Bytes one token's K and V take in a full f16 cache, over all layers and KV heads.
  int64_t kv_bytes_per_token() const { return (int64_t)n_layer * n_head_kv * head_dim * 2 * 2; }
};

}  // namespace kvzap
