// "critical_adakv_snapkv" (docs/ALGORITHMS.md §8.22, kvpress CriticalAdaKVPress(SnapKVPress())): the
// CriticalAdaKV step of press/scorer_critical_adakv_expected_attention.cpp over SnapKV's scores (§8.4);
// the window entries enter with the layer's largest score + 1, as kvpress pads them.
#include "model/model.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

RegisterScorer reg({"critical_adakv_snapkv",
                    "CriticalAdaKV(SnapKV): AdaKV's per-layer budget, then in each head half its budget by SnapKV "
                    "and the rest by (SnapKV + 1e-4) x ||W_O v||_1",
                    false, [](const PressSpec& o, const Model& m) {
                      return make_critical_adakv_scorer(make_snapkv_scorer(m.config()), m, o);
                    },
                    {.kvpress_ratio_scope = "adakv",
                     .min_context_tokens = kSnapKvWindow,
                     .params = critical_params(true),
                     .kvpress_parity = "exact (kvpress CriticalAdaKVPress(SnapKVPress))"}});

}  // namespace
}  // namespace kvzap
