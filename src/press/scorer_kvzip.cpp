// KVzip and KVzip+ (docs/ALGORITHMS.md §2, §3): after the context is prefilled, the model is asked to
// repeat it, chunk by chunk, on top of the cache; a context pair's score is the largest attention any
// query of the repeat input pays it (max over the query heads of its group and over all input rows),
// with the softmax restricted to sink keys + the chunk's keys + the input's own keys.
// KVzip+ scales each attention weight by ||W_O^(q) v_i|| / ||h_j|| (the pair's contribution to the
// residual stream relative to the row's input norm).
//
// Deliberate deviation from kvpress: the chat-template prefix (system turn) is protected like the original
// KVzip code does, instead of being force-evicted because it is never scored (docs/ALGORITHMS.md §2.3).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "chat/chat_prompt.h"
#include "common/fp16.h"
#include "kernels/thread_pool.h"
#include "kvzap/error.h"
#include "press/kvzip.h"
#include "press/press.h"

namespace kvzap {

namespace {

constexpr int kSinks = 4;
constexpr int kChunk = 2048;
constexpr int kPrevTail = 8;

}  // namespace

KvzipScorer::KvzipScorer(const Model& model, bool plus) : model_(model), plus_(plus) {}

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
  KvCache& cache = ctx.cache;
  const ModelConfig& c = model_.config();
  const Tokenizer& tok = model_.tokenizer();
  const std::vector<int32_t>& ids = ctx.context_ids;
  const int64_t n_ctx = (int64_t)ids.size();
  if (plus_ && !norms_) norms_ = std::make_unique<OutputNorms>(model_);

  // Template pieces around the user content: the prefix is protected, the suffix (end of user turn +
  // assistant header) follows each repeat instruction.
  const ChatPrompt prompt(tok);
  const ChatPrompt::UserTurn turn = prompt.user_turn(ChatOptions{true, false});
  const std::vector<int32_t> prefix = prompt.encode(turn.prefix);
  const std::vector<int32_t> suffix = tok.encode(turn.suffix, false, true);
  int64_t start = 0;
  if ((int64_t)prefix.size() <= n_ctx && std::equal(prefix.begin(), prefix.end(), ids.begin())) start = (int64_t)prefix.size();
  protected_ = std::max<int64_t>(start, std::min<int64_t>(kSinks, n_ctx));

  // Sliding-window layers are not judged (their entries score +inf): the repeat pass cannot reach the
  // first copy of a token from its second copy through a window, so their KVzip score is undefined.
  out.assign(c.n_layer, std::vector<std::vector<float>>(c.n_head_kv));
  for (int l = 0; l < c.n_layer; l++)
    for (int h = 0; h < c.n_head_kv; h++) {
      if (!judged_layer(cache, l)) {
        out[l][h].assign((size_t)cache.length(l, h), std::numeric_limits<float>::infinity());
        continue;
      }
      if (cache.length(l, h) != n_ctx) throw Error("KVzip needs the full context in the cache before scoring");
      out[l][h].assign((size_t)n_ctx, 0.0f);
      for (int64_t i = 0; i < protected_; i++) out[l][h][i] = std::numeric_limits<float>::infinity();
    }

  for (int64_t c0 = start, c1 = 0; c0 < n_ctx; c0 = c1) {
    std::vector<int32_t> prev_tail;
    if (c0 > start) prev_tail.assign(ids.begin() + (c0 - kPrevTail), ids.begin() + c0);
    std::vector<int32_t> input = repeat_prompt(prev_tail, c0 == start);
    input.insert(input.end(), suffix.begin(), suffix.end());
    // kvpress repeats 2048 context tokens per pass. Where one forward step takes fewer tokens (the
    // server's --batch), the chunk shrinks to fit it: smaller chunks, same scoring, no refusal.
    const int64_t overhead = (int64_t)input.size();
    const int64_t chunk = std::min<int64_t>(kChunk, ctx.runner.max_step_tokens() - overhead);
    if (chunk < kPrevTail)
      throw Error("KVzip scoring needs a batch of at least " + std::to_string(overhead + kPrevTail) + " tokens; raise -b");
    c1 = std::min(n_ctx, c0 + chunk);
    input.insert(input.end(), ids.begin() + c0, ids.begin() + c1);
    const int64_t n_in = (int64_t)input.size();
    if (n_ctx + n_in > ctx.runner.n_ctx())
      throw Error("KVzip scoring needs " + std::to_string(n_ctx + n_in) + " tokens of context (context + repeat input); raise -c");
    ChunkObserver obs(*this, out, c0, c1, n_ctx, n_in);
    obs.pool_ptr = &ctx.runner.threads();
    obs.dump = dump_layer_ >= 0 && c0 == start;
    // The repeat pass runs on a scratch fork: the sequence's own cache is never written.
    ctx.runner.run_on_scratch_fork(cache, input.data(), n_in, obs);
  }
}

void KvzipScorer::ChunkObserver::after_attention(const LayerStep& st, KvCache& cache) {
  const ModelConfig& c = sc.model_.config();
  const int D = c.head_dim, H = c.n_head, Hkv = c.n_head_kv, G = c.n_group();
  const int l = st.layer;
  if (!judged_layer(cache, l)) return;  // see score_context
  const int64_t ns = std::min<int64_t>(kSinks, c0);  // sink keys before the chunk
  const int64_t m = c1 - c0;
  const int64_t nk = ns + m + n_in;  // reduced key set: sinks | chunk | own input
  ThreadPool& pool = *pool_ptr;
  const bool dumping = dump && l == sc.dump_layer_;

  // Row factors 1/||h_j|| of the repeat input (KVzip+).
  std::vector<float> inv_hnorm;
  if (sc.plus_) {
    inv_hnorm.resize((size_t)n_in);
    inverse_row_norms(st.h, n_in, c.n_embd, inv_hnorm.data());
  }
  std::vector<std::vector<float>> dump_k, dump_v, dump_s;
  std::vector<float> kt((size_t)nk * D), vchunk((size_t)m * D), vnorm, scores((size_t)m), row((size_t)D);
  if (sc.plus_) vnorm.resize((size_t)G * m);
  auto slot_of = [&](int64_t i) { return i < ns ? i : (i < ns + m ? c0 + (i - ns) : n_ctx + (i - ns - m)); };
  for (int hk = 0; hk < Hkv; hk++) {
    // Keys of the reduced set transposed [D][nk]; values of the chunk [m][D] (all in f32).
    for (int64_t i = 0; i < nk; i++) {
      cache.key_row(l, hk, slot_of(i), row.data());
      for (int d = 0; d < D; d++) kt[(size_t)d * nk + i] = row[(size_t)d];
    }
    for (int64_t i = 0; i < m; i++) cache.value_row(l, hk, c0 + i, &vchunk[(size_t)i * D]);
    // vnorm[g][i] = ||W_O^(q) v_i|| for the chunk columns only (the only ones scored).
    if (sc.plus_)
      pool.parallel_for(G, [&](int64_t g, int) {
        sc.norms_->norms(l, hk * G + (int)g, vchunk.data(), D, m, &vnorm[(size_t)g * m]);
      });
    ColumnMaxProblem p;
    p.q = st.q + (size_t)hk * G * D;
    p.q_row_stride = (int64_t)H * D;
    p.q_head_stride = D;
    p.n_rows = n_in;
    p.n_group = G;
    p.head_dim = D;
    p.keys_t = kt.data();
    p.n_keys = nk;
    p.visible0 = ns + m + 1;  // causal only inside the input block
    p.col0 = ns;
    p.n_cols = m;
    p.row_scale = sc.plus_ ? inv_hnorm.data() : nullptr;
    p.col_scale = sc.plus_ ? vnorm.data() : nullptr;
    p.logit_scale = c.query_scale();  // Gemma's query_pre_attn_scalar where the file sets one
    attention_column_max(p, pool, sc.ws_, scores.data());
    std::vector<float>& dst = out[l][hk];
    for (int64_t i = 0; i < m; i++)
      if (!std::isinf(dst[c0 + i])) dst[c0 + i] = scores[i];
    if (dumping) {
      std::vector<float> keys((size_t)nk * D), values((size_t)nk * D);
      for (int64_t i = 0; i < nk; i++) {
        cache.key_row(l, hk, slot_of(i), &keys[(size_t)i * D]);
        cache.value_row(l, hk, slot_of(i), &values[(size_t)i * D]);
      }
      dump_k.push_back(std::move(keys));
      dump_v.push_back(std::move(values));
      dump_s.push_back(scores);
    }
  }
  if (dumping) sc.write_dump(st, ns, m, n_in, c0, c1, dump_k, dump_v, dump_s);
}

void KvzipScorer::write_dump(const LayerStep& st, int64_t ns, int64_t m, int64_t n_in, int64_t c0, int64_t c1,
                             const std::vector<std::vector<float>>& keys, const std::vector<std::vector<float>>& values,
                             const std::vector<std::vector<float>>& scores) const {
  namespace fs = std::filesystem;
  const ModelConfig& c = model_.config();
  const int64_t D = c.head_dim, H = c.n_head, Hkv = c.n_head_kv, E = c.n_embd, nk = ns + m + n_in;
  const fs::path dir(dump_dir_);
  auto cat = [&](const std::vector<std::vector<float>>& parts) {
    std::vector<float> all;
    for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
    return all;
  };
  write_npy_f32((dir / "q.npy").string(), st.q, {n_in, H, D});
  write_npy_f32((dir / "h.npy").string(), st.h, {n_in, E});
  write_npy_f32((dir / "keys.npy").string(), cat(keys).data(), {Hkv, nk, D});
  write_npy_f32((dir / "values.npy").string(), cat(values).data(), {Hkv, nk, D});
  write_npy_f32((dir / "scores.npy").string(), cat(scores).data(), {Hkv, m});
  const WeightMatrix& wo = model_.weights().layers[st.layer].wo;
  std::vector<float> w((size_t)(E * H * D));
  for (int64_t e = 0; e < E; e++) dequantize_row(wo.type, wo.data + (size_t)e * wo.row_stride, &w[(size_t)(e * H * D)], H * D);
  write_npy_f32((dir / "wo.npy").string(), w.data(), {E, H * D});
  nlohmann::json meta = {{"layer", st.layer}, {"plus", plus_}, {"n_sinks", ns}, {"chunk_start", c0}, {"chunk_end", c1},
                         {"n_in", n_in}, {"n_keys", nk}, {"head_dim", D}, {"n_head", H}, {"n_head_kv", Hkv},
                         {"n_embd", E}, {"key_order", "sinks | chunk | repeat input"}};
  std::ofstream f(dir / "meta.json");
  f << meta.dump(2) << "\n";
  if (!f) throw Error((dir / "meta.json").string() + ": write failed");
}

namespace {
RegisterScorer reg_kvzip({"kvzip", "KVzip: attention paid by a repeat-the-context pass (oracle, ~2x prefill cost)", false,
                          [](const PressSpec&, const Model& m) { return std::make_unique<KvzipScorer>(m, false); },
                          {.kvpress_ratio_scope = "global", .repeats_context = true,
                           .kvpress_parity = "exact where the template prefix has <= 4 tokens; kvzap protects a longer one (ALGORITHMS.md 2.3)"}});
RegisterScorer reg_kvzip_plus({"kvzip+", "KVzip+: KVzip weighted by ||W_O v|| / ||h|| (the target KVzap learns)", false,
                               [](const PressSpec&, const Model& m) { return std::make_unique<KvzipScorer>(m, true); },
                               {.kvpress_ratio_scope = "global", .repeats_context = true,
                                .kvpress_parity = "exact where the template prefix has <= 4 tokens; kvzap protects a longer one (ALGORITHMS.md 2.3)"}});
}  // namespace

}  // namespace kvzap
