// Llama family in GGUF (Llama 2/3.x, SmolLM/SmolLM2, TinyLlama): the converter un-permutes Q/K so
// RoPE rotates adjacent pairs; no biases, no q/k norms.
#include "model/arch.h"

namespace kvzap {
static RegisterArch reg_llama({.name = "llama", .rope_mode = RopeMode::Adjacent, .qkv_bias = false, .qk_norm = false,
                                .hf_classes = {{"LlamaForCausalLM"}}});
}
