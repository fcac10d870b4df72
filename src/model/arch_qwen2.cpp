// Qwen2 / Qwen2.5: half-split RoPE pairing and Q/K/V projection biases.
#include "model/arch.h"

namespace kvzap {
static RegisterArch reg_qwen2({.name = "qwen2", .rope_mode = RopeMode::HalfSplit, .qkv_bias = true, .qk_norm = false,
                                .hf_classes = {{"Qwen2ForCausalLM"}}});
}
