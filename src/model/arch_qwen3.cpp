// Qwen3 (dense): half-split RoPE pairing and a per-head RMSNorm on Q and K before RoPE.
#include "model/arch.h"

namespace kvzap {
static RegisterArch reg_qwen3({.name = "qwen3", .rope_mode = RopeMode::HalfSplit, .qkv_bias = false, .qk_norm = true,
                                .hf_classes = {{"Qwen3ForCausalLM"}}});
}
