// "qfilter" (docs/ALGORITHMS.md §8.34, kvpress QFilterPress, Q-Filters arXiv 2503.02812): score =
// -(filter . k) for each key as cached (after RoPE), one filter per (layer, KV head). kvpress downloads the
// filters its authors computed; kvzap computes them from the model's own queries on calibration text
// (`kvzap query-stats`, press/query_stats.h, which states the sign convention: -(filter . k) is the key's
// projection on the queries' principal direction, larger for keys the queries attend to more). Per-step,
// so it works in prefill and decoding and under either policy. The statistics file: --surrogate PATH, else
// default_query_stats_path (beside the model).
#include "kvzap/error.h"
#include "model/model.h"
#include "press/press.h"
#include "press/query_stats.h"

namespace kvzap {
namespace {

class QFilterScorer : public Scorer {
 public:
  explicit QFilterScorer(std::shared_ptr<const QueryStats> s) : stats_(std::move(s)) {}
  bool per_step() const override { return true; }
  void score_step(const LayerStep& step, const KvCache& cache, float* out) override {
    const int H = cache.n_head_kv(), D = cache.head_dim();
    for (int h = 0; h < H; h++) {
      const float* f = stats_->filter_of(step.layer, h);  // [D]
      for (int64_t t = 0; t < step.n_tok; t++) {
        const float* k = step.k + ((size_t)t * H + h) * D;  // step.k: [n_tok][H][D] after RoPE
        double dot = 0;
        for (int d = 0; d < D; d++) dot += (double)f[d] * k[d];
        out[(size_t)h * step.n_tok + t] = -(float)dot;  // out: [H][n_tok]
      }
    }
  }

 private:
  std::shared_ptr<const QueryStats> stats_;  // shared by every press of the same file
};

RegisterScorer reg({"qfilter",
                    "Q-Filters: -(filter . k) per key, the filters the principal direction of each KV head's "
                    "queries, computed by `kvzap query-stats` on calibration text",
                    true,
                    [](const PressSpec& o, const Model& m) {
                      return std::make_unique<QFilterScorer>(load_query_stats(o, m, o.name));
                    },
                    {.needs_query_stats = true,
                     .kvpress_parity = "exact with kvzap's filters injected (kvpress QFilterPress, q_filters set "
                                       "instead of the hub's; docs/PARITY.md)"}});

}  // namespace
}  // namespace kvzap
