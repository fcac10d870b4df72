// "chunk_tova" (docs/ALGORITHMS.md §8.26, kvpress ChunkPress(TOVAPress(), chunk_length=1024)): the context
// is cut into chunks of chunk_length slots (the remainder is one more chunk) and TOVA (§8.6) runs on each
// chunk alone: the chunk's last query attends to the chunk's keys only (the softmax is over the chunk), the
// attention averaged over all query heads of the layer and shared by its KV heads; the chunk's last entry
// scores +inf. Each (layer, KV head) then keeps max(1, int(n (1 - ratio))) of the n entries of every chunk
// (the ratio scope does not apply).
//
// As in kvpress, whose TOVA takes the rotary angle of the last position of the whole input, a chunk's last
// query is rotated as if it sat at position T - 1 (T = the context length): kvzap undoes the engine's
// rotation of the stored query and applies that one. A last chunk of a single entry (kvpress fails there:
// no key to score) is kept.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kvzap/error.h"
#include "model/model.h"
#include "press/baselines.h"
#include "press/kvzip_math.h"

namespace kvzap {
namespace {

class ChunkTovaScorer : public CacheContextScorer, public ChunkBudget {
 public:
  ChunkTovaScorer(const ModelConfig& c, int64_t chunk)
      : ChunkBudget(chunk), cfg_(c), rope_(c), last_(c.n_layer, c.n_head, c.head_dim, 1), votes_((size_t)c.n_layer),
        seen_((size_t)c.n_layer) {
    if (chunk < 2) throw Error("chunk_tova's chunk_length must be >= 2, got " + std::to_string(chunk));
  }

  void reset() override {
    last_.clear();
    for (auto& v : votes_) v.clear();
    for (auto& s : seen_) s.clear();
  }

  // Keeps the query row of the last position of every whole chunk (and, through last_, of the context).
  void observe_step(const LayerStep& step, const KvCache&) override {
    last_.push(step);
    const size_t row = (size_t)cfg_.n_head * cfg_.head_dim;
    std::vector<float>& q = votes_[(size_t)step.layer];
    std::vector<uint8_t>& seen = seen_[(size_t)step.layer];
    for (int64_t t = 0; t < step.n_tok; t++) {
      const int64_t p = step.pos[t];
      if (p % chunk_ != chunk_ - 1) continue;
      const size_t idx = (size_t)(p / chunk_);
      if (seen.size() <= idx) {
        seen.resize(idx + 1, 0);
        q.resize((idx + 1) * row);
      }
      std::copy(step.q + (size_t)t * row, step.q + (size_t)(t + 1) * row, q.begin() + (ptrdiff_t)(idx * row));
      seen[idx] = 1;
    }
  }

  void score_cache(const KvCache& cache, CacheScores& out) override {
    const int64_t T = require_full_context(cache, "chunk_tova");
    const int L = cfg_.n_layer, H = cfg_.n_head, Hkv = cfg_.n_head_kv, G = cfg_.n_group(), D = cfg_.head_dim;
    size_scores(cache, out);
    if (T == 0) return;
    const int64_t n_chunks = (T + chunk_ - 1) / chunk_;
    const size_t row = (size_t)H * D;
    // Each chunk's last query, rotated for position T - 1: [layer][chunk][H][D].
    std::vector<std::vector<float>> q((size_t)L);
    rope_.reserve(T);
    for (int l = 0; l < L; l++) {
      if (!judged_layer(cache, l)) continue;
      if (last_.size(l) != 1 || last_.positions(l)[0] != T - 1)
        throw Error("internal: chunk_tova did not observe the last query of layer " + std::to_string(l));
      q[(size_t)l].assign((size_t)n_chunks * row, 0.0f);
      for (int64_t c = 0; c < n_chunks; c++) {
        const int64_t p = std::min(T, (c + 1) * chunk_) - 1;
        float* dst = q[(size_t)l].data() + (size_t)c * row;
        if (p == T - 1) {
          std::copy(last_.rows(l), last_.rows(l) + row, dst);
          continue;
        }
        if (seen_[(size_t)l].size() <= (size_t)c || !seen_[(size_t)l][(size_t)c])
          throw Error("internal: chunk_tova did not observe the query at position " + std::to_string(p) + " of layer " +
                      std::to_string(l));
        std::copy(votes_[(size_t)l].begin() + (ptrdiff_t)(c * row), votes_[(size_t)l].begin() + (ptrdiff_t)((c + 1) * row), dst);
        for (int h = 0; h < H; h++) {
          rope_.unrotate(dst + (size_t)h * D, (int32_t)p, l);
          rotate(dst + (size_t)h * D, (int32_t)(T - 1), l);
        }
      }
    }
    const float scale = cfg_.query_scale();  // the model's (Gemma: query_pre_attn_scalar)
    parallel_for(L, [&](int64_t li, int) {
      const int l = (int)li;
      if (!judged_layer(cache, l)) return;
      std::vector<std::vector<float>> keys((size_t)Hkv);
      for (int hk = 0; hk < Hkv; hk++) stream_keys(cache, l, hk, keys[(size_t)hk]);
      std::vector<float> kt, probs, acc;
      std::vector<float> s((size_t)T);
      for (int64_t c = 0; c < n_chunks; c++) {
        const int64_t c0 = c * chunk_, c1 = std::min(T, c0 + chunk_), n = c1 - c0;
        if (n < 2) {  // kvpress fails on a one-entry chunk; kvzap keeps it
          s[(size_t)c0] = std::numeric_limits<float>::infinity();
          continue;
        }
        kt.resize((size_t)(n * D));
        probs.resize((size_t)n);
        acc.assign((size_t)n, 0.0f);
        for (int hk = 0; hk < Hkv; hk++) {
          transpose_rows(keys[(size_t)hk].data() + (size_t)c0 * D, D, n, D, kt.data());
          for (int g = 0; g < G; g++) {
            attention_probs(q[(size_t)l].data() + (size_t)c * row + (size_t)(hk * G + g) * D, 0, 1, nullptr, kt.data(), n,
                            D, scale, probs.data());
            for (int64_t i = 0; i < n; i++) acc[(size_t)i] += probs[(size_t)i];
          }
        }
        for (int64_t i = 0; i < n - 1; i++) s[(size_t)(c0 + i)] = acc[(size_t)i] / (float)H;
        s[(size_t)(c1 - 1)] = std::numeric_limits<float>::infinity();
      }
      for (int hk = 0; hk < Hkv; hk++) out[(size_t)l][(size_t)hk] = s;
    });
  }

 private:
  // The engine's rotation of position pos (RopeTable undoes it): R(a) = F R(-a) F, F negating the second
  // component of every rotated pair.
  void rotate(float* x, int32_t pos, int layer) const {
    for (int i = 0; i < cfg_.head_dim / 2; i++) x[rope_.pair(i).second] = -x[rope_.pair(i).second];
    rope_.unrotate(x, pos, layer);
    for (int i = 0; i < cfg_.head_dim / 2; i++) x[rope_.pair(i).second] = -x[rope_.pair(i).second];
  }

  ModelConfig cfg_;
  RopeTable rope_;
  WindowQueries last_;                      // the context's last query
  std::vector<std::vector<float>> votes_;   // [layer][chunk][n_head][head_dim], whole chunks' last rows
  std::vector<std::vector<uint8_t>> seen_;  // [layer][chunk]
};

}  // namespace

// For the unit test (tests/unit/press/test_baseline_presses.cpp), which has no Model.
std::unique_ptr<Scorer> make_chunk_tova_scorer(const ModelConfig& c, int64_t chunk_length) {
  return std::make_unique<ChunkTovaScorer>(c, chunk_length);
}

namespace {
RegisterScorer reg({"chunk_tova",
                    "ChunkPress(TOVA): TOVA on each 1024-token chunk alone (the chunk's last query), each chunk "
                    "keeping its share (the ratio scope does not apply)",
                    false,
                    [](const PressSpec& o, const Model& m) {
                      return make_chunk_tova_scorer(m.config(), (int64_t)press_param(o, "chunk_length"));
                    },
                    {.params = {{"chunk_length", 1024, 2, 1 << 20, true, "slots per chunk, each compressed alone"}},
                     .kvpress_parity = "match up to ties (kvpress ChunkPress(TOVAPress))"}});
}  // namespace

}  // namespace kvzap
