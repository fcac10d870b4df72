// "critical_expected_attention" (docs/ALGORITHMS.md §8.20, kvpress
// CriticalKVPress(ExpectedAttentionPress(use_vnorm=False))): ExpectedAttention's softmax scores (§8.8,
// without its own (score + epsilon) x ||v||, which kvpress asks to disable under CriticalKV) through the
// CriticalKV step of press/scorer_critical_snapkv.cpp: the best half of each head's budget kept, the rest
// by (score + 1e-4) x ||W_O^(q) v||_1 averaged over the group. The 4 sinks enter with the layer's largest
// score + 1, as kvpress pads them.
#include "model/model.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

RegisterScorer reg({"critical_expected_attention",
                    "CriticalKV(ExpectedAttention without ||v||): the best half of the budget by expected attention, "
                    "the rest by (score + 1e-4) x ||W_O v||_1 (mean over the group)",
                    false, [](const PressSpec& o, const Model& m) {
                      return make_critical_scorer(make_expected_attention_scorer(m.config(), 1e-2, /*use_vnorm=*/false),
                                                  m.config(), output_projections(m), o.ratio, press_param(o, "epsilon"),
                                                  press_param(o, "first_stage_ratio"));
                    },
                    {.params = critical_params(false),
                     .kvpress_parity = "exact (kvpress CriticalKVPress(ExpectedAttentionPress(use_vnorm=False)))"}});

}  // namespace
}  // namespace kvzap
