// "critical_snapkv" (docs/ALGORITHMS.md §8.18, kvpress CriticalKVPress(SnapKVPress())): SnapKV scores s,
// re-weighted by how much each value moves the residual stream. Per (layer, KV head) of T entries: the
// int((1 - ratio) T / 2) (at least 1) best entries are kept outright (first stage); every entry's score
// becomes (s + 1e-4) x the L1 norm of W_O^(q) v averaged over the G query heads q of its group. Entries the
// inner press keeps (+inf: SnapKV's window) enter with the layer's largest finite score + 1, as kvpress pads
// them. The CriticalKV step itself (make_critical_scorer) wraps any context scorer; other presses register
// their own CriticalKV variant (press/scorer_critical_expected_attention.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/matmul.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

class CriticalScorer : public WrappedContextScorer {
 public:
  CriticalScorer(std::unique_ptr<Scorer> inner, const ModelConfig& c, std::vector<std::vector<float>> wo, double ratio,
                 double epsilon, double first_stage_ratio)
      : WrappedContextScorer(std::move(inner), "CriticalKV"), cfg_(c), ratio_(ratio), epsilon_(epsilon),
        first_stage_(first_stage_ratio), wo_(std::move(wo)) {
    if (dynamic_cast<BudgetSplit*>(inner_.get())) throw Error("internal: CriticalKV wraps a press with a per-head budget");
  }

  void score_cache(const KvCache& cache, CacheScores& out) override {
    cache_inner_->score_cache(cache, out);
    const int L = cfg_.n_layer, Hkv = cfg_.n_head_kv;
    for (int l = 0; l < L; l++) {
      if (!judged_layer(cache, l)) continue;
      float top = -std::numeric_limits<float>::infinity();
      for (int h = 0; h < Hkv; h++)
        for (float v : out[(size_t)l][(size_t)h])
          if (std::isfinite(v)) top = std::max(top, v);
      parallel_for(Hkv, [&](int64_t hk, int) {
        std::vector<float>& s = out[(size_t)l][(size_t)hk];
        const int64_t T = (int64_t)s.size();
        for (float& v : s)
          if (v == std::numeric_limits<float>::infinity()) v = top + 1;
        std::vector<double> pn;  // [T]
        projected_value_norms(cache, l, (int)hk, cfg_, wo_[(size_t)l], pn);
        // kvpress: at least one entry while first_stage_ratio > 0, none at 0.
        int64_t first = (int64_t)((1.0 - ratio_) * (double)T * first_stage_);
        if (first_stage_ > 0) first = std::max<int64_t>(1, first);
        std::vector<int64_t> order((size_t)T);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[(size_t)a] > s[(size_t)b]; });
        for (int64_t i = 0; i < T; i++) s[(size_t)i] = (float)(((double)s[(size_t)i] + epsilon_) * pn[(size_t)i]);
        for (int64_t r = 0; r < std::min(first, T); r++) s[(size_t)order[(size_t)r]] = std::numeric_limits<float>::infinity();
      });
    }
  }

 private:
  ModelConfig cfg_;
  double ratio_;
  double epsilon_, first_stage_;  // kvpress epsilon, first_stage_ratio
  std::vector<std::vector<float>> wo_;  // [layer][E][n_head * D]
};

}  // namespace

void projected_value_norms(const KvCache& cache, int l, int hk, const ModelConfig& c, const std::vector<float>& wo,
                           std::vector<double>& out) {
  const int G = c.n_group(), D = c.head_dim, E = c.n_embd, HD = c.n_head * c.head_dim;
  std::vector<float> values;  // [T][D]
  stream_values(cache, l, hk, values);
  const int64_t T = cache.length(l, hk);
  out.assign((size_t)T, 0.0);
  for (int g = 0; g < G; g++) {
    const int q = hk * G + g;
    for (int64_t i = 0; i < T; i++) {
      const float* v = values.data() + (size_t)i * D;
      double l1 = 0;
      for (int e = 0; e < E; e++) {
        const float* w = &wo[(size_t)e * HD + (size_t)q * D];
        double x = 0;
        for (int d = 0; d < D; d++) x += (double)w[d] * v[d];
        l1 += std::fabs(x);
      }
      out[(size_t)i] += l1 / G;
    }
  }
}

std::vector<std::vector<float>> output_projections(const Model& m) {
  const ModelConfig& c = m.config();
  const int E = c.n_embd, HD = c.n_head * c.head_dim;
  std::vector<std::vector<float>> wo((size_t)c.n_layer);
  for (int l = 0; l < c.n_layer; l++) {  // W_O of each layer, dequantised: [E][n_head * D]
    const WeightMatrix& w = m.weights().layers[l].wo;
    wo[(size_t)l].resize((size_t)E * HD);
    for (int e = 0; e < E; e++) dequantize_row(w.type, w.data + (size_t)e * w.row_stride, &wo[(size_t)l][(size_t)e * HD], HD);
  }
  return wo;
}

std::unique_ptr<Scorer> make_critical_scorer(std::unique_ptr<Scorer> inner, const ModelConfig& c,
                                             std::vector<std::vector<float>> wo, double ratio, double epsilon,
                                             double first_stage_ratio) {
  return std::make_unique<CriticalScorer>(std::move(inner), c, std::move(wo), ratio, epsilon, first_stage_ratio);
}

std::vector<PressParam> critical_params(bool adakv) {
  std::vector<PressParam> p = {
      {"epsilon", 1e-4, 0, 1e6, false, "added to the inner press's score before the ||W_O v|| weighting"},
      {"first_stage_ratio", 0.5, 0, 1, false, "the share of each head's budget kept by the inner press's score alone"}};
  if (adakv) p.push_back(adakv_alpha_safeguard_param());
  return p;
}

namespace {
RegisterScorer reg({"critical_snapkv",
                    "CriticalKV(SnapKV): the best half of SnapKV's budget kept, the rest by (SnapKV + 1e-4) x "
                    "||W_O v||_1 (mean over the group)",
                    false, [](const PressSpec& o, const Model& m) {
                      return make_critical_scorer(make_snapkv_scorer(m.config()), m.config(), output_projections(m), o.ratio,
                                                  press_param(o, "epsilon"), press_param(o, "first_stage_ratio"));
                    },
                    {.min_context_tokens = kSnapKvWindow,
                     .params = critical_params(false),
                     .kvpress_parity = "exact (kvpress CriticalKVPress(SnapKVPress))"}});

}  // namespace
}  // namespace kvzap
