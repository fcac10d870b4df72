// --kv-type f32 on a tiny synthetic Llama with f32 weights (tiny_gguf.h): teacher-forced log-probs of
// an f32 cache match a naive double-precision forward pass within 1e-3 where the f16 cache is off by
// its rounding; decode, chunked prefill and one-step prefill give bit-identical logits for both types;
// an f32 engine holds half the tokens in the same budget; presses run on f32 caches and read their
// keys exactly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "engine/engine.h"
#include "engine/session.h"
#include "kernels/thread_pool.h"
#include "model/forward.h"
#include "model/model.h"
#include "press/baseline_math.h"
#include "press/press.h"
#include "tiny_gguf.h"

namespace {

using namespace kvzap;

constexpr int kLayers = 2, kEmbd = 64, kHeads = 4, kHeadsKv = 2, kHeadDim = 16, kFf = 96, kCtx = 256;
constexpr float kEps = 1e-5f, kRopeBase = 10000.0f;

// A byte-level BPE vocabulary (as fuzz/make_seeds.py's tiny model) plus single letters.
std::vector<std::string> vocab() {
  std::vector<std::string> t = {"a", "b", "c", "\u0120", "ab", "\u0120ab", "\u010a", "<|im_start|>", "<|im_end|>",
                                "<|endoftext|>", "user", "assistant", "\u0120a", "bc", "ca", "!"};
  for (char c = 'd'; c <= 'z'; c++) t.push_back(std::string(1, c));
  return t;
}

std::string write_tiny_llama() {
  static int counter = 0;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kvzap_kvtype_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".gguf"))
                               .string();
  test::TinyGguf g;
  g.str("general.architecture", "llama");
  g.str("general.name", "tiny f32 llama");
  g.u32("llama.block_count", kLayers);
  g.u32("llama.context_length", kCtx);
  g.u32("llama.embedding_length", kEmbd);
  g.u32("llama.feed_forward_length", kFf);
  g.u32("llama.attention.head_count", kHeads);
  g.u32("llama.attention.head_count_kv", kHeadsKv);
  g.f32("llama.attention.layer_norm_rms_epsilon", kEps);
  g.f32("llama.rope.freq_base", kRopeBase);
  const std::vector<std::string> tokens = vocab();
  std::vector<int32_t> types(tokens.size(), 1);
  types[7] = types[8] = types[9] = 3;
  g.str("tokenizer.ggml.model", "gpt2");
  g.str("tokenizer.ggml.pre", "smollm");
  g.str_array("tokenizer.ggml.tokens", tokens);
  g.i32_array("tokenizer.ggml.token_type", types);
  g.str_array("tokenizer.ggml.merges", {"a b", "\u0120 ab", "\u0120 a", "b c", "c a"});
  g.u32("tokenizer.ggml.bos_token_id", 9);
  g.u32("tokenizer.ggml.eos_token_id", 8);
  // Weights large enough that attention is sharp (score std ~4) and logits spread (std ~8), so the
  // cache's rounding shows in the log-probs.
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto tensor = [&](const std::string& name, uint64_t n0, uint64_t n1, float scale, float offset) {
    std::vector<float> d(n0 * (n1 ? n1 : 1));
    for (float& x : d) x = offset + scale * normal(rng);
    if (n1) g.tensor(name, {n0, n1}, d);
    else g.tensor(name, {n0}, d);
  };
  const uint64_t V = tokens.size();
  tensor("token_embd.weight", kEmbd, V, 1.0f, 0.0f);
  tensor("output_norm.weight", kEmbd, 0, 0.1f, 1.0f);
  for (int l = 0; l < kLayers; l++) {
    const std::string p = "blk." + std::to_string(l) + ".";
    tensor(p + "attn_norm.weight", kEmbd, 0, 0.1f, 1.0f);
    tensor(p + "attn_q.weight", kEmbd, kHeads * kHeadDim, 0.25f, 0.0f);
    tensor(p + "attn_k.weight", kEmbd, kHeadsKv * kHeadDim, 0.25f, 0.0f);
    tensor(p + "attn_v.weight", kEmbd, kHeadsKv * kHeadDim, 0.25f, 0.0f);
    tensor(p + "attn_output.weight", kHeads * kHeadDim, kEmbd, 0.2f, 0.0f);
    tensor(p + "ffn_norm.weight", kEmbd, 0, 0.1f, 1.0f);
    tensor(p + "ffn_gate.weight", kEmbd, kFf, 0.2f, 0.0f);
    tensor(p + "ffn_up.weight", kEmbd, kFf, 0.2f, 0.0f);
    tensor(p + "ffn_down.weight", kFf, kEmbd, 0.2f, 0.0f);
  }
  g.write(path);
  return path;
}

class KvTypeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = write_tiny_llama();
    model_ = Model::load(path_).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    std::filesystem::remove(path_);
  }
  static std::vector<int32_t> tokens(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t((size_t)n);
    for (int32_t& x : t) x = (int32_t)(rng() % (uint32_t)model_->config().n_vocab);
    return t;
  }
  // Logits of every position [n][n_vocab], the tokens fed `step` at a time into a cache of `type`.
  static std::vector<float> all_logits(const std::vector<int32_t>& toks, int64_t step, KvType type) {
    ThreadPool pool(2);
    Forward fwd(*model_, step, kCtx, pool);
    const ModelConfig& c = model_->config();
    KvCache cache(c.n_layer, c.n_head_kv, c.head_dim, nullptr, type);
    std::vector<float> out(toks.size() * (size_t)c.n_vocab);
    fwd.run(toks.data(), (int64_t)toks.size(), cache, LogitsMode::All, out.data());
    return out;
  }
  static Model* model_;
  static std::string path_;
};
Model* KvTypeTest::model_ = nullptr;
std::string KvTypeTest::path_;

// y = W x in double for an f32 weight matrix [n_out][n_in].
std::vector<double> matvec(const WeightMatrix& w, const std::vector<double>& x) {
  EXPECT_EQ(w.type, GgmlType::F32);
  std::vector<double> y((size_t)w.n_out, 0.0);
  for (int64_t r = 0; r < w.n_out; r++) {
    const float* row = (const float*)(w.data + (size_t)r * w.row_stride);
    double s = 0;
    for (int64_t i = 0; i < w.n_in; i++) s += (double)row[i] * x[(size_t)i];
    y[(size_t)r] = s;
  }
  return y;
}

std::vector<double> rms_norm(const std::vector<double>& x, const float* gain) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double scale = 1.0 / std::sqrt(ss / (double)x.size() + kEps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); i++) y[i] = x[i] * scale * gain[i];
  return y;
}

// Llama's RoPE on adjacent pairs, angles in double.
void rope(double* x, int64_t pos) {
  for (int i = 0; i < kHeadDim / 2; i++) {
    const double theta = (double)pos * std::pow((double)kRopeBase, -2.0 * i / kHeadDim);
    const double c = std::cos(theta), s = std::sin(theta), x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = x0 * c - x1 * s;
    x[2 * i + 1] = x0 * s + x1 * c;
  }
}

// The whole model in double precision, written from the definitions (no kvzap kernel): log-softmax
// of every position [n][n_vocab].
std::vector<double> reference_log_probs(const Model& m, const std::vector<int32_t>& toks) {
  const ModelConfig& c = m.config();
  const ModelWeights& w = m.weights();
  const int64_t n = (int64_t)toks.size(), V = c.n_vocab, G = kHeads / kHeadsKv;
  std::vector<std::vector<double>> x((size_t)n, std::vector<double>(kEmbd));
  for (int64_t t = 0; t < n; t++) {
    const float* e = (const float*)(w.token_embd.data + (size_t)toks[(size_t)t] * w.token_embd.row_stride);
    for (int i = 0; i < kEmbd; i++) x[(size_t)t][(size_t)i] = e[i];
  }
  for (int l = 0; l < kLayers; l++) {
    const LayerWeights& L = w.layers[(size_t)l];
    std::vector<std::vector<double>> q((size_t)n), k((size_t)n), v((size_t)n);
    for (int64_t t = 0; t < n; t++) {
      const std::vector<double> h = rms_norm(x[(size_t)t], L.attn_norm);
      q[(size_t)t] = matvec(L.wq, h);
      k[(size_t)t] = matvec(L.wk, h);
      v[(size_t)t] = matvec(L.wv, h);
      for (int hh = 0; hh < kHeads; hh++) rope(&q[(size_t)t][(size_t)hh * kHeadDim], t);
      for (int hh = 0; hh < kHeadsKv; hh++) rope(&k[(size_t)t][(size_t)hh * kHeadDim], t);
    }
    for (int64_t t = 0; t < n; t++) {
      std::vector<double> att((size_t)kHeads * kHeadDim, 0.0), s((size_t)t + 1);
      for (int hh = 0; hh < kHeads; hh++) {
        const int64_t hk = hh / G;
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= t; j++) {
          double d = 0;
          for (int i = 0; i < kHeadDim; i++) d += q[(size_t)t][(size_t)(hh * kHeadDim + i)] * k[(size_t)j][(size_t)(hk * kHeadDim + i)];
          s[(size_t)j] = d / std::sqrt((double)kHeadDim);
          mx = std::max(mx, s[(size_t)j]);
        }
        for (int64_t j = 0; j <= t; j++) sum += (s[(size_t)j] = std::exp(s[(size_t)j] - mx));
        for (int64_t j = 0; j <= t; j++)
          for (int i = 0; i < kHeadDim; i++)
            att[(size_t)(hh * kHeadDim + i)] += s[(size_t)j] / sum * v[(size_t)j][(size_t)(hk * kHeadDim + i)];
      }
      const std::vector<double> o = matvec(L.wo, att);
      for (int i = 0; i < kEmbd; i++) x[(size_t)t][(size_t)i] += o[(size_t)i];
    }
    for (int64_t t = 0; t < n; t++) {
      const std::vector<double> h = rms_norm(x[(size_t)t], L.ffn_norm);
      std::vector<double> gate = matvec(L.gate, h);
      const std::vector<double> up = matvec(L.up, h);
      for (size_t i = 0; i < gate.size(); i++) gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      const std::vector<double> d = matvec(L.down, gate);
      for (int i = 0; i < kEmbd; i++) x[(size_t)t][(size_t)i] += d[(size_t)i];
    }
  }
  std::vector<double> out((size_t)(n * V));
  for (int64_t t = 0; t < n; t++) {
    const std::vector<double> logits = matvec(w.output, rms_norm(x[(size_t)t], w.output_norm));
    const double mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (double z : logits) sum += std::exp(z - mx);
    for (int64_t i = 0; i < V; i++) out[(size_t)(t * V + i)] = logits[(size_t)i] - mx - std::log(sum);
  }
  return out;
}

// Worst |log p - log p_ref| over every position and every vocabulary entry.
double worst_log_prob_error(const std::vector<float>& logits, const std::vector<double>& ref, int64_t V) {
  double worst = 0;
  for (size_t t = 0; t * (size_t)V < logits.size(); t++) {
    const float* z = &logits[t * (size_t)V];
    const double mx = *std::max_element(z, z + V);
    double sum = 0;
    for (int64_t i = 0; i < V; i++) sum += std::exp((double)z[i] - mx);
    for (int64_t i = 0; i < V; i++)
      worst = std::max(worst, std::fabs((double)z[i] - mx - std::log(sum) - ref[t * (size_t)V + (size_t)i]));
  }
  return worst;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); i++) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

TEST_F(KvTypeTest, F32CacheMatchesADoubleReferenceWhereF16DoesNot) {
  const int64_t V = model_->config().n_vocab;
  const std::vector<int32_t> toks = tokens(120, 3);
  const std::vector<double> ref = reference_log_probs(*model_, toks);
  const double e32 = worst_log_prob_error(all_logits(toks, 128, KvType::F32), ref, V);
  const double e16 = worst_log_prob_error(all_logits(toks, 128, KvType::F16), ref, V);
  std::printf("[ worst log-prob error vs the f64 reference: f32 cache %.3g, f16 cache %.3g ]\n", e32, e16);
  EXPECT_LT(e32, 1e-3);
  EXPECT_GT(e16, 1e-3);       // what the issue reported: f16 alone moves log-probs by more than 1e-3 ...
  EXPECT_GT(e16, 10 * e32);   // ... and f32 removes nearly all of it
  // Decoding token by token over the f32 cache stays within the bound too.
  EXPECT_LT(worst_log_prob_error(all_logits(toks, 1, KvType::F32), ref, V), 1e-3);
}

// Decode (one token a step), prefill chunks and one-step prefill: bit-identical logits, both types.
TEST_F(KvTypeTest, DecodeChunksAndOneStepAreBitIdentical) {
  const std::vector<int32_t> toks = tokens(70, 4);
  for (KvType type : {KvType::F16, KvType::F32}) {
    SCOPED_TRACE(kv_type_name(type));
    const std::vector<float> one = all_logits(toks, 128, type), five = all_logits(toks, 5, type),
                             single = all_logits(toks, 1, type);
    EXPECT_EQ(max_diff(one, five), 0.0f);
    EXPECT_EQ(max_diff(one, single), 0.0f);
  }
  EXPECT_GT(max_diff(all_logits(toks, 128, KvType::F16), all_logits(toks, 128, KvType::F32)), 0.0f);  // the types differ
}

// The same byte budget holds half as many f32 tokens: twice the bytes per token, half the pages.
TEST_F(KvTypeTest, F32EngineHoldsHalfTheTokensOfTheSameBudget) {
  EngineOptions o;
  o.n_threads = 1;
  o.n_ctx = kCtx;
  o.kv_budget_bytes = 4 << 20;
  Engine e16(*model_, o);
  o.kv_type = KvType::F32;
  Engine e32(*model_, o);
  EXPECT_EQ(e16.kv_type(), KvType::F16);
  EXPECT_EQ(e32.kv_type(), KvType::F32);
  EXPECT_EQ(e32.kv_bytes_per_token(), 2 * e16.kv_bytes_per_token());
  EXPECT_EQ(e16.kv_bytes_per_token(), (int64_t)kLayers * kHeadsKv * 2 * kHeadDim * 2);
  // Pages also hold 16 positions (4 bytes each), so slightly more than half.
  EXPECT_GE(2 * e32.kv_budget_tokens(), e16.kv_budget_tokens() - 2 * KvCache::kPageTokens);
  EXPECT_LT(2 * e32.kv_budget_tokens(), e16.kv_budget_tokens() * 21 / 20 + KvCache::kPageTokens);
  EXPECT_GT(e32.pages().page_bytes(), e16.pages().page_bytes());
  // The same tokens take the same pages, each larger: resident bytes ~double.
  auto a = e16.new_sequence(), b = e32.new_sequence();
  EXPECT_EQ(a->cache().kv_type(), KvType::F16);
  EXPECT_EQ(b->cache().kv_type(), KvType::F32);
  const std::vector<int32_t> toks = tokens(100, 6);
  e16.feed(*a, toks.data(), 100);
  e32.feed(*b, toks.data(), 100);
  EXPECT_EQ(e16.pages().pages_in_use(), e32.pages().pages_in_use());
  EXPECT_EQ(b->cache().bytes_resident() * e16.pages().page_bytes(), a->cache().bytes_resident() * e32.pages().page_bytes());
  // A budget of exactly one f16 sequence of 100 tokens is too small for the f32 one.
  const int64_t need16 = a->cache().bytes_resident();
  o.kv_budget_bytes = need16;
  Engine tight(*model_, o);
  auto c = tight.new_sequence();
  EXPECT_THROW(tight.feed(*c, toks.data(), 100), KvBudgetExceeded);
  o.kv_type = KvType::F16;
  Engine fits(*model_, o);
  auto d = fits.new_sequence();
  EXPECT_NO_THROW(fits.feed(*d, toks.data(), 100));
}

// Presses on an f32 cache: knorm (scores the step's keys) and keydiff (reads the cached keys back)
// prune as asked, the cached keys they read are the f32 keys exactly, and generation continues.
TEST_F(KvTypeTest, PressesRunOnAnF32Cache) {
  const std::vector<int32_t> toks = tokens(150, 8);
  for (const char* name : {"knorm", "keydiff"}) {
    SCOPED_TRACE(name);
    SessionOptions so;
    so.n_threads = 2;
    so.n_ctx = kCtx;
    so.kv_type = KvType::F32;
    Session s(*model_, so);
    PressSpec po;
    po.name = name;
    po.has_ratio = true;
    po.ratio = 0.5;
    std::unique_ptr<Press> press = make_press(po, *model_);
    s.prefill_context(toks, press.get());
    EXPECT_EQ(s.cache().kv_type(), KvType::F32);
    EXPECT_NEAR(s.cache().evicted_fraction(), 0.5, 0.02);
    for (int i = 0; i < model_->config().n_vocab; i++) ASSERT_TRUE(std::isfinite(s.logits()[i]));
    // baseline_math's stream reader (what keydiff, snapkv, tova, ... read) returns the f32 rows as stored.
    std::vector<float> keys, values;
    stream_keys(s.cache(), 1, 1, keys);
    stream_values(s.cache(), 1, 1, values);
    ASSERT_EQ(keys.size(), (size_t)(s.cache().length(1, 1) * kHeadDim));
    for (int64_t i = 0; i < s.cache().length(1, 1); i++)
      for (int d = 0; d < kHeadDim; d++) {
        ASSERT_EQ(keys[(size_t)(i * kHeadDim + d)], s.cache().key_at_f32(1, 1, i)[d]);
        ASSERT_EQ(values[(size_t)(i * kHeadDim + d)], s.cache().value_at_f32(1, 1, i)[d]);
      }
    std::vector<float> range((size_t)3 * kHeadDim);
    stream_key_range(s.cache(), 0, 0, 2, 3, range.data());
    for (int d = 0; d < kHeadDim; d++) ASSERT_EQ(range[(size_t)(kHeadDim + d)], s.cache().key_at_f32(0, 0, 3)[d]);
    // Generation continues on the pruned f32 cache.
    GenerateOptions g;
    g.max_new_tokens = 4;
    g.sampling.temperature = 0;
    g.stop_at_eog = false;
    const GenerateResult r = s.generate({}, g);
    EXPECT_EQ(r.tokens.size(), 4u);
  }
}

}  // namespace
