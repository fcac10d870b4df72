// Architecture registry: one file per architecture (arch_*.cpp) fills the config flags that differ and
// names its tensors; everything else is the shared loader (model.cpp) and forward pass (forward.cpp).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/config.h"

namespace kvzap {

struct ArchSpec {
  std::string name;                 // general.architecture value
  RopeMode rope_mode;               // pairing in the GGUF layout
  bool qkv_bias;                    // attn_{q,k,v}.bias required
  bool qk_norm;                     // attn_{q,k}_norm.weight required
  bool post_norms = false;          // post_attention_norm / post_ffw_norm required (gemma3)
  // Reads what only this architecture's metadata says (per-layer windows and RoPE, activation,
  // scales, soft-capping) into the config the shared loader filled; throws kvzap::Error. May be null.
  void (*configure)(const gguf::File& f, ModelConfig& c) = nullptr;
};

std::vector<ArchSpec>& arch_registry();
const ArchSpec* find_arch(const std::string& name);

struct RegisterArch {
  explicit RegisterArch(ArchSpec spec) { arch_registry().push_back(std::move(spec)); }
};

}  // namespace kvzap
