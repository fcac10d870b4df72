// "observed_attention" (docs/ALGORITHMS.md §8.7, kvpress ObservedAttentionPress, H2O-like): the attention
// each key receives from every query of the context prefill, summed and divided by the number of
// queries that can see it (T - i), averaged over the G query heads of its KV head. kvpress reads the
// eager attention weights; here each prefill step's queries are re-attended to the cache as it stands
// after the step (causal by position), one query head and block of rows at a time.
#include <algorithm>
#include <cmath>

#include "kvzap/error.h"
#include "model/model.h"
#include "press/baselines.h"
#include "press/kvzip_math.h"

namespace kvzap {
namespace {

constexpr int64_t kRowBlock = 32;

class ObservedAttentionScorer : public CacheContextScorer {
 public:
  explicit ObservedAttentionScorer(const ModelConfig& c) : cfg_(c), colsum_((size_t)c.n_layer * c.n_head) {}
  void reset() override {
    for (auto& s : colsum_) s.clear();
  }

  void observe_step(const LayerStep& step, const KvCache& cache) override {
    const int H = cfg_.n_head, Hkv = cfg_.n_head_kv, G = cfg_.n_group(), D = cfg_.head_dim;
    const int l = step.layer;
    const int64_t n = step.n_tok;
    // Keys of every KV head, transposed [D][len], shared by the query heads of its group.
    if (kt_.size() != (size_t)Hkv) kt_.resize((size_t)Hkv), kpos_.resize((size_t)Hkv);
    for (int hk = 0; hk < Hkv; hk++) {
      const int64_t len = cache.length(l, hk);
      stream_keys(cache, l, hk, keys_);
      stream_positions(cache, l, hk, kpos_[(size_t)hk]);
      kt_[(size_t)hk].resize((size_t)(len * D));
      transpose_rows(keys_.data(), D, len, D, kt_[(size_t)hk].data());
    }
    const float scale = cfg_.query_scale();  // the model's (Gemma: query_pre_attn_scalar)
    if (probs_.size() < (size_t)n_threads()) probs_.resize((size_t)n_threads());
    parallel_for(H, [&](int64_t hq, int thread) {
      const int hk = (int)hq / G;
      const std::vector<int32_t>& kpos = kpos_[(size_t)hk];
      const int64_t len = (int64_t)kpos.size();
      std::vector<float>& sum = colsum_[(size_t)l * H + hq];
      if ((int64_t)sum.size() < len) sum.resize((size_t)len, 0.0f);
      std::vector<float>& probs = probs_[(size_t)thread];
      probs.resize((size_t)(kRowBlock * len));
      int64_t visible[kRowBlock];
      for (int64_t j0 = 0; j0 < n; j0 += kRowBlock) {
        const int64_t rows = std::min(kRowBlock, n - j0);
        for (int64_t j = 0; j < rows; j++)
          visible[j] = std::upper_bound(kpos.begin(), kpos.end(), step.pos[j0 + j]) - kpos.begin();
        attention_probs(step.q + (size_t)(j0 * H + hq) * D, (int64_t)H * D, rows, visible, kt_[(size_t)hk].data(), len, D,
                        scale, probs.data());
        for (int64_t j = 0; j < rows; j++) {
          const float* row = probs.data() + j * len;
          for (int64_t i = 0; i < visible[j]; i++) sum[(size_t)i] += row[i];
        }
      }
    });
  }

  void score_cache(const KvCache& cache, CacheScores& out) override {
    const int64_t T = require_full_context(cache, "observed_attention");
    const int L = cfg_.n_layer, H = cfg_.n_head, Hkv = cfg_.n_head_kv, G = cfg_.n_group();
    size_scores(cache, out);
    std::vector<int32_t> pos;
    for (int l = 0; l < L; l++)
      for (int hk = 0; hk < Hkv && judged_layer(cache, l); hk++) {
        stream_positions(cache, l, hk, pos);
        std::vector<float>& s = out[(size_t)l][(size_t)hk];
        for (int64_t i = 0; i < T; i++) {
          double a = 0;
          for (int g = 0; g < G; g++) {
            const std::vector<float>& sum = colsum_[(size_t)l * H + hk * G + g];
            if ((int64_t)sum.size() < T) throw Error("internal: observed_attention did not see the whole context prefill");
            a += sum[(size_t)i];
          }
          s[(size_t)i] = (float)(a / (double)(T - pos[(size_t)i]) / G);
        }
      }
  }

 private:
  ModelConfig cfg_;
  std::vector<std::vector<float>> colsum_;  // [layer * n_head + q_head][slot]: attention received so far
  std::vector<std::vector<float>> kt_;      // [n_head_kv][D][len] scratch
  std::vector<std::vector<int32_t>> kpos_;  // [n_head_kv][len]
  std::vector<float> keys_;                 // [len][D] scratch
  std::vector<std::vector<float>> probs_;   // per thread [kRowBlock][len]
};

}  // namespace

std::unique_ptr<Scorer> make_observed_attention_scorer(const ModelConfig& c) {
  return std::make_unique<ObservedAttentionScorer>(c);
}

namespace {
RegisterScorer reg({"observed_attention",
                    "H2O-like: attention each key received during the context prefill, per query that saw it", false,
                    [](const PressSpec&, const Model& m) { return make_observed_attention_scorer(m.config()); },
                    {.kvpress_parity = "exact (kvpress ObservedAttentionPress)"}});
}  // namespace

}  // namespace kvzap
