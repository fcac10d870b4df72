// "chunk_snapkv" (docs/ALGORITHMS.md §8.24, kvpress ChunkPress(SnapKVPress(), chunk_length=1024)): the context
// is cut into chunks of chunk_length slots (the remainder is one more chunk) and SnapKV (§8.4) runs on each
// chunk alone: the chunk's last window_size queries vote, causally, over the chunk's own keys only (the
// softmax is over the chunk), pooled over kernel_size neighbours and averaged over the group; the chunk's
// window scores +inf. Each (layer, KV head) then keeps max(1, int(n (1 - ratio))) of the n entries of every
// chunk, so the budget is spread evenly along the context (the ratio scope does not apply).
//
// As in kvpress, whose SnapKV takes the rotary angles of the last window_size positions of the whole
// input, a chunk's voting queries are rotated as if they sat at positions T - window_size .. T - 1 (T = the
// context length), not at their own: kvzap undoes each query's rotation and applies that one. A last chunk
// of at most window_size entries (kvpress asserts there) is kept whole.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kvzap/error.h"
#include "model/model.h"
#include "press/baselines.h"
#include "press/kvzip_math.h"

namespace kvzap {
namespace {

class ChunkSnapKvScorer : public CacheContextScorer, public ChunkBudget {
 public:
  ChunkSnapKvScorer(const ModelConfig& c, int64_t chunk, int window, int kernel)
      : ChunkBudget(chunk, window), cfg_(c), window_(window), kernel_(kernel), rope_(c), last_(c.n_layer, c.n_head, c.head_dim, window),
        votes_((size_t)c.n_layer), seen_((size_t)c.n_layer) {
    if (kernel % 2 == 0) throw Error("chunk_snapkv's kernel_size must be odd, got " + std::to_string(kernel));
    if (chunk <= window)
      throw Error("chunk_snapkv's chunk_length (" + std::to_string(chunk) + ") must exceed its window_size (" +
                  std::to_string(window) + "): SnapKV votes with the last window_size queries of each chunk");
  }

  void reset() override {
    last_.clear();
    for (auto& v : votes_) v.clear();
    for (auto& s : seen_) s.clear();
  }

  // Keeps the query rows of the last window_size positions of every whole chunk (and, through last_, of
  // the context: the last chunk's).
  void observe_step(const LayerStep& step, const KvCache&) override {
    last_.push(step);
    const size_t row = (size_t)cfg_.n_head * cfg_.head_dim;
    std::vector<float>& q = votes_[(size_t)step.layer];
    std::vector<uint8_t>& seen = seen_[(size_t)step.layer];
    for (int64_t t = 0; t < step.n_tok; t++) {
      const int64_t p = step.pos[t];
      if (p % chunk_ < chunk_ - window_) continue;
      const size_t idx = (size_t)vote_index(p);
      if (seen.size() <= idx) {
        seen.resize(idx + 1, 0);
        q.resize((idx + 1) * row);
      }
      std::copy(step.q + (size_t)t * row, step.q + (size_t)(t + 1) * row, q.begin() + (ptrdiff_t)(idx * row));
      seen[idx] = 1;
    }
  }

  void score_cache(const KvCache& cache, CacheScores& out) override {
    const int64_t T = require_full_context(cache, "chunk_snapkv");
    const int L = cfg_.n_layer, Hkv = cfg_.n_head_kv, G = cfg_.n_group(), D = cfg_.head_dim, H = cfg_.n_head;
    const int64_t W = window_;
    size_scores(cache, out);
    if (T == 0) return;
    const int64_t n_chunks = (T + chunk_ - 1) / chunk_;
    const size_t row = (size_t)H * D;
    // The voting queries of each chunk that has more than W entries, rotated for positions T - W .. T - 1:
    // [layer][chunk][W][H][D].
    std::vector<std::vector<float>> q((size_t)L);
    rope_.reserve(T);
    for (int l = 0; l < L; l++) {
      if (!judged_layer(cache, l)) continue;
      q[(size_t)l].assign((size_t)(n_chunks * W) * row, 0.0f);
      for (int64_t c = 0; c < n_chunks; c++) {
        const int64_t c0 = c * chunk_, c1 = std::min(T, c0 + chunk_);
        if (c1 - c0 <= W) continue;
        for (int64_t j = 0; j < W; j++) {
          const int64_t p = c1 - W + j;
          float* dst = q[(size_t)l].data() + (size_t)(c * W + j) * row;
          if (c1 == T) {  // the context's own last queries
            if (last_.size(l) != W || last_.positions(l)[j] != p)
              throw Error("internal: chunk_snapkv did not observe the last queries of layer " + std::to_string(l));
            std::copy(last_.rows(l) + (size_t)j * row, last_.rows(l) + (size_t)(j + 1) * row, dst);
            continue;
          }
          const size_t idx = (size_t)vote_index(p);
          if (seen_[(size_t)l].size() <= idx || !seen_[(size_t)l][idx])
            throw Error("internal: chunk_snapkv did not observe the query at position " + std::to_string(p) +
                        " of layer " + std::to_string(l));
          std::copy(votes_[(size_t)l].begin() + (ptrdiff_t)(idx * row),
                    votes_[(size_t)l].begin() + (ptrdiff_t)((idx + 1) * row), dst);
          for (int h = 0; h < H; h++) {
            float* x = dst + (size_t)h * D;
            rope_.unrotate(x, (int32_t)p, l);
            rotate(x, (int32_t)(T - W + j), l);
          }
        }
      }
    }
    const float scale = cfg_.query_scale();  // the model's (Gemma: query_pre_attn_scalar)
    parallel_for((int64_t)L * Hkv, [&](int64_t task, int) {
      const int l = (int)(task / Hkv), hk = (int)(task % Hkv);
      if (!judged_layer(cache, l)) return;
      std::vector<float> keys, kt, probs, acc;
      stream_keys(cache, l, hk, keys);
      std::vector<float>& s = out[(size_t)l][(size_t)hk];
      for (int64_t c = 0; c < n_chunks; c++) {
        const int64_t c0 = c * chunk_, c1 = std::min(T, c0 + chunk_), n = c1 - c0, m = n - W;
        if (n <= W) {  // kvpress asserts here; kvzap keeps the short last chunk
          std::fill(s.begin() + c0, s.begin() + c1, std::numeric_limits<float>::infinity());
          continue;
        }
        kt.resize((size_t)(n * D));
        probs.resize((size_t)(W * n));
        acc.assign((size_t)m, 0.0f);
        transpose_rows(keys.data() + (size_t)c0 * D, D, n, D, kt.data());
        std::vector<int64_t> visible((size_t)W);  // causal inside the chunk
        for (int64_t j = 0; j < W; j++) visible[(size_t)j] = m + j + 1;
        for (int g = 0; g < G; g++) {
          const float* qr = q[(size_t)l].data() + (size_t)(c * W) * row + (size_t)(hk * G + g) * D;
          attention_probs(qr, (int64_t)row, W, visible.data(), kt.data(), n, D, scale, probs.data());
          for (int64_t j = 0; j < W; j++) {
            const float* pr = probs.data() + j * n;
            for (int64_t i = 0; i < m; i++) acc[(size_t)i] += pr[i];
          }
        }
        for (float& a : acc) a /= (float)(W * G);
        avg_pool_same(acc.data(), m, kernel_, s.data() + c0);
        std::fill(s.begin() + c0 + m, s.begin() + c1, std::numeric_limits<float>::infinity());
      }
    });
  }

 private:
  int64_t vote_index(int64_t p) const { return (p / chunk_) * window_ + (p % chunk_ - (chunk_ - window_)); }
  // The engine's rotation of position pos (RopeTable undoes it): R(a) = F R(-a) F, F negating the second
  // component of every rotated pair.
  void rotate(float* x, int32_t pos, int layer) const {
    for (int i = 0; i < cfg_.head_dim / 2; i++) x[rope_.pair(i).second] = -x[rope_.pair(i).second];
    rope_.unrotate(x, pos, layer);
    for (int i = 0; i < cfg_.head_dim / 2; i++) x[rope_.pair(i).second] = -x[rope_.pair(i).second];
  }

  ModelConfig cfg_;
  int window_, kernel_;
  RopeTable rope_;
  WindowQueries last_;                      // the context's last window_size queries
  std::vector<std::vector<float>> votes_;   // [layer][chunk][window][n_head][head_dim], whole chunks' last rows
  std::vector<std::vector<uint8_t>> seen_;  // [layer][chunk * window]
};

}  // namespace

// For the unit test (tests/unit/press/test_baseline_presses.cpp), which has no Model.
std::unique_ptr<Scorer> make_chunk_snapkv_scorer(const ModelConfig& c, int64_t chunk_length, int window, int kernel) {
  return std::make_unique<ChunkSnapKvScorer>(c, chunk_length, window, kernel);
}

namespace {
RegisterScorer reg({"chunk_snapkv",
                    "ChunkPress(SnapKV): SnapKV on each 1024-token chunk alone, each chunk keeping its share "
                    "(the ratio scope does not apply)",
                    false,
                    [](const PressSpec& o, const Model& m) {
                      return make_chunk_snapkv_scorer(m.config(), (int64_t)press_param(o, "chunk_length"),
                                                      (int)press_param(o, "window_size"), (int)press_param(o, "kernel_size"));
                    },
                    {.min_context_tokens = kSnapKvWindow,
                     .min_context_param = "window_size",
                     .params = {{"chunk_length", 1024, 2, 1 << 20, true, "slots per chunk, each compressed alone"},
                                {"window_size", kSnapKvWindow, 1, 4096, true, "the last queries of a chunk that vote"},
                                {"kernel_size", 5, 1, 63, true, "the pooling width of the votes, odd"}},
                     .kvpress_parity = "match up to ties (kvpress ChunkPress(SnapKVPress)): a chunk that keeps fewer "
                                       "entries than its window keeps torch.topk's choice of the equal window scores, "
                                       "kvzap the later ones (Jaccard >= 0.996)"}});
}  // namespace

}  // namespace kvzap
