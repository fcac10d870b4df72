// "critical_adakv_expected_attention" (docs/ALGORITHMS.md §8.21, kvpress
// CriticalAdaKVPress(ExpectedAttentionPress(use_vnorm=False))): CriticalKV's two stages inside AdaKV's
// per-layer budget. Per layer of H KV heads x T entries, with s the ExpectedAttention scores (sinks at the
// layer's largest score + 1), n = max(1, int(T (1 - ratio))) and n_safe = max(1, int(0.2 n)):
//   1. each head's n_safe best entries are protected (score := max float);
//   2. the layer's n H best entries decide each head's budget b_h (how many of them the head holds);
//   3. each head's int(b_h / 2) best entries are protected as well (first stage);
//   4. score := (s + 1e-4) x ||W_O^(q) v||_1 averaged over the group, and each head keeps its b_h best.
// It chooses its own kept sets (the ratio scope does not apply); its scores, as `score` sees them, are s.
// The CriticalAdaKV step (make_critical_adakv_scorer) wraps any context scorer; "critical_adakv_snapkv"
// registers it around SnapKV (press/scorer_critical_adakv_snapkv.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "model/model.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

constexpr float kProtected = std::numeric_limits<float>::max();  // what kvpress writes (finfo.max)

class CriticalAdaKvScorer : public WrappedContextScorer, public BudgetSplit {
 public:
  CriticalAdaKvScorer(std::unique_ptr<Scorer> inner, const ModelConfig& c, std::vector<std::vector<float>> wo,
                      double epsilon, double first_stage_ratio, double alpha_safeguard)
      : WrappedContextScorer(std::move(inner), "CriticalAdaKV"), cfg_(c), wo_(std::move(wo)), epsilon_(epsilon),
        first_stage_(first_stage_ratio), alpha_(alpha_safeguard) {}

  std::string budget_name() const override { return "critical adakv"; }
  void score_cache(const KvCache& cache, CacheScores& out) override {
    cache_inner_->score_cache(cache, out);
    for (int l = 0; l < cfg_.n_layer; l++) {  // kept entries (+inf: the sinks) as kvpress pads them
      if (!judged_layer(cache, l)) continue;
      float top = -std::numeric_limits<float>::infinity();
      for (const auto& h : out[(size_t)l])
        for (float v : h)
          if (std::isfinite(v)) top = std::max(top, v);
      for (auto& h : out[(size_t)l])
        for (float& v : h)
          if (v == std::numeric_limits<float>::infinity()) v = top + 1;
    }
  }

  void mark_evictions(const KvCache& cache, const CacheScores& scores, double ratio, EvictionMask& drop) override {
    const int L = cache.n_layer(), H = cache.n_head_kv();
    if (!(ratio > 0)) return;
    parallel_for(L, [&](int64_t li, int) {
      const int l = (int)li;
      if (!judged_layer(cache, l)) return;
      const int64_t T = cache.length(l, 0);
      if (T <= 0) return;
      const int64_t n = std::max<int64_t>(1, (int64_t)((double)T * (1.0 - ratio)));
      // kvpress: at least one while alpha_safeguard > 0 (n >= 1 here), none at 0.
      const int64_t n_safe = alpha_ > 0 ? std::max<int64_t>(1, (int64_t)((double)n * alpha_)) : 0;
      std::vector<std::vector<float>> s = scores[(size_t)l];  // [H][T]
      // Slots of a head by decreasing score; among equal scores the earlier slot (kvpress: torch.topk's order).
      std::vector<int64_t> order((size_t)T);
      auto rank = [&](const std::vector<float>& x) {
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return x[(size_t)a] > x[(size_t)b]; });
      };
      for (int h = 0; h < H; h++) {
        rank(s[(size_t)h]);
        for (int64_t r = 0; r < std::min(n_safe, T); r++) s[(size_t)h][(size_t)order[(size_t)r]] = kProtected;
      }
      // Each head's budget: its share of the layer's n H best entries.
      std::vector<std::pair<float, int>> all;  // (score, head), [H T]
      all.reserve((size_t)(H * T));
      for (int h = 0; h < H; h++)
        for (float v : s[(size_t)h]) all.push_back({v, h});
      const int64_t n_all = std::min<int64_t>(n * H, (int64_t)all.size());
      std::nth_element(all.begin(), all.begin() + (n_all - 1), all.end(),
                       [](const auto& a, const auto& b) { return a.first > b.first; });
      std::vector<int64_t> budget((size_t)H, 0);
      for (int64_t i = 0; i < n_all; i++) budget[(size_t)all[(size_t)i].second]++;
      std::vector<double> pn;  // [T]
      std::vector<double> s2((size_t)T);
      for (int h = 0; h < H; h++) {
        std::vector<float>& x = s[(size_t)h];
        rank(x);
        const int64_t first = (int64_t)((double)budget[(size_t)h] * first_stage_);
        for (int64_t r = 0; r < first; r++) x[(size_t)order[(size_t)r]] = kProtected;
        projected_value_norms(cache, l, h, cfg_, wo_[(size_t)l], pn);
        // In f32 as kvpress: a protected entry times a norm above 1 overflows to +inf, still kept.
        std::vector<float> y((size_t)T);
        for (int64_t i = 0; i < T; i++) y[(size_t)i] = (x[(size_t)i] + (float)epsilon_) * (float)pn[(size_t)i];
        rank(y);
        std::vector<uint8_t>& d = drop[(size_t)l * H + h];
        std::fill(d.begin(), d.end(), 1);
        for (int64_t r = 0; r < budget[(size_t)h]; r++) d[(size_t)order[(size_t)r]] = 0;
      }
    });
  }

 private:
  ModelConfig cfg_;
  std::vector<std::vector<float>> wo_;  // [layer][E][n_head * D]
  double epsilon_, first_stage_, alpha_;  // kvpress epsilon, first_stage_ratio, alpha_safeguard
};

}  // namespace

std::unique_ptr<Scorer> make_critical_adakv_scorer(std::unique_ptr<Scorer> inner, const ModelConfig& c,
                                                   std::vector<std::vector<float>> wo, double epsilon,
                                                   double first_stage_ratio, double alpha_safeguard) {
  return std::make_unique<CriticalAdaKvScorer>(std::move(inner), c, std::move(wo), epsilon, first_stage_ratio,
                                               alpha_safeguard);
}

std::unique_ptr<Scorer> make_critical_adakv_scorer(std::unique_ptr<Scorer> inner, const Model& m, const PressSpec& o) {
  return make_critical_adakv_scorer(std::move(inner), m.config(), output_projections(m), press_param(o, "epsilon"),
                                    press_param(o, "first_stage_ratio"), press_param(o, "alpha_safeguard"));
}

namespace {
RegisterScorer reg({"critical_adakv_expected_attention",
                    "CriticalAdaKV(ExpectedAttention without ||v||): AdaKV's per-layer budget, then in each head half "
                    "its budget by expected attention and the rest by (score + 1e-4) x ||W_O v||_1",
                    false, [](const PressSpec& o, const Model& m) {
                      return make_critical_adakv_scorer(make_expected_attention_scorer(m.config(), 1e-2, false), m, o);
                    },
                    {.kvpress_ratio_scope = "adakv",
                     .params = critical_params(true),
                     .kvpress_parity = "exact (kvpress CriticalAdaKVPress(ExpectedAttentionPress(use_vnorm=False)))"}});
}  // namespace

}  // namespace kvzap
