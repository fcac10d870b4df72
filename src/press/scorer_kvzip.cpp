// KVzip and KVzip+ (kvzap-spec.md §1.5, §2.3): after the context is prefilled, the model is asked to
// repeat it, chunk by chunk, on top of the cache; a context pair's score is the largest attention any
// query of the repeat input pays it (max over the query heads of its group and over all input rows),
// with the softmax restricted to sink keys + the chunk's keys + the input's own keys.
// KVzip+ scales each attention weight by ||W_O^(q) v_i|| / ||h_j|| (the pair's contribution to the
// residual stream relative to the row's input norm).
//
// Deliberate deviation from kvpress: the chat-template prefix (system turn) is protected like the
// original KVzip code does, instead of being force-evicted because it is never scored (spec §1.5 quirk).
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/fp16.h"
#include "engine/session.h"
#include "press/kvzip.h"
#include "press/press.h"

namespace kvzap {

namespace {

#define KVZAP_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

KVZAP_CLONES
float dot64(const float* a, const float* b, int d) {
  float acc[16] = {0};
  for (int i = 0; i < d; i += 16)
    for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
  float s = 0;
  for (int l = 0; l < 16; l++) s += acc[l];
  return s;
}

constexpr int kSinks = 4;
constexpr int kChunk = 2048;
constexpr int kPrevTail = 8;

}  // namespace

KvzipScorer::KvzipScorer(const Model& model, bool plus) : model_(model), plus_(plus) {}

void KvzipScorer::prepare_output_norms() {
  // Gram matrices M_q = W_O^(q)^T W_O^(q) per layer and query head: ||W_O^(q) v||^2 = v^T M_q v.
  if (!gram_.empty()) return;
  const ModelConfig& c = model_.config();
  const int D = c.head_dim, H = c.n_head, E = c.n_embd;
  gram_.assign((size_t)c.n_layer, std::vector<double>((size_t)H * D * D, 0.0));
  std::vector<float> row((size_t)H * D);
  for (int l = 0; l < c.n_layer; l++) {
    const WeightMatrix& wo = model_.weights().layers[l].wo;  // [E rows][H*D]
    std::vector<double>& g = gram_[l];
    for (int e = 0; e < E; e++) {
      dequantize_row(wo.type, wo.data + (size_t)e * wo.row_stride, row.data(), (int64_t)H * D);
      for (int q = 0; q < H; q++) {
        const float* r = &row[(size_t)q * D];
        double* m = &g[(size_t)q * D * D];
        for (int a = 0; a < D; a++)
          for (int b = 0; b < D; b++) m[a * D + b] += (double)r[a] * r[b];
      }
    }
  }
}

std::vector<int32_t> KvzipScorer::repeat_prompt(const std::vector<int32_t>& prev_tail, bool first) const {
  const Tokenizer& tok = model_.tokenizer();
  std::vector<int32_t> ids =
      tok.encode(first ? "\n\nRepeat the previous context exactly."
                       : "\n\nRepeat the part of the previous context exactly, starting with",
                 false, false);
  if (!first) ids.insert(ids.end(), prev_tail.begin(), prev_tail.end());
  return ids;
}

void KvzipScorer::score_context(ContextView& ctx, CacheScores& out) {
  Session& s = ctx.session;
  KvCache& cache = s.cache();
  const ModelConfig& c = model_.config();
  const Tokenizer& tok = model_.tokenizer();
  const std::vector<int32_t>& ids = ctx.context_ids;
  const int64_t n_ctx = (int64_t)ids.size();
  if (plus_) prepare_output_norms();

  // Template pieces around the user content: the prefix is protected, the suffix (end of user turn +
  // assistant header) follows each repeat instruction.
  const ChatFormat fmt = detect_chat_format(tok.vocab());
  const std::string marker = "\x01KVZAP\x01";
  const std::string rendered = apply_chat_template(fmt, {{"user", marker}}, ChatOptions{true, false});
  const size_t at = rendered.find(marker);
  const std::vector<int32_t> prefix = tok.encode(rendered.substr(0, at), false, true);
  const std::vector<int32_t> suffix = tok.encode(rendered.substr(at + marker.size()), false, true);
  int64_t start = 0;
  if ((int64_t)prefix.size() <= n_ctx && std::equal(prefix.begin(), prefix.end(), ids.begin())) start = (int64_t)prefix.size();

  out.assign(c.n_layer, std::vector<std::vector<float>>(c.n_head_kv));
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++) {
      if (cache.length(l, h) != n_ctx) throw Error("KVzip needs the full context in the cache before scoring");
      out[l][h].assign((size_t)n_ctx, 0.0f);
      for (int64_t i = 0; i < std::max<int64_t>(start, std::min<int64_t>(kSinks, n_ctx)); i++)
        out[l][h][i] = std::numeric_limits<float>::infinity();
    }

  for (int64_t c0 = start; c0 < n_ctx; c0 += kChunk) {
    const int64_t c1 = std::min(n_ctx, c0 + kChunk);
    std::vector<int32_t> prev_tail;
    if (c0 > start) prev_tail.assign(ids.begin() + (c0 - kPrevTail), ids.begin() + c0);
    std::vector<int32_t> input = repeat_prompt(prev_tail, c0 == start);
    input.insert(input.end(), suffix.begin(), suffix.end());
    input.insert(input.end(), ids.begin() + c0, ids.begin() + c1);
    const int64_t n_in = (int64_t)input.size();
    if (n_ctx + n_in > s.n_ctx())
      throw Error("KVzip scoring needs " + std::to_string(n_ctx + n_in) + " tokens of context (context + repeat input); raise -c");
    if (n_in > s.forward().max_batch())
      throw Error("KVzip scoring needs a batch of at least " + std::to_string(n_in) + " tokens; raise -b");
    ChunkObserver obs(*this, out, c0, c1, n_ctx, n_in);
    obs.pool_ptr = &s.forward().pool();
    std::vector<float> logits((size_t)c.n_vocab);
    s.forward().run(input.data(), n_in, cache, LogitsMode::None, logits.data(), &obs);
    cache.truncate((int32_t)n_ctx);
  }
}

void KvzipScorer::ChunkObserver::after_attention(const LayerStep& st, KvCache& cache) {
  const ModelConfig& c = sc.model_.config();
  const int D = c.head_dim, H = c.n_head, Hkv = c.n_head_kv, G = c.n_group();
  const int l = st.layer;
  const int64_t ns = std::min<int64_t>(kSinks, c0);  // sink keys before the chunk
  const int64_t m = c1 - c0;
  const int64_t nk = ns + m + n_in;  // reduced key set: sinks | chunk | own input
  const float scale = 1.0f / std::sqrt((float)D);
  ThreadPool& pool = *pool_ptr;

  // Inverse row norms of the attention inputs (KVzip+).
  std::vector<float> inv_hnorm((size_t)n_in, 1.0f);
  if (sc.plus_)
    for (int64_t j = 0; j < n_in; j++) {
      double ss = 0;
      const float* h = st.h + j * c.n_embd;
      for (int e = 0; e < c.n_embd; e++) ss += (double)h[e] * h[e];
      inv_hnorm[j] = (float)(1.0 / std::sqrt(std::max(ss, 1e-30)));
    }

  for (int hk = 0; hk < Hkv; hk++) {
    // Keys (and, for KVzip+, value contributions per query head) of the reduced set in f32.
    std::vector<float> K((size_t)nk * D), V((size_t)nk * D);
    auto slot_of = [&](int64_t i) { return i < ns ? i : (i < ns + m ? c0 + (i - ns) : n_ctx + (i - ns - m)); };
    for (int64_t i = 0; i < nk; i++) {
      const uint16_t* k = cache.key_at(l, hk, slot_of(i));
      const uint16_t* v = cache.value_at(l, hk, slot_of(i));
      for (int d = 0; d < D; d++) {
        K[i * D + d] = fp16_to_fp32(k[d]);
        V[i * D + d] = fp16_to_fp32(v[d]);
      }
    }
    // vnorm[g][i] = ||W_O^(q) v_i|| for chunk columns only (the only ones scored).
    std::vector<float> vnorm((size_t)G * m, 1.0f);
    if (sc.plus_)
      pool.parallel_for(G * m, [&](int64_t task, int) {
        const int64_t g = task / m, i = task % m;
        const double* M = &sc.gram_[l][(size_t)(hk * G + g) * D * D];
        const float* v = &V[(ns + i) * D];
        double acc = 0;
        for (int a = 0; a < D; a++) {
          double r = 0;
          for (int b = 0; b < D; b++) r += M[a * D + b] * v[b];
          acc += v[a] * r;
        }
        vnorm[g * m + i] = (float)std::sqrt(std::max(acc, 0.0));
      });
    // Column maxima over rows and group heads; each task keeps its own, merged after (max is exact).
    const int64_t row_block = 64;
    const int64_t n_rb = (n_in + row_block - 1) / row_block;
    std::vector<std::vector<float>> colmax((size_t)(G * n_rb), std::vector<float>((size_t)m, 0.0f));
    pool.parallel_for(G * n_rb, [&](int64_t task, int) {
      const int64_t g = task / n_rb, rb = task % n_rb;
      const int q_head = hk * G + (int)g;
      std::vector<float> logit((size_t)nk);
      std::vector<float> qs((size_t)D);
      float* cm = colmax[task].data();
      for (int64_t j = rb * row_block; j < std::min(n_in, (rb + 1) * row_block); j++) {
        const float* q = st.q + (j * H + q_head) * D;
        for (int d = 0; d < D; d++) qs[d] = q[d] * scale;
        const int64_t visible = ns + m + j + 1;  // causal only inside the input block
        float mx = -INFINITY;
        for (int64_t i = 0; i < visible; i++) {
          logit[i] = dot64(qs.data(), &K[i * D], D);
          mx = std::max(mx, logit[i]);
        }
        double sum = 0;
        for (int64_t i = 0; i < visible; i++) sum += std::exp((double)(logit[i] - mx));
        const float inv = (float)(1.0 / sum);
        const float rowscale = inv * inv_hnorm[j];
        for (int64_t i = 0; i < m; i++) {
          const float a = std::exp(logit[ns + i] - mx) * rowscale * vnorm[g * m + i];
          cm[i] = std::max(cm[i], a);
        }
      }
    });
    std::vector<float>& dst = out[l][hk];
    for (int64_t i = 0; i < m; i++) {
      float best = 0;
      for (const auto& cm : colmax) best = std::max(best, cm[i]);
      if (!std::isinf(dst[c0 + i])) dst[c0 + i] = best;
    }
  }
}

namespace {
RegisterScorer reg_kvzip({"kvzip", "KVzip: attention paid by a repeat-the-context pass (oracle, ~2x prefill cost)", false,
                          [](const PressOptions&, const Model& m) { return std::make_unique<KvzipScorer>(m, false); }});
RegisterScorer reg_kvzip_plus({"kvzip+", "KVzip+: KVzip weighted by ||W_O v|| / ||h|| (the target KVzap learns)", false,
                               [](const PressOptions&, const Model& m) { return std::make_unique<KvzipScorer>(m, true); }});
}  // namespace

}  // namespace kvzap
