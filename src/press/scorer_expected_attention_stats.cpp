// "expected_attention_stats" (docs/ALGORITHMS.md §8.34, kvpress ExpectedAttentionStatsPress): ExpectedAttention
// (press/scorer_expected_attention.cpp, the same arithmetic) with the queries' pre-RoPE mean and covariance
// per (layer, query head) taken from statistics computed beforehand on calibration text (`kvzap
// query-stats`, press/query_stats.h) instead of from the context's own queries. Rotated by the RoPE
// averaged over the n_future_positions after the context, as expected_attention does. The statistics file:
// --surrogate PATH, else default_query_stats_path (beside the model). epsilon defaults to kvpress's 0.
#include "model/model.h"
#include "press/baselines.h"
#include "press/query_stats.h"

namespace kvzap {
namespace {

std::vector<PressParam> expected_attention_stats_params() {
  std::vector<PressParam> p = expected_attention_params();
  for (PressParam& x : p)
    if (x.name == "epsilon") {
      x.default_value = 0;
      x.help = "added to the score before the ||v|| rescaling (kvpress ExpectedAttentionStatsPress's default 0)";
    }
  return p;
}

RegisterScorer reg({"expected_attention_stats",
                    "ExpectedAttention with the queries' mean and covariance from calibration statistics "
                    "(`kvzap query-stats`) instead of the context's",
                    false,
                    [](const PressSpec& o, const Model& m) {
                      ExpectedAttentionOptions eo = expected_attention_options(o);
                      eo.stats = load_query_stats(o, m, o.name);
                      return make_expected_attention_scorer(m.config(), eo);
                    },
                    {.params = expected_attention_stats_params(),
                     .needs_query_stats = true,
                     .kvpress_parity = "exact with kvzap's statistics injected (kvpress ExpectedAttentionStatsPress, "
                                       "mu and cov set instead of the hub's; docs/PARITY.md)"}});

}  // namespace
}  // namespace kvzap
