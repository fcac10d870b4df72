// Gemma 3 (text): interleaved local (sliding-window) and global attention layers with their own RoPE
// bases, per-head q/k RMSNorm, RMSNorm before and after both attention and FFN, GeGLU (gelu, tanh
// approximation), token embeddings scaled by sqrt(n_embd), half-split RoPE pairing, tied LM head.
// The GGUF converter already stores Gemma's norm gains as (1 + w), so the shared RMSNorm applies as is.
//
// Metadata (keys under "gemma3."):
//   attention.sliding_window          W; absent or 0: every layer is global
//   attention.sliding_window_pattern  n (layer l is local iff n == 0 or l % n < n - 1; default 6, i.e.
//                                     5 local : 1 global), or one bool per layer
//   rope.freq_base                    the global layers' base (the shared loader reads it, with linear
//                                     rope.scaling); rope.freq_base_swa: the local layers' (default 10000)
//   attention.query_pre_attn_scalar   queries scaled by 1/sqrt(it); absent: 1/sqrt(head_dim)
//   final_logit_softcapping           logits = c * tanh(logits / c) when given
//   attn_logit_softcapping            Gemma 2 only (the Gemma 3 converter never writes it): refused
#include <cmath>
#include <string>
#include <variant>
#include <vector>

#include "kvzap/error.h"
#include "model/arch.h"

namespace kvzap {
namespace {

// The per-layer local/global flags: an integer period, or an explicit bool (or integer) per layer.
std::vector<bool> sliding_pattern(const gguf::File& f, const std::string& key, int n_layer) {
  std::vector<bool> out((size_t)n_layer, false);
  const gguf::Value* v = f.find(key);
  if (v && v->type == gguf::kArray) {
    const gguf::Array& arr = *std::get<std::shared_ptr<gguf::Array>>(v->v);
    if ((int)arr.size() != n_layer)
      throw Error(f.path() + ": '" + key + "' has " + std::to_string(arr.size()) + " entries for " +
                  std::to_string(n_layer) + " layers");
    for (int l = 0; l < n_layer; l++) {
      const gguf::Value& e = arr[(size_t)l];
      if (e.type == gguf::kBool) out[(size_t)l] = std::get<bool>(e.v);
      else if (std::holds_alternative<int64_t>(e.v)) out[(size_t)l] = std::get<int64_t>(e.v) != 0;
      else throw Error(f.path() + ": '" + key + "' must hold bools or integers");
    }
    return out;
  }
  const int64_t n = v ? f.get_int(key) : 6;
  if (n < 0 || n > 1024) throw Error(f.path() + ": '" + key + "' = " + std::to_string(n) + " is out of range");
  for (int l = 0; l < n_layer; l++) out[(size_t)l] = n == 0 || l % n < n - 1;
  return out;
}

void configure_gemma3(const gguf::File& f, ModelConfig& c) {
  const std::string a = "gemma3.";
  c.ffn_act = FfnActivation::GeluTanhF16;  // ggml's GELU table, as llama.cpp computes this file
  c.embd_scale = std::sqrt((float)c.n_embd);
  if (auto s = f.get_float_opt(a + "attention.query_pre_attn_scalar")) {
    if (!(*s > 0)) throw Error(f.path() + ": '" + a + "attention.query_pre_attn_scalar' must be positive");
    c.attn_scale = 1.0f / std::sqrt((float)*s);
  }
  if (auto cap = f.get_float_opt(a + "final_logit_softcapping")) {
    if (*cap < 0) throw Error(f.path() + ": '" + a + "final_logit_softcapping' must not be negative");
    c.final_logit_softcap = (float)*cap;
  }
  if (auto cap = f.get_float_opt(a + "attn_logit_softcapping"); cap && *cap > 0)
    throw Error(f.path() + ": attention logit soft-capping ('" + a + "attn_logit_softcapping') is not supported");

  const int64_t window = f.get_int_opt(a + "attention.sliding_window").value_or(0);
  if (window < 0 || window > (1 << 24))
    throw Error(f.path() + ": '" + a + "attention.sliding_window' = " + std::to_string(window) + " is out of range");
  const float base_swa = (float)f.get_float_opt(a + "rope.freq_base_swa").value_or(10000.0);
  if (!(base_swa > 0)) throw Error(f.path() + ": '" + a + "rope.freq_base_swa' must be positive");
  if (window == 0) return;  // every layer global: the loader's defaults stand
  const std::vector<bool> local = sliding_pattern(f, a + "attention.sliding_window_pattern", c.n_layer);
  for (int l = 0; l < c.n_layer; l++) {
    if (!local[(size_t)l]) continue;
    LayerConfig& L = c.layers[(size_t)l];
    L.sliding_window = (int32_t)window;
    L.rope_base = base_swa;
    L.rope_freq_scale = 1.0f;  // rope scaling applies to the global layers only
  }
}

RegisterArch reg_gemma3({.name = "gemma3", .rope_mode = RopeMode::HalfSplit, .qkv_bias = false, .qk_norm = true,
                         .post_norms = true, .configure = configure_gemma3,
                         .hf_classes = {{"Gemma3ForCausalLM"}, {"Gemma3ForConditionalGeneration", /*multimodal=*/true}},
                         .hf_tied_default = true, .hf_rope_theta_default = 1000000.0, .hf_head_dim_default = 256,
                         .hf_gemma_config = true});

}  // namespace
}  // namespace kvzap
