// "non_causal_attn" (docs/ALGORITHMS.md §8.15, kvpress NonCausalAttnPress): the attention half of Compactor
// (press/scorer_compactor.cpp) over the whole context. The context is cut into tiles of 256 (chunk_size) from position
// 0; every query of a tile attends to every key of it (RoPE applied, unscaled logits); each key's column
// sum, averaged over the query heads of its group, times ||v||, average-pooled over 3 (zero padding),
// z-scored over the layer. No entry is protected. The last, partial tile is padded as kvpress 0.5.5 pads it
// (its padding keys have logit 0 for the real rows, and each padding row adds 1/256 to every real key).
#include "model/model.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

RegisterScorer reg({"non_causal_attn",
                    "non-causal attention within 256-token tiles (column sums) x ||v||, pooled over 3, z-scored",
                    false, [](const PressSpec& o, const Model& m) {
                      return make_non_causal_scorer(m.config(), {.sink_start = 0, .sink_end = 0, .leverage = false,
                                                                 .pad_last_tile = true,
                                                                 .tile = (int64_t)press_param(o, "chunk_size")});
                    },
                    {.params = {{"chunk_size", 256, 1, 1 << 16, true, "the tiles' length"}},
                     .kvpress_parity = "exact (kvpress NonCausalAttnPress, 0.5.5's last-tile padding)"}});

}  // namespace
}  // namespace kvzap
