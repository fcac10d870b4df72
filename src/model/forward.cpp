#include "model/forward.h"

#include <algorithm>
#include <cmath>

#include "common/fp16.h"
#include "model/attention.h"
#include "model/blocks.h"

namespace kvzap {

namespace {
constexpr int kQueryBlock = 16;  // query tokens per attention task (rows = group size x this)
// Split attention is used for decode steps of at most this many tasks per thread (more tasks balance
// the threads by themselves) ...
constexpr int64_t kMaxSplitTasksPerThread = 4;
// ... in layers whose longest stream has at least this many chunks (shorter ones are not worth the
// extra synchronisation).
constexpr int64_t kMinSplitChunks = 2;
// Work units per task and thread in each split phase (dynamic scheduling evens out pruned streams of
// different lengths).
constexpr int64_t kSplitUnitsPerThread = 2;
}

Forward::Forward(const Model& model, int64_t max_batch, int64_t max_ctx, ThreadPool& pool)
    : model_(model), cfg_(model.config()), pool_(pool), max_batch_(max_batch), max_ctx_(max_ctx) {
  if (cfg_.head_dim % 16 != 0) throw Error("head dimension " + std::to_string(cfg_.head_dim) + " is not a multiple of 16");
  if ((int)cfg_.layers.size() != cfg_.n_layer) throw Error("internal: the model config has no per-layer settings");
  auto table_for = [&](float base, float scale) {
    for (size_t i = 0; i < rope_tables_.size(); i++)
      if (rope_tables_[i].base == base && rope_tables_[i].freq_scale == scale) return (int)i;
    RopeTable t{base, scale, std::vector<float>((size_t)max_ctx * cfg_.head_dim / 2),
                std::vector<float>((size_t)max_ctx * cfg_.head_dim / 2)};
    rope_table(max_ctx, cfg_.head_dim, base, scale, t.cos.data(), t.sin.data(),
               cfg_.rope_freq_factors.empty() ? nullptr : cfg_.rope_freq_factors.data());
    rope_tables_.push_back(std::move(t));
    return (int)rope_tables_.size() - 1;
  };
  table_for(cfg_.rope_base, cfg_.rope_freq_scale);
  for (const LayerConfig& lc : cfg_.layers) layer_rope_.push_back(table_for(lc.rope_base, lc.rope_freq_scale));
  if (cfg_.has_sliding_layers())
    for (const LayerConfig& lc : cfg_.layers) windows_.push_back(lc.sliding_window);
  ensure_batch(std::min<int64_t>(max_batch, 64));
  att_rows_ = (int64_t)cfg_.n_group() * kQueryBlock;
  att_scores_.resize(pool.size());
  att_kv_.resize(pool.size());
  att_q_.resize(pool.size());
  att_out_.resize(pool.size());
  att_visible_.resize(pool.size());
  att_first_.resize(pool.size());
  att_partial_.resize(pool.size());
  for (int t = 0; t < pool.size(); t++) {
    att_first_[t].resize((size_t)att_rows_);
    att_scores_[t].resize((size_t)att_rows_ * max_ctx);
    att_kv_[t].resize((size_t)KvCache::kPageTokens * cfg_.head_dim);
    att_q_[t].resize((size_t)att_rows_ * cfg_.head_dim);
    att_out_[t].resize((size_t)att_rows_ * cfg_.head_dim);
    att_visible_[t].resize((size_t)att_rows_);
    att_partial_[t].resize((size_t)att_rows_ * cfg_.head_dim);
  }
  const int64_t G = cfg_.n_group(), D = cfg_.head_dim;
  const int64_t split_tasks = kMaxSplitTasksPerThread * pool.size();
  const int64_t chunk_entries = (int64_t)kAttentionChunkPages * KvCache::kPageTokens;
  split_max_chunks_ = (max_ctx + chunk_entries - 1) / chunk_entries + 1;
  if (pool.size() > 1) {
    split_q_.resize((size_t)(split_tasks * G * D));
    split_visible_.resize((size_t)(split_tasks * G));
    split_first_.resize((size_t)(split_tasks * G));
    split_scores_.resize((size_t)(split_tasks * G * max_ctx));
    split_partials_.resize((size_t)(split_tasks * split_max_chunks_ * G * D));
    split_out_.resize((size_t)(split_tasks * G * D));
    split_blocks_.resize((size_t)split_tasks);
    split_extents_.resize((size_t)split_tasks);
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
  for (int64_t done = 0; done < n;) {
    const int64_t m = std::min(max_batch_, n - done);
    const bool last_chunk = done + m == n;
    ForwardSegment seg;
    seg.cache = &cache;
    seg.tokens = tokens + done;
    seg.n = m;
    seg.observer = observer;
    seg.mode = mode == LogitsMode::All ? LogitsMode::All : (last_chunk ? mode : LogitsMode::None);
    seg.logits = mode == LogitsMode::All ? logits + done * cfg_.n_vocab : logits;
    step_batch(&seg, 1);
    done += m;
  }
}

void Forward::replay_step(const RecordedStep& rs, KvCache& cache, LayerObserver* observer) {
  const int64_t n = rs.n_tok;
  if (n <= 0 || (int64_t)rs.pos.size() != n || (int64_t)rs.layers.size() != cfg_.n_layer)
    throw Error("internal: malformed recorded step");
  if (rs.pos[0] != cache.n_past()) throw Error("internal: a recorded step that does not continue the cache");
  if (cache.n_past() + n > max_ctx_)
    throw Error("context overflow: " + std::to_string(cache.n_past() + n) + " tokens exceed the context size of " +
                std::to_string(max_ctx_));
  if (cache.layer_windows() != windows_) cache.set_layer_windows(windows_);
  for (int l = 0; l < cfg_.n_layer; l++) {
    const RecordedStep::Layer& L = rs.layers[(size_t)l];
    cache.append_layer(l, n, L.k.data(), L.v.data(), rs.pos.data());
    if (observer) {
      LayerStep st;
      st.layer = l;
      st.n_tok = n;
      st.pos = rs.pos.data();
      st.h = L.h.data();
      st.q = L.q.data();
      st.k = L.k.data();
      st.v = L.v.data();
      st.pool = &pool_;
      // The read-out over blocks of up to 8 rows, as step_batch runs it (a row's result does not depend
      // on its block: Surrogate.LinearAndMlpPredictMatchReference).
      if (const int dim = observer->h_readout_dim(l); dim > 0) {
        if ((int64_t)readout_.size() < n * dim) readout_.resize((size_t)(n * dim));
        const int64_t E = cfg_.n_embd;
        pool_.parallel_ranges(n, [&](int64_t t0, int64_t t1, int) {
          for (int64_t b0 = t0; b0 < t1; b0 += 8)
            observer->h_readout(l, &L.h[(size_t)(b0 * E)], std::min<int64_t>(8, t1 - b0), &readout_[(size_t)(b0 * dim)]);
        });
        st.h_readout = readout_.data();
      }
      cache.set_n_past(rs.pos[0] + n);
      observer->after_attention(st, cache);
    }
    if (cfg_.layers[(size_t)l].is_sliding()) cache.drop_outside_window(l, rs.pos[0] + n);
  }
  cache.set_n_past(rs.pos[0] + n);
}

void Forward::step_batch(const ForwardSegment* segs, int n_segs) {
  const int64_t n = check_step(segs, n_segs);
  if (n == 0) return;
  lay_out_rows(segs, n_segs, n);
  plan_attention(segs, n_segs);
  embed_rows(segs, n_segs, n);
  for (int l = 0; l < cfg_.n_layer; l++) {
    attention_block(l, segs, n_segs, n);
    ffn_block(l, n);
  }
  for (int s = 0; s < n_segs; s++) segs[s].cache->set_n_past(pos_[seg_row0_[s]] + segs[s].n);
  write_logits(segs, n_segs);
}

int64_t Forward::check_step(const ForwardSegment* segs, int n_segs) {
  int64_t n = 0;
  for (int s = 0; s < n_segs; s++) {
    const ForwardSegment& sg = segs[s];
    if (sg.n <= 0 || !sg.cache || !sg.tokens) throw Error("internal: empty forward segment");
    if (sg.cache->n_past() + sg.n > max_ctx_)
      throw Error("context overflow: " + std::to_string(sg.cache->n_past() + sg.n) +
                  " tokens exceed the context size of " + std::to_string(max_ctx_));
    for (int64_t i = 0; i < sg.n; i++)
      if (sg.tokens[i] < 0 || sg.tokens[i] >= cfg_.n_vocab)
        throw Error("token id " + std::to_string(sg.tokens[i]) + " is out of range");
    if (sg.mode != LogitsMode::None && !sg.logits) throw Error("internal: forward segment without a logits buffer");
    if (sg.cache->layer_windows() != windows_) sg.cache->set_layer_windows(windows_);
    n += sg.n;
  }
  if (n > max_batch_) throw Error("internal: a step of " + std::to_string(n) + " tokens exceeds the batch size");
  return n;
}

void Forward::lay_out_rows(const ForwardSegment* segs, int n_segs, int64_t n) {
  ensure_batch(n);
  if (seg_row0_.size() < (size_t)n_segs) {
    seg_row0_.resize((size_t)n_segs);
    readout_dim_.resize((size_t)n_segs);
    readout_at_.resize((size_t)n_segs);
  }
  for (int s = 0, row = 0; s < n_segs; s++) {
    seg_row0_[s] = row;
    const int64_t pos0 = segs[s].cache->n_past();
    for (int64_t t = 0; t < segs[s].n; t++) pos_[row + t] = (int32_t)(pos0 + t);
    row += (int)segs[s].n;
  }
}

// Attention tasks, the same for every layer. Decode steps of few sequences have too few tasks for the
// threads, so a KV head's query heads may be split into g_split tasks (the head's pages stay in cache
// between them). Splitting balances the threads but converts each K/V page once per task instead of
// once for the whole group: pick the divisor of G with the least modelled time, where a task over
// `rows` query rows costs (one page conversion + rows * per-row work) and tasks run in rounds of
// n_threads. A row's result does not depend on which rows share its task.
void Forward::plan_attention(const ForwardSegment* segs, int n_segs) {
  const int64_t G = cfg_.n_group(), Hkv = cfg_.n_head_kv;
  int64_t n_blocks = 0;
  for (int s = 0; s < n_segs; s++) n_blocks += (segs[s].n + kQueryBlock - 1) / kQueryBlock;
  const int64_t nth = pool_.size();
  int64_t g_split = 1;
  double best_cost = 1e300;
  for (int64_t gs = 1; gs <= G; gs++) {
    if (G % gs) continue;
    const int64_t tasks = Hkv * n_blocks * gs, rounds = (tasks + nth - 1) / nth;
    const double cost = (double)rounds * (1.0 + 1.5 * (double)(G / gs));  // conversion : per-row work
    if (cost < best_cost) best_cost = cost, g_split = gs;
  }
  const int64_t g_per = G / g_split;
  att_tasks_.clear();
  for (int s = 0; s < n_segs; s++)
    for (int64_t hk = 0; hk < Hkv; hk++)
      for (int64_t gs = 0; gs < g_split; gs++)
        for (int64_t t0 = 0; t0 < segs[s].n; t0 += kQueryBlock)
          att_tasks_.push_back({s, (int32_t)hk, (int32_t)(gs * g_per), (int32_t)((gs + 1) * g_per), t0,
                                std::min<int64_t>(segs[s].n, t0 + kQueryBlock)});
  bool decode_only = true;
  for (int s = 0; s < n_segs; s++) decode_only = decode_only && segs[s].n == 1;
  att_split_step_ = decode_only && nth > 1 && (int64_t)att_tasks_.size() <= kMaxSplitTasksPerThread * nth &&
                    !split_blocks_.empty();
}

void Forward::embed_rows(const ForwardSegment* segs, int n_segs, int64_t n) {
  const WeightMatrix& embd = model_.weights().token_embd;
  const int64_t E = cfg_.n_embd;
  pool_.parallel_for(n, [&](int64_t t, int) {
    int32_t tok = 0;
    for (int s = n_segs - 1; s >= 0; s--)
      if (t >= seg_row0_[s]) {
        tok = segs[s].tokens[t - seg_row0_[s]];
        break;
      }
    dequantize_row(embd.type, embd.data + (size_t)tok * embd.row_stride, &x_[t * E], E);
    if (cfg_.embd_scale != 1.0f)
      for (int64_t i = 0; i < E; i++) x_[t * E + i] *= cfg_.embd_scale;
  });
}

// Norm (with the observers' read-outs), Q/K/V, RoPE, the K/V append, attention, the observers, the
// sliding-window frees, the output projection into the residual stream, and the FFN norm into xn_.
void Forward::attention_block(int l, const ForwardSegment* segs, int n_segs, int64_t n) {
  const LayerWeights& L = model_.weights().layers[l];
  const int64_t E = cfg_.n_embd, D = cfg_.head_dim, H = cfg_.n_head, Hkv = cfg_.n_head_kv;
  const int64_t Dq = H * D, Dkv = Hkv * D;
  // Observers' read-outs of h: segment s's rows at readout_[readout_at_[s] ..], [n][readout_dim_[s]].
  int64_t readout_total = 0;
  for (int s = 0; s < n_segs; s++) {
    readout_dim_[s] = segs[s].observer ? segs[s].observer->h_readout_dim(l) : 0;
    readout_at_[s] = readout_total;
    readout_total += segs[s].n * readout_dim_[s];
  }
  if ((int64_t)readout_.size() < readout_total) readout_.resize((size_t)readout_total);  // grows once
  // Contiguous rows per thread: read-out rows are a few floats, and neighbours written by different
  // threads would share cache lines. The read-out runs on blocks of up to kReadoutRows rows of one
  // segment, right after their norm.
  pool_.parallel_ranges(n, [&](int64_t t0, int64_t t1, int) {
    constexpr int64_t kReadoutRows = 8;
    for (int64_t b0 = t0; b0 < t1;) {
      int s = n_segs - 1;
      while (b0 < seg_row0_[s]) s--;
      const int64_t b1 = std::min({t1, b0 + kReadoutRows, seg_row0_[s] + segs[s].n});
      for (int64_t t = b0; t < b1; t++) rmsnorm(&x_[t * E], L.attn_norm, &xn_[t * E], E, cfg_.rms_eps);
      if (readout_dim_[s] > 0)
        segs[s].observer->h_readout(l, &xn_[b0 * E], b1 - b0,
                                    &readout_[readout_at_[s] + (b0 - seg_row0_[s]) * readout_dim_[s]]);
      b0 = b1;
    }
  });
  {
    const WeightMatrix* ws[3] = {&L.wq, &L.wk, &L.wv};
    float* ys[3] = {q_.data(), k_.data(), v_.data()};
    matmul_group(ws, ys, 3, xn_.data(), n, pool_, mm_scratch_);
  }
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
    const float* c = rope_cos(pos_[t], l);
    const float* s = rope_sin(pos_[t], l);
    for (int64_t h = 0; h < H; h++) rope_apply(q + h * D, c, s, (int)D, cfg_.rope_mode);
    for (int64_t h = 0; h < Hkv; h++) rope_apply(k + h * D, c, s, (int)D, cfg_.rope_mode);
  });
  for (int s = 0; s < n_segs; s++) {
    const int64_t r0 = seg_row0_[s];
    segs[s].cache->append_layer(l, segs[s].n, &k_[r0 * Dkv], &v_[r0 * Dkv], &pos_[r0]);
  }
  attention(l, segs, n_segs);
  for (int s = 0; s < n_segs; s++) {
    if (!segs[s].observer) continue;
    const int64_t r0 = seg_row0_[s];
    LayerStep st;
    st.layer = l;
    st.n_tok = segs[s].n;
    st.pos = &pos_[r0];
    st.h = &xn_[r0 * E];
    st.q = &q_[r0 * Dq];
    st.k = &k_[r0 * Dkv];
    st.v = &v_[r0 * Dkv];
    st.pool = &pool_;
    st.h_readout = readout_dim_[s] > 0 ? &readout_[readout_at_[s]] : nullptr;
    segs[s].cache->set_n_past(pos_[r0] + segs[s].n);  // observers see the sequence length including this step
    segs[s].observer->after_attention(st, *segs[s].cache);
  }
  // Sliding-window layer: free what no later query of the sequence can see.
  if (cfg_.layers[(size_t)l].is_sliding())
    for (int s = 0; s < n_segs; s++) segs[s].cache->drop_outside_window(l, pos_[seg_row0_[s]] + segs[s].n);
  matmul(L.wo, attn_.data(), n, proj_.data(), pool_, mm_scratch_);
  pool_.parallel_for(n, [&](int64_t t, int) {
    float* x = &x_[t * E];
    float* p = &proj_[t * E];
    if (L.attn_post_norm) rmsnorm(p, L.attn_post_norm, p, E, cfg_.rms_eps);
    for (int64_t i = 0; i < E; i++) x[i] += p[i];
    rmsnorm(x, L.ffn_norm, &xn_[t * E], E, cfg_.rms_eps);
  });
}

// Gate/up, the activation, down, into the residual stream (xn_ holds the FFN norm's output).
void Forward::ffn_block(int l, int64_t n) {
  const LayerWeights& L = model_.weights().layers[l];
  const int64_t E = cfg_.n_embd, F = cfg_.n_ff;
  {
    const WeightMatrix* ws[2] = {&L.gate, &L.up};
    float* ys[2] = {gate_.data(), up_.data()};
    matmul_group(ws, ys, 2, xn_.data(), n, pool_, mm_scratch_);
  }
  if (cfg_.ffn_act == FfnActivation::GeluTanh)
    pool_.parallel_for(n, [&](int64_t t, int) { geglu(&gate_[t * F], &up_[t * F], F); });
  else if (cfg_.ffn_act == FfnActivation::GeluTanhF16)
    pool_.parallel_for(n, [&](int64_t t, int) { geglu_f16_table(&gate_[t * F], &up_[t * F], F); });
  else
    pool_.parallel_for(n, [&](int64_t t, int) { swiglu(&gate_[t * F], &up_[t * F], F); });
  matmul(L.down, gate_.data(), n, proj_.data(), pool_, mm_scratch_);
  pool_.parallel_for(n, [&](int64_t t, int) {
    float* x = &x_[t * E];
    float* p = &proj_[t * E];
    if (L.ffn_post_norm) rmsnorm(p, L.ffn_post_norm, p, E, cfg_.rms_eps);
    for (int64_t i = 0; i < E; i++) x[i] += p[i];
  });
}

// LM head: segments that want every row one by one (straight into their buffer), then the last rows
// of all Last segments in one matmul.
void Forward::write_logits(const ForwardSegment* segs, int n_segs) {
  const ModelWeights& w = model_.weights();
  const int64_t E = cfg_.n_embd, V = cfg_.n_vocab;
  // Output projection of the `rows` normed rows in xn_, then the final soft-cap if the model has one.
  auto lm_head = [&](int64_t rows, float* out) {
    matmul(w.output, xn_.data(), rows, out, pool_, mm_scratch_);
    if (cfg_.final_logit_softcap > 0)
      pool_.parallel_for(rows, [&](int64_t t, int) { softcap(out + t * V, V, cfg_.final_logit_softcap); });
  };
  for (int s = 0; s < n_segs; s++) {
    if (segs[s].mode != LogitsMode::All) continue;
    const int64_t r0 = seg_row0_[s];
    for (int64_t t = 0; t < segs[s].n; t++) rmsnorm(&x_[(r0 + t) * E], w.output_norm, &xn_[t * E], E, cfg_.rms_eps);
    lm_head(segs[s].n, segs[s].logits);
  }
  last_rows_.clear();
  for (int s = 0; s < n_segs; s++)
    if (segs[s].mode == LogitsMode::Last) last_rows_.push_back((int32_t)(seg_row0_[s] + segs[s].n - 1));
  const int64_t n_last = (int64_t)last_rows_.size();
  if (n_last == 0) return;
  for (int64_t i = 0; i < n_last; i++) rmsnorm(&x_[last_rows_[i] * E], w.output_norm, &xn_[i * E], E, cfg_.rms_eps);
  if (n_last == 1) {
    for (int s = 0; s < n_segs; s++)
      if (segs[s].mode == LogitsMode::Last) lm_head(1, segs[s].logits);
    return;
  }
  if (logits_rows_.size() < (size_t)(n_last * V)) logits_rows_.resize((size_t)(n_last * V));
  lm_head(n_last, logits_rows_.data());
  for (int s = 0, i = 0; s < n_segs; s++)
    if (segs[s].mode == LogitsMode::Last) {
      std::copy(&logits_rows_[(size_t)i * V], &logits_rows_[(size_t)(i + 1) * V], segs[s].logits);
      i++;
    }
}

AttentionBlock Forward::gather_task(int layer, const ForwardSegment* segs, const AttentionTask& tk, float* qb,
                                   int64_t* visible, int64_t* first) const {
  const int64_t D = cfg_.head_dim, H = cfg_.n_head, G = cfg_.n_group();
  const float scale = cfg_.query_scale();
  const bool sliding = cfg_.layers[(size_t)layer].is_sliding();
  const ForwardSegment& sg = segs[tk.seg];
  const int64_t row0 = seg_row0_[tk.seg], hk = tk.hk;
  const KvCache& cache = *sg.cache;
  const int64_t n_old = cache.length(layer, (int)hk) - sg.n;  // entries kept before this step
  // Gather the block's query rows, ordered (token, group head), scaled so dots are logits.
  // An f16 cache rounds queries and probabilities to f16 as llama.cpp does with f16 K/V; an f32 cache
  // keeps both in f32 (as llama.cpp does with f32 K/V), so nothing is rounded but the sums.
  const bool f16 = cache.kv_type() == KvType::F16;
  int rows = 0;
  int64_t lo = 0;  // sliding window: first stream entry inside the window of the current token
  for (int64_t t = tk.t0; t < tk.t1; t++) {
    if (sliding) {  // entries are sorted by position, and the block's tokens are increasing positions
      const int64_t start = cache.window_start(layer, pos_[row0 + t]);
      int64_t hi = n_old + t;
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (cache.position_at(layer, (int)hk, mid) < start) lo = mid + 1; else hi = mid;
      }
    }
    for (int64_t g = tk.g0; g < tk.g1; g++, rows++) {
      const float* qr = &q_[((row0 + t) * H + hk * G + g) * D];
      if (f16) round_rows_f16(qr, qb + rows * D, D, scale);
      else for (int64_t i = 0; i < D; i++) qb[rows * D + i] = qr[i] * scale;
      visible[rows] = n_old + t + 1;  // causal: old entries plus new tokens up to t
      first[rows] = lo;
    }
  }
  return AttentionBlock{qb, D, rows, visible, nullptr, D, /*f16_probs=*/f16, sliding ? first : nullptr};
}

void Forward::scatter_task(const AttentionTask& tk, const float* ob) {
  const int64_t D = cfg_.head_dim, H = cfg_.n_head, G = cfg_.n_group();
  const int64_t row0 = seg_row0_[tk.seg];
  int rows = 0;
  for (int64_t t = tk.t0; t < tk.t1; t++)
    for (int64_t g = tk.g0; g < tk.g1; g++, rows++)
      std::copy(ob + rows * D, ob + (rows + 1) * D, &attn_[((row0 + t) * H + tk.hk * G + g) * D]);
}

void Forward::attention(int layer, const ForwardSegment* segs, int n_segs) {
  (void)n_segs;
  if (att_split_step_) {
    int64_t longest = 0;
    for (const AttentionTask& tk : att_tasks_) longest = std::max(longest, segs[tk.seg].cache->length(layer, tk.hk));
    const int64_t chunk_entries = (int64_t)kAttentionChunkPages * KvCache::kPageTokens;
    if (longest >= kMinSplitChunks * chunk_entries) {
      attention_split(layer, segs);
      return;
    }
  }
  pool_.parallel_for((int64_t)att_tasks_.size(), [&](int64_t task, int tid) {
    const AttentionTask& tk = att_tasks_[(size_t)task];
    AttentionBlock b = gather_task(layer, segs, tk, att_q_[tid].data(), att_visible_[tid].data(), att_first_[tid].data());
    b.out = att_out_[tid].data();  // [rows][D]
    attend(b, *segs[tk.seg].cache, layer, tk.hk, att_scores_[tid].data(), att_kv_[tid].data(),
           att_partial_[tid].data());
    scatter_task(tk, b.out);
  });
}

void Forward::attention_split(int layer, const ForwardSegment* segs) {
  const int64_t D = cfg_.head_dim, G = cfg_.n_group();
  const int64_t T = (int64_t)att_tasks_.size();
  const int64_t S = kSplitUnitsPerThread * pool_.size();  // units per task in the two streaming phases
  for (int64_t t = 0; t < T; t++) {  // gathering is a few rows per task: not worth a phase
    AttentionBlock& b = split_blocks_[(size_t)t];
    b = gather_task(layer, segs, att_tasks_[(size_t)t], &split_q_[(size_t)(t * G * D)], &split_visible_[(size_t)(t * G)],
                    &split_first_[(size_t)(t * G)]);
    b.out = &split_out_[(size_t)(t * G * D)];
    split_extents_[(size_t)t] = attention_extent(b);
  }
  auto scores_of = [&](int64_t t) { return &split_scores_[(size_t)(t * G * max_ctx_)]; };
  // 1. Scores, each task's pages in S ranges.
  pool_.parallel_for(T * S, [&](int64_t u, int tid) {
    const int64_t t = u / S, s = u % S;
    const AttentionExtent& e = split_extents_[(size_t)t];
    const int64_t n = e.n_pages - e.p0;
    const AttentionTask& tk = att_tasks_[(size_t)t];
    attend_scores(split_blocks_[(size_t)t], *segs[tk.seg].cache, layer, tk.hk, e, (int)(e.p0 + n * s / S),
                  (int)(e.p0 + n * (s + 1) / S), scores_of(t), att_kv_[tid].data());
  });
  // 2. Softmax per row.
  pool_.parallel_for(T * G, [&](int64_t u, int) {
    const int64_t t = u / G, r = u % G;
    if (r < split_blocks_[(size_t)t].rows) attend_softmax(split_blocks_[(size_t)t], split_extents_[(size_t)t], (int)r, scores_of(t));
  });
  // 3. Weighted values, each task's chunks in S ranges, into per-chunk partial sums.
  pool_.parallel_for(T * S, [&](int64_t u, int tid) {
    const int64_t t = u / S, s = u % S;
    const AttentionExtent& e = split_extents_[(size_t)t];
    const AttentionBlock& b = split_blocks_[(size_t)t];
    const int64_t n = e.c1 - e.c0;
    const int cb = (int)(e.c0 + n * s / S), ce = (int)(e.c0 + n * (s + 1) / S);
    if (cb == ce) return;
    const AttentionTask& tk = att_tasks_[(size_t)t];
    float* partials = &split_partials_[(size_t)(t * split_max_chunks_ * G * D + (cb - e.c0) * b.rows * D)];
    attend_values(b, *segs[tk.seg].cache, layer, tk.hk, e, cb, ce, scores_of(t), partials, att_kv_[tid].data());
  });
  // 4. The chunks added in order, and the rows copied out.
  pool_.parallel_for(T, [&](int64_t t, int) {
    const AttentionBlock& b = split_blocks_[(size_t)t];
    attend_merge(b, split_extents_[(size_t)t], (int)D, &split_partials_[(size_t)(t * split_max_chunks_ * G * D)]);
    scatter_task(att_tasks_[(size_t)t], b.out);
  });
}

}  // namespace kvzap
