// "critical_snapkv" (docs/ALGORITHMS.md §8.18, kvpress CriticalKVPress(SnapKVPress())): SnapKV scores s,
// re-weighted by how much each value moves the residual stream. Per (layer, KV head) of T entries: the
// int((1 - ratio) T / 2) (at least 1) best SnapKV entries are kept outright (first stage); every entry's
// score becomes (s + 1e-4) x the L1 norm of W_O^(q) v averaged over the G query heads q of its group.
// SnapKV's window entries enter with the layer's largest finite score + 1, as kvpress pads them.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/matmul.h"
#include "model/model.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

constexpr double kEpsilon = 1e-4, kFirstStage = 0.5;

class CriticalSnapKvScorer : public SnapKvScorer {
 public:
  CriticalSnapKvScorer(const Model& m, double ratio) : SnapKvScorer(m.config()), ratio_(ratio) {
    const ModelConfig& c = m.config();
    const int E = c.n_embd, HD = c.n_head * c.head_dim;
    wo_.resize((size_t)c.n_layer);
    for (int l = 0; l < c.n_layer; l++) {  // W_O of each layer, dequantised: [E][n_head * D]
      const WeightMatrix& wo = m.weights().layers[l].wo;
      wo_[(size_t)l].resize((size_t)E * HD);
      for (int e = 0; e < E; e++) dequantize_row(wo.type, wo.data + (size_t)e * wo.row_stride, &wo_[(size_t)l][(size_t)e * HD], HD);
    }
  }

  void score_cache(const KvCache& cache, CacheScores& out) override {
    SnapKvScorer::score_cache(cache, out);
    const int L = cfg_.n_layer, Hkv = cfg_.n_head_kv, G = cfg_.n_group(), D = cfg_.head_dim, E = cfg_.n_embd;
    const int HD = cfg_.n_head * D;
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
        std::vector<float> values;
        stream_values(cache, l, (int)hk, values);
        std::vector<double> pn((size_t)T, 0.0);
        for (int g = 0; g < G; g++) {
          const int q = (int)hk * G + g;
          for (int64_t i = 0; i < T; i++) {
            const float* v = values.data() + (size_t)i * D;
            double l1 = 0;
            for (int e = 0; e < E; e++) {
              const float* w = &wo_[(size_t)l][(size_t)e * HD + (size_t)q * D];
              double x = 0;
              for (int d = 0; d < D; d++) x += (double)w[d] * v[d];
              l1 += std::fabs(x);
            }
            pn[(size_t)i] += l1 / G;
          }
        }
        const int64_t first = std::max<int64_t>(1, (int64_t)((1.0 - ratio_) * (double)T * kFirstStage));
        std::vector<int64_t> order((size_t)T);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[(size_t)a] > s[(size_t)b]; });
        for (int64_t i = 0; i < T; i++) s[(size_t)i] = (float)(((double)s[(size_t)i] + kEpsilon) * pn[(size_t)i]);
        for (int64_t r = 0; r < std::min(first, T); r++) s[(size_t)order[(size_t)r]] = std::numeric_limits<float>::infinity();
      });
    }
  }

 private:
  double ratio_;
  std::vector<std::vector<float>> wo_;  // [layer][E][n_head * D]
};

RegisterScorer reg({"critical_snapkv",
                    "CriticalKV(SnapKV): the best half of SnapKV's budget kept, the rest by (SnapKV + 1e-4) x "
                    "||W_O v||_1 (mean over the group)",
                    false, [](const PressSpec& o, const Model& m) { return std::make_unique<CriticalSnapKvScorer>(m, o.ratio); },
                    {.min_context_tokens = kSnapKvWindow,
                     .kvpress_parity = "exact (kvpress CriticalKVPress(SnapKVPress))"}});

}  // namespace
}  // namespace kvzap
