// Architecture registry: one file per architecture (arch_*.cpp) fills the config flags that differ, for
// GGUF files and Hugging Face checkpoints alike, and names its tensors; everything else is the shared loader (model.cpp) and forward pass (forward.cpp).
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "format/gguf.h"
#include "model/config.h"

namespace kvzap {

// A Hugging Face model class of the family (config.json "architectures"[0]).
struct HfClass {
  std::string name;
  // An image-text model: the text model's fields are in config.json's "text_config" and its tensors under
  // language_model.model. or model.language_model.; the vision tower and the projector are not loaded.
  bool multimodal = false;
};

// One family, both file formats: what its GGUF metadata and its Hugging Face checkpoints say.
struct ArchSpec {
  std::string name;                 // general.architecture value (also ModelConfig::arch for HF folders)
  RopeMode rope_mode;               // pairing in the GGUF layout (HF checkpoints are always half-split)
  bool qkv_bias;                    // attn_{q,k,v}.bias required
  bool qk_norm;                     // attn_{q,k}_norm.weight required
  bool post_norms = false;          // post_attention_norm / post_ffw_norm required (gemma3)
  // Reads what only this architecture's metadata says (per-layer windows and RoPE, activation,
  // scales, soft-capping) into the config the shared loader filled; throws kvzap::Error. May be null.
  void (*configure)(const gguf::File& f, ModelConfig& c) = nullptr;

  // Hugging Face checkpoints of the family (model/model_hf.cpp).
  std::vector<HfClass> hf_classes;
  bool hf_tied_default = false;     // the config class's tie_word_embeddings (save_pretrained omits it when equal)
  double hf_rope_theta_default = 10000.0;
  int hf_head_dim_default = 0;      // 0: hidden_size / num_attention_heads
  // config.json in Gemma's terms: hidden_activation (GeGLU), query_pre_attn_scalar, logit soft-capping,
  // sliding-window layers with their own RoPE base, RMSNorm gains stored as w for (1 + w), and norms
  // before and after the feed-forward block.
  bool hf_gemma_config = false;
};

std::vector<ArchSpec>& arch_registry();
const ArchSpec* find_arch(const std::string& name);
// The family and class whose Hugging Face class name this is; {null, null} if none.
std::pair<const ArchSpec*, const HfClass*> find_hf_class(const std::string& hf_name);

struct RegisterArch {
  explicit RegisterArch(ArchSpec spec) { arch_registry().push_back(std::move(spec)); }
};

}  // namespace kvzap
