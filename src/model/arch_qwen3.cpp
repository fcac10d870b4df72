// Qwen3 (dense): half-split RoPE pairing and a per-head RMSNorm on Q and K before RoPE.
#include "model/arch.h"

namespace kvzap {
static RegisterArch reg_qwen3({"qwen3", RopeMode::HalfSplit, /*qkv_bias=*/false, /*qk_norm=*/true});
}
