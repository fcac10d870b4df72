// "snapkv" (docs/ALGORITHMS.md §8.4, kvpress SnapKVPress): the last 64 queries of the context vote for the
// keys they attend to; votes are smoothed over 5 neighbouring positions. See press/baselines.h.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kvzap/error.h"
#include "model/model.h"
#include "press/baselines.h"
#include "press/kvzip_math.h"

namespace kvzap {

SnapKvScorer::SnapKvScorer(const ModelConfig& c, int window, int kernel)
    : cfg_(c), window_(window), kernel_(kernel), queries_(c.n_layer, c.n_head, c.head_dim, window) {
  // kvpress pools with padding kernel_size // 2, which keeps the length for odd sizes only.
  if (kernel % 2 == 0) throw Error("SnapKV's kernel_size must be odd, got " + std::to_string(kernel));
}

void SnapKvScorer::score_cache(const KvCache& cache, CacheScores& out) {
  const int64_t T = require_full_context(cache, "snapkv");
  const int64_t W = window_;
  if (T <= W)
    throw Error("snapkv needs a context longer than its " + std::to_string(W) + "-token window (got " +
                std::to_string(T) + " tokens)");
  const int L = cfg_.n_layer, Hkv = cfg_.n_head_kv, G = cfg_.n_group(), D = cfg_.head_dim;
  const int64_t q_stride = (int64_t)cfg_.n_head * D;
  for (int l = 0; l < L; l++)
    if (judged_layer(cache, l) && (queries_.size(l) != W || queries_.positions(l)[W - 1] != T - 1))
      throw Error("internal: snapkv did not observe the last " + std::to_string(W) + " queries of layer " + std::to_string(l));
  size_scores(cache, out);
  const int64_t m = T - W;  // non-window keys: slots [0, m) (slot = position in a full context)
  const float scale = cfg_.query_scale();  // the model's (Gemma: query_pre_attn_scalar)
  parallel_for((int64_t)L * Hkv, [&](int64_t task, int) {
    const int l = (int)(task / Hkv), hk = (int)(task % Hkv);
    if (!judged_layer(cache, l)) return;
    std::vector<float> keys, kt((size_t)(T * D)), probs((size_t)(W * T)), acc((size_t)m, 0.0f);
    std::vector<int32_t> kpos;
    stream_keys(cache, l, hk, keys);
    stream_positions(cache, l, hk, kpos);
    transpose_rows(keys.data(), D, T, D, kt.data());
    std::vector<int64_t> visible((size_t)W);  // causal: window row j sees keys up to its own position
    for (int64_t j = 0; j < W; j++)
      visible[(size_t)j] = std::upper_bound(kpos.begin(), kpos.end(), queries_.positions(l)[j]) - kpos.begin();
    for (int g = 0; g < G; g++) {
      const float* q = queries_.rows(l) + (size_t)(hk * G + g) * D;
      attention_probs(q, q_stride, W, visible.data(), kt.data(), T, D, scale, probs.data());
      for (int64_t j = 0; j < W; j++) {
        const float* row = probs.data() + j * T;
        for (int64_t i = 0; i < m; i++) acc[(size_t)i] += row[i];
      }
    }
    // Mean over the window rows and the group, then the pooling (both linear: order is free).
    for (float& a : acc) a /= (float)(W * G);
    std::vector<float>& s = out[(size_t)l][(size_t)hk];
    avg_pool_same(acc.data(), m, kernel_, s.data());
    std::fill(s.begin() + m, s.end(), std::numeric_limits<float>::infinity());
  });
}

std::unique_ptr<Scorer> make_snapkv_scorer(const ModelConfig& c) { return std::make_unique<SnapKvScorer>(c); }

namespace {
RegisterScorer reg({"snapkv",
                    "SnapKV: attention of the context's last 64 queries, pooled over 5 positions; the window is kept",
                    false,
                    [](const PressSpec& o, const Model& m) -> std::unique_ptr<Scorer> {
                      return std::make_unique<SnapKvScorer>(m.config(), (int)press_param(o, "window_size"),
                                                            (int)press_param(o, "kernel_size"));
                    },
                    {.min_context_tokens = kSnapKvWindow,
                     .min_context_param = "window_size",
                     .params = {{"window_size", kSnapKvWindow, 1, 4096, true, "the last queries that vote"},
                                {"kernel_size", 5, 1, 63, true, "the pooling width of the votes, odd"}},
                     .kvpress_parity = "exact (kvpress SnapKVPress)"}});
}  // namespace

}  // namespace kvzap
