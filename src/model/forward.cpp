#include "model/forward.h"

#include <algorithm>
#include <cmath>

#include "common/fp16.h"
#include "model/attention.h"
#include "model/blocks.h"

namespace kvzap {

namespace {
constexpr int kQueryBlock = 16;  // query tokens per attention task (rows = group size x this)
}

Forward::Forward(const Model& model, int64_t max_batch, int64_t max_ctx, ThreadPool& pool)
    : model_(model), cfg_(model.config()), pool_(pool), max_batch_(max_batch), max_ctx_(max_ctx) {
  if (cfg_.head_dim % 16 != 0) throw Error("head dimension " + std::to_string(cfg_.head_dim) + " is not a multiple of 16");
  rope_cos_.resize((size_t)max_ctx * cfg_.head_dim / 2);
  rope_sin_.resize((size_t)max_ctx * cfg_.head_dim / 2);
  rope_table(max_ctx, cfg_.head_dim, cfg_.rope_base, cfg_.rope_freq_scale, rope_cos_.data(), rope_sin_.data());
  ensure_batch(std::min<int64_t>(max_batch, 64));
  att_rows_ = (int64_t)cfg_.n_group() * kQueryBlock;
  att_scores_.resize(pool.size());
  att_kv_.resize(pool.size());
  att_q_.resize(pool.size());
  att_out_.resize(pool.size());
  att_visible_.resize(pool.size());
  for (int t = 0; t < pool.size(); t++) {
    att_scores_[t].resize((size_t)att_rows_ * max_ctx);
    att_kv_[t].resize((size_t)KvCache::kPageTokens * cfg_.head_dim);
    att_q_[t].resize((size_t)att_rows_ * cfg_.head_dim);
    att_out_[t].resize((size_t)att_rows_ * cfg_.head_dim);
    att_visible_[t].resize((size_t)att_rows_);
  }
}

void Forward::ensure_batch(int64_t n) {
  if (n <= batch_capacity_) return;
  const int64_t B = std::min(max_batch_, std::max(n, batch_capacity_ * 2)), E = cfg_.n_embd,
                Dq = (int64_t)cfg_.n_head * cfg_.head_dim, Dkv = (int64_t)cfg_.n_head_kv * cfg_.head_dim, F = cfg_.n_ff;
  x_.resize(B * E);
  xn_.resize(B * E);
  q_.resize(B * Dq);
  k_.resize(B * Dkv);
  v_.resize(B * Dkv);
  attn_.resize(B * Dq);
  proj_.resize(B * E);
  gate_.resize(B * F);
  up_.resize(B * F);
  pos_.resize(B);
  mm_scratch_.reserve(B, std::max<int64_t>(std::max<int64_t>(E, F), Dq));
  batch_capacity_ = B;
}

void Forward::run(const int32_t* tokens, int64_t n, KvCache& cache, LogitsMode mode, float* logits,
                  LayerObserver* observer) {
  if (n <= 0) return;
  if (cache.n_past() + n > max_ctx_)
    throw Error("context overflow: " + std::to_string(cache.n_past() + n) + " tokens exceed the context size of " +
                std::to_string(max_ctx_));
  for (int64_t i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= cfg_.n_vocab) throw Error("token id " + std::to_string(tokens[i]) + " is out of range");
  for (int64_t done = 0; done < n;) {
    const int64_t m = std::min(max_batch_, n - done);
    const bool last_chunk = done + m == n;
    LogitsMode chunk_mode = mode == LogitsMode::All ? LogitsMode::All : (last_chunk ? mode : LogitsMode::None);
    float* out = mode == LogitsMode::All ? logits + done * cfg_.n_vocab : logits;
    step(tokens + done, m, cache, chunk_mode, out, observer);
    done += m;
  }
}

void Forward::step(const int32_t* tokens, int64_t n, KvCache& cache, LogitsMode mode, float* logits,
                   LayerObserver* observer) {
  const ModelWeights& w = model_.weights();
  const int64_t E = cfg_.n_embd, D = cfg_.head_dim, H = cfg_.n_head, Hkv = cfg_.n_head_kv;
  const int64_t Dq = H * D, Dkv = Hkv * D, F = cfg_.n_ff;
  ensure_batch(n);
  const int64_t pos0 = cache.n_past();
  for (int64_t t = 0; t < n; t++) pos_[t] = (int32_t)(pos0 + t);

  // Embedding rows.
  pool_.parallel_for(n, [&](int64_t t, int) {
    dequantize_row(w.token_embd.type, w.token_embd.data + (size_t)tokens[t] * w.token_embd.row_stride, &x_[t * E], E);
  });

  for (int l = 0; l < cfg_.n_layer; l++) {
    const LayerWeights& L = w.layers[l];
    pool_.parallel_for(n, [&](int64_t t, int) { rmsnorm(&x_[t * E], L.attn_norm, &xn_[t * E], E, cfg_.rms_eps); });
    matmul(L.wq, xn_.data(), n, q_.data(), pool_, mm_scratch_);
    matmul(L.wk, xn_.data(), n, k_.data(), pool_, mm_scratch_);
    matmul(L.wv, xn_.data(), n, v_.data(), pool_, mm_scratch_);
    pool_.parallel_for(n, [&](int64_t t, int) {
      float* q = &q_[t * Dq];
      float* k = &k_[t * Dkv];
      float* v = &v_[t * Dkv];
      if (L.bq) {
        for (int64_t i = 0; i < Dq; i++) q[i] += L.bq[i];
        for (int64_t i = 0; i < Dkv; i++) k[i] += L.bk[i];
        for (int64_t i = 0; i < Dkv; i++) v[i] += L.bv[i];
      }
      if (L.q_norm) {
        for (int64_t h = 0; h < H; h++) rmsnorm(q + h * D, L.q_norm, q + h * D, D, cfg_.rms_eps);
        for (int64_t h = 0; h < Hkv; h++) rmsnorm(k + h * D, L.k_norm, k + h * D, D, cfg_.rms_eps);
      }
      const float* c = rope_cos(pos_[t]);
      const float* s = rope_sin(pos_[t]);
      for (int64_t h = 0; h < H; h++) rope_apply(q + h * D, c, s, (int)D, cfg_.rope_mode);
      for (int64_t h = 0; h < Hkv; h++) rope_apply(k + h * D, c, s, (int)D, cfg_.rope_mode);
    });
    cache.append_layer(l, n, k_.data(), v_.data(), pos_.data());
    attention(l, n, cache);
    if (observer) {
      LayerStep st;
      st.layer = l;
      st.n_tok = n;
      st.pos = pos_.data();
      st.h = xn_.data();
      st.q = q_.data();
      st.k = k_.data();
      st.v = v_.data();
      st.pool = &pool_;
      cache.set_n_past(pos0 + n);  // observers see the sequence length including this step
      observer->after_attention(st, cache);
    }
    matmul(L.wo, attn_.data(), n, proj_.data(), pool_, mm_scratch_);
    pool_.parallel_for(n, [&](int64_t t, int) {
      float* x = &x_[t * E];
      const float* p = &proj_[t * E];
      for (int64_t i = 0; i < E; i++) x[i] += p[i];
      rmsnorm(x, L.ffn_norm, &xn_[t * E], E, cfg_.rms_eps);
    });
    matmul(L.gate, xn_.data(), n, gate_.data(), pool_, mm_scratch_);
    matmul(L.up, xn_.data(), n, up_.data(), pool_, mm_scratch_);
    pool_.parallel_for(n, [&](int64_t t, int) { swiglu(&gate_[t * F], &up_[t * F], F); });
    matmul(L.down, gate_.data(), n, proj_.data(), pool_, mm_scratch_);
    pool_.parallel_for(n, [&](int64_t t, int) {
      float* x = &x_[t * E];
      const float* p = &proj_[t * E];
      for (int64_t i = 0; i < E; i++) x[i] += p[i];
    });
  }
  cache.set_n_past(pos0 + n);

  if (mode == LogitsMode::None) return;
  const int64_t first = mode == LogitsMode::Last ? n - 1 : 0;
  const int64_t rows = n - first;
  for (int64_t t = first; t < n; t++) rmsnorm(&x_[t * E], w.output_norm, &xn_[(t - first) * E], E, cfg_.rms_eps);
  matmul(w.output, xn_.data(), rows, logits, pool_, mm_scratch_);
}

void Forward::attention(int layer, int64_t n, KvCache& cache) {
  const int64_t D = cfg_.head_dim, H = cfg_.n_head, Hkv = cfg_.n_head_kv, G = cfg_.n_group();
  const float scale = 1.0f / std::sqrt((float)D);
  const int64_t n_blocks = (n + kQueryBlock - 1) / kQueryBlock;
  // Decode has one block per KV head: too few tasks for the threads, so split each group by query head
  // (the head's pages stay in cache between the group's tasks).
  const int64_t g_split = Hkv * n_blocks < 4 * pool_.size() ? G : 1;
  const int64_t g_per_task = G / g_split;
  pool_.parallel_for(Hkv * g_split * n_blocks, [&](int64_t task, int tid) {
    const int64_t blk = task % n_blocks, hk = task / n_blocks / g_split;
    const int64_t g0 = (task / n_blocks % g_split) * g_per_task, g1 = g0 + g_per_task;
    const int64_t t0 = blk * kQueryBlock, t1 = std::min(n, t0 + kQueryBlock);
    const int64_t n_old = cache.length(layer, (int)hk) - n;  // entries kept before this step
    // Gather the block's query rows, ordered (token, group head), scaled so dots are logits.
    float* qb = att_q_[tid].data();    // [rows][D]
    float* ob = att_out_[tid].data();  // [rows][D]
    int64_t* visible = att_visible_[tid].data();
    int rows = 0;
    for (int64_t t = t0; t < t1; t++)
      for (int64_t g = g0; g < g1; g++, rows++) {
        const float* src = &q_[(t * H + hk * G + g) * D];
        // Queries are rounded to f16 like llama.cpp does before its f16 K dot products.
        for (int64_t i = 0; i < D; i++) qb[rows * D + i] = fp16_to_fp32(fp32_to_fp16(src[i])) * scale;
        visible[rows] = n_old + t + 1;  // causal: old entries plus new tokens up to t
      }
    AttentionBlock b{qb, D, rows, visible, ob, D, /*f16_probs=*/true};
    attend(b, cache, layer, (int)hk, att_scores_[tid].data(), att_kv_[tid].data());
    rows = 0;
    for (int64_t t = t0; t < t1; t++)
      for (int64_t g = g0; g < g1; g++, rows++)
        std::copy(ob + rows * D, ob + (rows + 1) * D, &attn_[(t * H + hk * G + g) * D]);
  });
}

}  // namespace kvzap
