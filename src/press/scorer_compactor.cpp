// "compactor" (docs/ALGORITHMS.md §8.13, kvpress CompactorPress, arXiv 2507.08143): query-agnostic blend of
//   * approximate leverage scores of the pre-RoPE keys (cached keys with RoPE undone), centred over the
//     sequence, through a right Gaussian sketch to 48 dims (sketched_leverage), z-scored over the layer;
//   * non-causal chunked attention: the context cut into tiles of 256, every query of a tile attends
//     to every key of the same tile (RoPE applied, unscaled logits as in kvpress), column sums averaged
//     over the group, times ||v||, avg_pool_same(3), z-scored over the layer;
// score = blending * leverage_z + attention_z with blending = the compression ratio (kvpress default).
// Scored slots are [8, T - 4); the first 8 and last 4 score +inf. The registry's "adakv_compactor"
// (the kvpress leaderboard entry) wraps it in AdaKV.
//
// The tiles' queries are consumed while the context is prefilled: a tile is scored as soon as its
// keys are cached and 4 more tokens exist (so it cannot reach the protected tail); only the queries
// of an unfinished tile are kept. Differences from kvpress: the sketch is seeded (PressSpec::seed)
// instead of drawn fresh; padded query rows and keys of the last partial tile are excluded as in
// kvpress's current code.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kvzap/error.h"
#include "model/model.h"
#include "press/baselines.h"
#include "press/kvzip_math.h"

namespace kvzap {
namespace {

constexpr int64_t kSinkStart = 8;

class CompactorScorer : public CacheContextScorer {
 public:
  CompactorScorer(const ModelConfig& c, double blending, uint64_t seed, const NonCausalOptions& o = {})
      : cfg_(c), blending_(blending), seed_(seed), opt_(o), rope_(c), layers_((size_t)c.n_layer) {
    reset();
  }

  void reset() override {
    for (Layer& st : layers_) {
      st.pending.clear();
      st.n_pending = 0;
      st.next_tile = opt_.sink_start;
      for (auto& s : st.colsum) s.clear();
    }
  }

  void observe_step(const LayerStep& step, const KvCache& cache) override {
    Layer& st = layers_[(size_t)step.layer];
    const size_t row = (size_t)cfg_.n_head * cfg_.head_dim;
    if (st.n_pending > 0 && st.pending_pos0 + st.n_pending != step.pos[0])
      throw Error("internal: compactor expects the context's positions in order");
    const int64_t first = st.n_pending > 0 ? st.pending_pos0 : step.pos[0];
    auto query_row = [&](int64_t p) -> const float* {
      if (p < step.pos[0]) return st.pending.data() + (size_t)(p - st.pending_pos0) * row;
      return step.q + (size_t)(p - step.pos[0]) * row;
    };
    while (st.next_tile + opt_.tile + opt_.sink_end <= cache.n_past()) {
      if (st.next_tile < first) throw Error("internal: compactor lost the queries of a tile");
      score_tile(step.layer, st.next_tile, st.next_tile + opt_.tile, query_row, cache);
      st.next_tile += opt_.tile;
    }
    // Keep the queries of the unfinished tile (positions >= next_tile) for later steps.
    const int64_t end = step.pos[0] + step.n_tok;
    const int64_t keep0 = std::max<int64_t>(st.next_tile, first);
    scratch_.resize((size_t)std::max<int64_t>(0, end - keep0) * row);
    for (int64_t p = keep0; p < end; p++) std::memcpy(&scratch_[(size_t)(p - keep0) * row], query_row(p), row * sizeof(float));
    st.pending.swap(scratch_);
    st.pending_pos0 = keep0;
    st.n_pending = std::max<int64_t>(0, end - keep0);
  }

  void score_cache(const KvCache& cache, CacheScores& out) override {
    const int64_t T = require_full_context(cache, "compactor");
    const int L = cfg_.n_layer, H = cfg_.n_head, Hkv = cfg_.n_head_kv, G = cfg_.n_group(), D = cfg_.head_dim;
    const int64_t left = std::min(opt_.sink_start, T);
    const int64_t right = std::min(opt_.sink_end, std::max<int64_t>(0, T - left));
    const int64_t mid_end = T - right, S = mid_end - left;
    size_scores(cache, out);
    for (auto& layer : out)
      for (auto& s : layer) std::fill(s.begin(), s.end(), std::numeric_limits<float>::infinity());
    if (S <= 0) return;
    const size_t row = (size_t)H * D;
    // The last tiles (up to mid_end) from the queries still pending.
    for (int l = 0; l < L; l++) {
      if (!judged_layer(cache, l)) continue;
      Layer& st = layers_[(size_t)l];
      auto query_row = [&](int64_t p) -> const float* {
        if (p < st.pending_pos0 || p >= st.pending_pos0 + st.n_pending)
          throw Error("internal: compactor did not see the whole context prefill");
        return st.pending.data() + (size_t)(p - st.pending_pos0) * row;
      };
      for (; st.next_tile < mid_end; st.next_tile += opt_.tile)
        score_tile(l, st.next_tile, std::min(mid_end, st.next_tile + opt_.tile), query_row, cache);
    }
    rope_.reserve(T);
    std::vector<float> lev((size_t)(L * Hkv * S)), att((size_t)(L * Hkv * S));
    parallel_for((int64_t)L * Hkv, [&](int64_t task, int) {
      const int l = (int)(task / Hkv), hk = (int)(task % Hkv);
      if (!judged_layer(cache, l)) return;
      std::vector<float> keys, values, a((size_t)S, 0.0f);
      stream_keys(cache, l, hk, keys);
      stream_values(cache, l, hk, values);
      float* k_mid = keys.data() + (size_t)left * D;
      for (int64_t i = 0; i < S; i++) rope_.unrotate(k_mid + (size_t)i * D, (int32_t)(left + i), l);
      if (opt_.leverage) {
        const std::vector<double> phi = gaussian_sketch(seed_, l, hk, D, opt_.sketch);
        sketched_leverage(k_mid, S, D, phi.data(), opt_.sketch, &lev[(size_t)(task * S)]);
      }
      const Layer& st = layers_[(size_t)l];
      for (int g = 0; g < G; g++) {
        const std::vector<float>& cs = st.colsum[(size_t)(hk * G + g)];
        if ((int64_t)cs.size() < mid_end) throw Error("internal: compactor is missing attention tiles");
        for (int64_t i = 0; i < S; i++) a[(size_t)i] += cs[(size_t)(left + i)];
      }
      for (int64_t i = 0; i < S; i++) {
        const float* v = values.data() + (size_t)(left + i) * D;
        double vn = 0;
        for (int d = 0; d < D; d++) vn += (double)v[d] * v[d];
        a[(size_t)i] = (float)((double)a[(size_t)i] / G * std::sqrt(vn));
      }
      avg_pool_same(a.data(), S, 3, &att[(size_t)(task * S)]);
    });
    for (int l = 0; l < L; l++) {
      if (!judged_layer(cache, l)) continue;
      float* lv = &lev[(size_t)l * Hkv * S];
      float* at = &att[(size_t)l * Hkv * S];
      if (opt_.leverage) zscore_inplace(lv, Hkv * S);
      zscore_inplace(at, Hkv * S);
      for (int hk = 0; hk < Hkv; hk++)
        for (int64_t i = 0; i < S; i++)
          out[(size_t)l][(size_t)hk][(size_t)(left + i)] =
              opt_.leverage ? (float)(blending_ * lv[(size_t)(hk * S + i)]) + at[(size_t)(hk * S + i)]
                            : at[(size_t)(hk * S + i)];
    }
  }

 private:
  struct Layer {
    std::vector<float> pending;  // [n_pending][n_head][D] queries of positions pending_pos0..
    int64_t pending_pos0 = 0, n_pending = 0;
    int64_t next_tile = kSinkStart;            // first position of the next tile to score
    std::vector<std::vector<float>> colsum;    // [n_head][slot]: attention received within its tile
  };

  // Non-causal attention inside the tile [s, e) of layer l: column sums per query head.
  template <class RowFn>
  void score_tile(int l, int64_t s, int64_t e, const RowFn& query_row, const KvCache& cache) {
    const int H = cfg_.n_head, G = cfg_.n_group(), D = cfg_.head_dim;
    const int64_t n = e - s;
    const size_t row = (size_t)H * D;
    Layer& st = layers_[(size_t)l];
    if (st.colsum.size() != (size_t)H) st.colsum.resize((size_t)H);
    tile_q_.resize((size_t)n * row);
    for (int64_t p = s; p < e; p++) std::memcpy(&tile_q_[(size_t)(p - s) * row], query_row(p), row * sizeof(float));
    parallel_for(H, [&](int64_t hq, int) {
      const int hk = (int)hq / G;
      std::vector<float> keys((size_t)(n * D)), kt((size_t)(n * D)), probs((size_t)(n * n));
      stream_key_range(cache, l, hk, s, n, keys.data());  // slots = positions: the context is whole
      transpose_rows(keys.data(), D, n, D, kt.data());
      std::vector<float>& cs = st.colsum[(size_t)hq];
      if ((int64_t)cs.size() < e) cs.resize((size_t)e, 0.0f);
      if (opt_.pad_last_tile && n < opt_.tile) {
        // kvpress 0.5.5 pads the last tile to opt_.tile with zero queries and keys and masks them with logits 0
        // and -1e-9 (exp(-1e-9) == 1 in f32): each real row also weighs opt_.tile - n keys of logit 0, and each
        // of the opt_.tile - n padding rows gives every real key exactly 1 / opt_.tile.
        const int64_t pad = opt_.tile - n;
        std::vector<double> logit((size_t)n);
        for (int64_t j = 0; j < n; j++) {
          const float* q = tile_q_.data() + (size_t)j * row + (size_t)hq * D;
          double mx = 0;  // the padding keys' logit
          for (int64_t i = 0; i < n; i++) {
            double dot = 0;
            for (int d = 0; d < D; d++) dot += (double)q[d] * keys[(size_t)(i * D + d)];
            logit[(size_t)i] = dot;
            mx = std::max(mx, dot);
          }
          double sum = (double)pad * std::exp(-mx);
          for (int64_t i = 0; i < n; i++) sum += (logit[(size_t)i] = std::exp(logit[(size_t)i] - mx));
          for (int64_t i = 0; i < n; i++) cs[(size_t)(s + i)] += (float)(logit[(size_t)i] / sum);
        }
        for (int64_t i = 0; i < n; i++) cs[(size_t)(s + i)] += (float)((double)pad / (double)opt_.tile);
        return;
      }
      attention_probs(tile_q_.data() + (size_t)hq * D, (int64_t)row, n, nullptr, kt.data(), n, D, 1.0f, probs.data());
      for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < n; i++) cs[(size_t)(s + i)] += probs[(size_t)(j * n + i)];
    });
  }

  ModelConfig cfg_;
  double blending_;
  uint64_t seed_;
  NonCausalOptions opt_;
  RopeTable rope_;
  std::vector<Layer> layers_;
  std::vector<float> scratch_, tile_q_;
};

}  // namespace

std::unique_ptr<Scorer> make_compactor_scorer(const ModelConfig& c, double blending, uint64_t seed) {
  return make_compactor_scorer(c, blending, seed, NonCausalOptions{});
}

std::unique_ptr<Scorer> make_compactor_scorer(const ModelConfig& c, double blending, uint64_t seed, const NonCausalOptions& o) {
  return std::make_unique<CompactorScorer>(c, blending, seed, o);
}

NonCausalOptions compactor_options(const PressSpec& o) {
  return {.sink_start = (int64_t)press_param(o, "sink_size_start"),
          .sink_end = (int64_t)press_param(o, "sink_size_end"),
          .tile = (int64_t)press_param(o, "chunk_size"),
          .sketch = (int)press_param(o, "sketch_dimension")};
}

std::vector<PressParam> compactor_params() {
  return {{"sink_size_start", 8, 0, 1 << 20, true, "the first tokens always kept"},
          {"sink_size_end", 4, 0, 1 << 20, true, "the last tokens always kept"},
          {"chunk_size", 256, 1, 1 << 16, true, "the non-causal attention's tile length"},
          {"sketch_dimension", 48, 1, 1024, true, "the leverage's Gaussian sketch width"},
          {"blending", -1, -1, 1e6, false, "the leverage's weight against attention; -1: the compression ratio (kvpress's None)"}};
}

double compactor_blending(const PressSpec& o) {
  const double b = press_param(o, "blending");
  return b >= 0 ? b : o.ratio;
}

std::unique_ptr<Scorer> make_non_causal_scorer(const ModelConfig& c, const NonCausalOptions& o) {
  return std::make_unique<CompactorScorer>(c, 0.0, 0, o);
}

namespace {
RegisterScorer reg({"compactor",
                    "Compactor: sketched leverage of pre-RoPE keys (x ratio) + non-causal attention in 256-token "
                    "tiles x ||v||, both z-scored; first 8 and last 4 tokens kept",
                    false, [](const PressSpec& o, const Model& m) {
                      return make_compactor_scorer(m.config(), compactor_blending(o), o.seed, compactor_options(o));
                    },
                    {.params = compactor_params(),
                     .kvpress_parity = "cannot match exactly: kvpress draws its Gaussian sketch unseeded (Jaccard ~0.9)"}});
}  // namespace

}  // namespace kvzap
