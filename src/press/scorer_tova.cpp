// "tova" (docs/ALGORITHMS.md §8.6, kvpress TOVAPress): the attention the context's last token pays each
// earlier key, averaged over all query heads of the layer and shared by every KV head; the last token
// itself scores +inf.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kvzap/error.h"
#include "model/model.h"
#include "press/baselines.h"
#include "press/kvzip_math.h"

namespace kvzap {
namespace {

class TovaScorer : public CacheContextScorer {
 public:
  explicit TovaScorer(const ModelConfig& c) : cfg_(c), last_(c.n_layer, c.n_head, c.head_dim, 1) {}
  void observe_step(const LayerStep& step, const KvCache& cache) override { last_.push(step); }
  void reset() override { last_.clear(); }

  void score_cache(const KvCache& cache, CacheScores& out) override {
    const int64_t T = require_full_context(cache, "tova");
    const int L = cfg_.n_layer, H = cfg_.n_head, Hkv = cfg_.n_head_kv, G = cfg_.n_group(), D = cfg_.head_dim;
    size_scores(cache, out);
    if (T == 0) return;
    for (int l = 0; l < L; l++)
      if (judged_layer(cache, l) && (last_.size(l) != 1 || last_.positions(l)[0] != T - 1))
        throw Error("internal: tova did not observe the last query of layer " + std::to_string(l));
    const float scale = cfg_.query_scale();  // the model's (Gemma: query_pre_attn_scalar)
    parallel_for(L, [&](int64_t li, int) {
      const int l = (int)li;
      if (!judged_layer(cache, l)) return;
      std::vector<float> keys, kt((size_t)(T * D)), probs((size_t)T), acc((size_t)T, 0.0f);
      for (int hk = 0; hk < Hkv; hk++) {
        stream_keys(cache, l, hk, keys);
        transpose_rows(keys.data(), D, T, D, kt.data());
        for (int g = 0; g < G; g++) {
          attention_probs(last_.rows(l) + (size_t)(hk * G + g) * D, 0, 1, nullptr, kt.data(), T, D, scale, probs.data());
          for (int64_t i = 0; i < T; i++) acc[(size_t)i] += probs[(size_t)i];
        }
      }
      for (float& a : acc) a /= (float)H;
      acc[(size_t)(T - 1)] = std::numeric_limits<float>::infinity();
      for (int hk = 0; hk < Hkv; hk++) out[(size_t)l][(size_t)hk] = acc;
    });
  }

 private:
  ModelConfig cfg_;
  WindowQueries last_;
};

}  // namespace

std::unique_ptr<Scorer> make_tova_scorer(const ModelConfig& c) { return std::make_unique<TovaScorer>(c); }

namespace {
RegisterScorer reg({"tova", "TOVA: attention of the context's last token, averaged over all heads of the layer", false,
                    [](const PressSpec&, const Model& m) { return make_tova_scorer(m.config()); },
                    {.kvpress_parity = "match up to ties (kvpress TOVAPress)"}});
}  // namespace

}  // namespace kvzap
