// Gemma 3 on tiny synthetic GGUF files (tiny_gguf.h): the loader's per-layer config, the sliding window
// (each query sees exactly positions > p - W, inside a prefill chunk too, and what leaves the window is
// freed from the cache), presses leaving sliding layers alone by default, and one-line load errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/kv_cache.h"
#include "common/fp16.h"
#include "engine/engine.h"
#include "kernels/thread_pool.h"
#include "model/attention.h"
#include "model/blocks.h"
#include "model/forward.h"
#include "model/model.h"
#include "press/press.h"
#include "replay_check.h"
#include "test_support.h"
#include "tiny_gguf.h"

namespace {

using namespace kvzap;

constexpr int kEmbd = 64, kHeads = 4, kHeadsKv = 1, kHeadDim = 16, kFf = 96;

struct TinyOptions {
  int n_layer = 4;
  int window = 8;        // 0: no sliding_window key (every layer global)
  int pattern = 2;       // -1: no pattern key (default 6); 0: every layer sliding
  std::string drop_tensor;   // leave this tensor out
  std::string bad_shape;     // write this tensor with one element too many in ne[0]
  std::vector<float> rope_freqs;  // written as rope_freqs.weight [kHeadDim/2] when not empty
  uint32_t seed = 7;
};

// A SentencePiece vocabulary: control tokens, a user-defined "\n", the 256 byte tokens, letters and a few
// merges (higher score = merged first).
void add_vocab(test::TinyGguf& g, int* n_vocab) {
  std::vector<std::string> tokens = {"<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "\n"};
  std::vector<int32_t> types = {3, 3, 3, 2, 3, 3, 4};
  std::vector<float> scores(tokens.size(), -1000.0f);
  for (int b = 0; b < 256; b++) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    tokens.push_back(hex);
    types.push_back(6);
    scores.push_back(0.0f);
  }
  const std::vector<std::pair<std::string, float>> normal = {
      {"\xE2\x96\x81", -1.0f}, {"\xE2\x96\x81t", -3.0f}, {"th", -2.5f}, {"he", -2.6f}, {"\xE2\x96\x81th", -2.0f},
      {"\xE2\x96\x81the", -1.0f}, {"in", -2.7f}, {"ing", -2.2f}, {"an", -2.8f}, {"and", -2.3f},
      {"\xE2\x96\x81" "and", -1.5f}, {"aa", -1.0f}};
  for (const auto& [t, s] : normal) {
    tokens.push_back(t);
    types.push_back(1);
    scores.push_back(s);
  }
  for (char c = 'a'; c <= 'z'; c++) {
    tokens.push_back(std::string(1, c));
    types.push_back(1);
    scores.push_back(-5.0f - 0.01f * (float)(c - 'a'));
  }
  g.str("tokenizer.ggml.model", "llama");
  g.str_array("tokenizer.ggml.tokens", tokens);
  g.f32_array("tokenizer.ggml.scores", scores);
  g.i32_array("tokenizer.ggml.token_type", types);
  g.u32("tokenizer.ggml.bos_token_id", 2);
  g.u32("tokenizer.ggml.eos_token_id", 1);
  g.u32("tokenizer.ggml.unknown_token_id", 3);
  g.u32("tokenizer.ggml.padding_token_id", 0);
  g.boolean("tokenizer.ggml.add_bos_token", true);
  g.boolean("tokenizer.ggml.add_space_prefix", false);
  *n_vocab = (int)tokens.size();
}

std::string write_tiny_gemma3(const TinyOptions& o) {
  static int counter = 0;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kvzap_gemma3_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".gguf"))
                               .string();
  test::TinyGguf g;
  g.str("general.architecture", "gemma3");
  g.str("general.name", "tiny gemma3");
  g.u32("gemma3.block_count", (uint32_t)o.n_layer);
  g.u32("gemma3.context_length", 512);
  g.u32("gemma3.embedding_length", kEmbd);
  g.u32("gemma3.feed_forward_length", kFf);
  g.u32("gemma3.attention.head_count", kHeads);
  g.u32("gemma3.attention.head_count_kv", kHeadsKv);
  g.u32("gemma3.attention.key_length", kHeadDim);
  g.u32("gemma3.attention.value_length", kHeadDim);
  g.f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6f);
  g.f32("gemma3.rope.freq_base", 1e6f);
  if (o.window > 0) g.u32("gemma3.attention.sliding_window", (uint32_t)o.window);
  if (o.pattern >= 0) g.u32("gemma3.attention.sliding_window_pattern", (uint32_t)o.pattern);
  int V = 0;
  add_vocab(g, &V);

  std::mt19937 rng(o.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto tensor = [&](const std::string& name, uint64_t n0, uint64_t n1, float scale, float offset) {
    if (name == o.drop_tensor) return;
    std::vector<float> d(n0 * (n1 ? n1 : 1));
    for (float& x : d) x = offset + scale * normal(rng);
    const uint64_t m0 = name == o.bad_shape ? n0 + 1 : n0;
    if (m0 != n0) d.resize(m0 * (n1 ? n1 : 1));
    if (n1) g.tensor(name, {m0, n1}, d);
    else g.tensor(name, {m0}, d);
  };
  tensor("token_embd.weight", kEmbd, (uint64_t)V, 0.5f, 0.0f);
  tensor("output_norm.weight", kEmbd, 0, 0.1f, 1.0f);
  if (!o.rope_freqs.empty()) g.tensor("rope_freqs.weight", {(uint64_t)o.rope_freqs.size()}, o.rope_freqs);
  for (int l = 0; l < o.n_layer; l++) {
    const std::string p = "blk." + std::to_string(l) + ".";
    tensor(p + "attn_norm.weight", kEmbd, 0, 0.1f, 1.0f);
    tensor(p + "attn_q.weight", kEmbd, kHeads * kHeadDim, 0.25f, 0.0f);
    tensor(p + "attn_k.weight", kEmbd, kHeadsKv * kHeadDim, 0.25f, 0.0f);
    tensor(p + "attn_v.weight", kEmbd, kHeadsKv * kHeadDim, 0.25f, 0.0f);
    tensor(p + "attn_output.weight", kHeads * kHeadDim, kEmbd, 0.2f, 0.0f);
    tensor(p + "attn_q_norm.weight", kHeadDim, 0, 0.1f, 1.0f);
    tensor(p + "attn_k_norm.weight", kHeadDim, 0, 0.1f, 1.0f);
    tensor(p + "post_attention_norm.weight", kEmbd, 0, 0.1f, 1.0f);
    tensor(p + "ffn_norm.weight", kEmbd, 0, 0.1f, 1.0f);
    tensor(p + "ffn_gate.weight", kEmbd, kFf, 0.2f, 0.0f);
    tensor(p + "ffn_up.weight", kEmbd, kFf, 0.2f, 0.0f);
    tensor(p + "ffn_down.weight", kFf, kEmbd, 0.2f, 0.0f);
    tensor(p + "post_ffw_norm.weight", kEmbd, 0, 0.1f, 1.0f);
  }
  g.write(path);
  return path;
}

struct Loaded {
  std::string path;
  std::unique_ptr<Model> model;
  ~Loaded() { std::filesystem::remove(path); }
};

std::unique_ptr<Loaded> load(const TinyOptions& o) {
  auto l = std::make_unique<Loaded>();
  l->path = write_tiny_gemma3(o);
  l->model = Model::load(l->path);
  return l;
}

std::vector<int32_t> tokens(int n, uint32_t seed, int n_vocab) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t((size_t)n);
  for (int32_t& x : t) x = 7 + (int32_t)(rng() % (uint32_t)(n_vocab - 7));  // no control tokens
  return t;
}

// Logits of every position, the tokens fed `step` at a time.
std::vector<float> all_logits(const Model& m, const std::vector<int32_t>& toks, int64_t step, KvCache* keep = nullptr) {
  ThreadPool pool(1);
  Forward fwd(m, step, 512, pool);
  const ModelConfig& c = m.config();
  KvCache own(c.n_layer, c.n_head_kv, c.head_dim);
  KvCache& cache = keep ? *keep : own;
  std::vector<float> out(toks.size() * (size_t)c.n_vocab);
  fwd.run(toks.data(), (int64_t)toks.size(), cache, LogitsMode::All, out.data());
  return out;
}

float max_diff(const float* a, const float* b, int64_t n) {
  float d = 0;
  for (int64_t i = 0; i < n; i++) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

TEST(Gemma3, LoaderFillsPerLayerConfig) {
  auto t = load({});
  const ModelConfig& c = t->model->config();
  ASSERT_EQ((int)c.layers.size(), 4);
  // pattern 2: layer l is local iff l % 2 < 1
  EXPECT_EQ(c.layers[0].sliding_window, 8);
  EXPECT_EQ(c.layers[1].sliding_window, 0);
  EXPECT_EQ(c.layers[2].sliding_window, 8);
  EXPECT_EQ(c.layers[3].sliding_window, 0);
  EXPECT_FLOAT_EQ(c.layers[0].rope_base, 10000.0f);  // local layers: rope.freq_base_swa default
  EXPECT_FLOAT_EQ(c.layers[1].rope_base, 1e6f);      // global layers: rope.freq_base
  EXPECT_FLOAT_EQ(c.embd_scale, std::sqrt((float)kEmbd));
  EXPECT_FLOAT_EQ(c.query_scale(), 0.25f);  // 1/sqrt(16): the file gives no query_pre_attn_scalar
  EXPECT_TRUE(c.ffn_act == FfnActivation::GeluTanhF16);
  EXPECT_TRUE(c.rope_mode == RopeMode::HalfSplit);
  EXPECT_NE(t->model->weights().layers[0].attn_post_norm, nullptr);
  EXPECT_NE(t->model->weights().layers[0].ffn_post_norm, nullptr);

  auto d = load({.n_layer = 12, .pattern = -1});  // default pattern 6: 5 local, 1 global
  for (int l = 0; l < 12; l++) EXPECT_EQ(d->model->config().layers[l].is_sliding(), l % 6 != 5) << l;
  auto g = load({.window = 0});
  EXPECT_FALSE(g->model->config().has_sliding_layers());
}

// Loading the file written from o must fail with a one-line error that mentions `needle`.
void expect_one_line_load_error(const TinyOptions& o, const std::string& needle) {
  const std::string path = write_tiny_gemma3(o);
  try {
    Model::load(path);
    ADD_FAILURE() << "loaded a file that should be refused (" << needle << ")";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
  std::filesystem::remove(path);
}

// GeGLU in f32 against a double reference, and ggml's f16-table form against the same reference rounded
// as ggml rounds it (input and result to f16; |x| >= 10 passes through or gives 0).
TEST(Gemma3, GegluFormsMatchTheirReferences) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-12.0f, 12.0f);
  const int n = 4096;
  std::vector<float> gate(n), up(n);
  for (int i = 0; i < n; i++) { gate[i] = u(rng); up[i] = u(rng) / 4; }
  auto gelu_ref = [](double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x))); };
  std::vector<float> exact = gate, table = gate;
  kvzap::geglu(exact.data(), up.data(), n);
  kvzap::geglu_f16_table(table.data(), up.data(), n);
  double max_exact = 0, max_table = 0, max_between = 0;
  for (int i = 0; i < n; i++) {
    const double ref = gelu_ref(gate[i]) * up[i];
    max_exact = std::max(max_exact, std::abs(exact[i] - ref) / (1.0 + std::abs(ref)));  // f32 rounding only
    double g16 = gate[i] <= -10 ? 0.0 : gate[i] >= 10 ? gate[i]
               : kvzap::fp16_to_fp32(kvzap::fp32_to_fp16((float)gelu_ref(kvzap::fp16_to_fp32(kvzap::fp32_to_fp16(gate[i])))));
    // one f16 step at most (subnormal halves: f32's own error): the table's f32 gelu and this double one
    // may round to neighbouring halves
    max_table = std::max(max_table, std::abs(table[i] - g16 * up[i]) / ((std::abs(g16) / 1024 + 1e-6) * std::abs(up[i])));
    max_between = std::max(max_between, (double)std::abs(table[i] - exact[i]));
  }
  EXPECT_LT(max_exact, 1e-5);
  EXPECT_LE(max_table, 1.0);
  EXPECT_GT(max_between, 1e-4);  // the two forms really differ (f16 rounding), so each test above can fail
}

TEST(Gemma3, BadFilesGiveOneLineErrors) {
  for (const TinyOptions& o : {TinyOptions{.drop_tensor = "blk.1.post_ffw_norm.weight"},
                               TinyOptions{.bad_shape = "blk.0.attn_q_norm.weight"},
                               TinyOptions{.drop_tensor = "blk.0.attn_k_norm.weight"}}) {
    expect_one_line_load_error(o, o.drop_tensor.empty() ? o.bad_shape : o.drop_tensor);
  }
}

// rope_freqs.weight (Llama 3.1's frequency divisors) is read when every layer shares one RoPE base, and
// refused with one line when the layers have their own bases or a divisor is not a positive number.
TEST(Gemma3, RopeFreqsAreReadOrRefusedWithOneLine) {
  const std::vector<float> factors = {1.0f, 0.5f, 2.0f, 4.0f, 0.25f, 3.0f, 8.0f, 1.5f};
  {
    const std::string path = write_tiny_gemma3(TinyOptions{.window = 0, .rope_freqs = factors});
    auto m = Model::load(path);
    EXPECT_EQ(m->config().rope_freq_factors, factors);
    std::filesystem::remove(path);
  }
  std::vector<float> negative = factors;
  negative[2] = -1.0f;
  for (const TinyOptions& o : {TinyOptions{.rope_freqs = factors}, TinyOptions{.window = 0, .rope_freqs = negative}}) {
    expect_one_line_load_error(o, "rope_freqs.weight");
  }
}

// With every layer sliding (pattern 0), the output at position p depends on positions
// >= p - n_layer * (W - 1) only: change token 0 and the logits at n_layer * (W - 1) + 1 are bit-identical,
// while those at n_layer * (W - 1) move (a window one wider, or narrower, fails one of the two).
TEST(Gemma3, SlidingWindowMasksExactlyTheWindowInsideOneStep) {
  const TinyOptions o{.n_layer = 3, .window = 8, .pattern = 0};
  auto t = load(o);
  const int V = t->model->config().n_vocab;
  const int reach = o.n_layer * (o.window - 1);  // 21
  std::vector<int32_t> a = tokens(reach + 2, 1, V), b = a;
  b[0] = a[0] == 300 ? 301 : 300;
  const std::vector<float> la = all_logits(*t->model, a, 64), lb = all_logits(*t->model, b, 64);
  EXPECT_EQ(max_diff(&la[(size_t)(reach + 1) * V], &lb[(size_t)(reach + 1) * V], V), 0.0f);
  EXPECT_GT(max_diff(&la[(size_t)reach * V], &lb[(size_t)reach * V], V), 1e-6f);
  // The same weights with every layer global: position 0 reaches the last token (negative control).
  auto g = load({.n_layer = 3, .window = 0, .pattern = 0});
  const std::vector<float> ga = all_logits(*g->model, a, 64), gb = all_logits(*g->model, b, 64);
  EXPECT_GT(max_diff(&ga[(size_t)(reach + 1) * V], &gb[(size_t)(reach + 1) * V], V), 1e-6f);
}

// One step (the window masked inside the chunk), chunks of 5, and token by token (the window freed from
// the cache between steps) give the same logits.
TEST(Gemma3, PrefillChunksAndDecodingMatchOneStep) {
  auto t = load({});
  const int V = t->model->config().n_vocab;
  const std::vector<int32_t> toks = tokens(70, 2, V);
  const std::vector<float> one = all_logits(*t->model, toks, 128), five = all_logits(*t->model, toks, 5),
                           single = all_logits(*t->model, toks, 1);
  EXPECT_LT(max_diff(one.data(), five.data(), (int64_t)one.size()), 1e-4f);
  EXPECT_LT(max_diff(one.data(), single.data(), (int64_t)one.size()), 1e-4f);
}

TEST(Gemma3, SlidingLayersFreeWhatLeavesTheWindow) {
  auto t = load({});
  const ModelConfig& c = t->model->config();
  const int V = c.n_vocab, W = 8, P = KvCache::kPageTokens;
  KvCache cache(c.n_layer, c.n_head_kv, c.head_dim);
  const std::vector<int32_t> toks = tokens(100, 3, V);
  all_logits(*t->model, toks, 100, &cache);  // one 100-token step
  for (int l = 0; l < c.n_layer; l++) {
    const int64_t len = cache.length(l, 0);
    if (c.layers[l].is_sliding()) {
      EXPECT_GE(len, W - 1) << l;
      EXPECT_LE(len, W - 1 + P - 1) << l;  // whole pages freed: at most one partly outdated page left
      EXPECT_GE(cache.position_at(l, 0, len - (W - 1)), 100 - (W - 1));
      EXPECT_EQ(cache.entries_window_dropped(l), 100 - len);
    } else {
      EXPECT_EQ(len, 100) << l;
      EXPECT_EQ(cache.entries_window_dropped(l), 0);
    }
  }
  EXPECT_EQ(cache.evicted_fraction(), 0.0);  // no press: nothing counts as evicted
  EXPECT_EQ(cache.bytes_resident(), cache.bytes_full());
  EXPECT_LT(cache.bytes_resident(), (int64_t)c.n_layer * ((100 + P - 1) / P) * cache.page_bytes());
  // Rewinding into freed positions is refused; a recent position is fine.
  EXPECT_FALSE(cache.can_truncate(50));
  EXPECT_THROW(cache.truncate(50), Error);
  EXPECT_TRUE(cache.can_truncate(99));
  cache.truncate(99);
  EXPECT_EQ(cache.n_past(), 99);
}

TEST(Gemma3, WindowedAttentionKernelMatchesReference) {
  constexpr int D = 64, N = 70, R = 5;
  KvCache cache(1, 1, D);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> k(D), v(D);
  for (int j = 0; j < N; j++) {
    for (int i = 0; i < D; i++) k[i] = nd(rng), v[i] = nd(rng);
    cache.append(0, 0, k.data(), v.data(), j);
  }
  std::vector<float> q((size_t)R * D), out((size_t)R * D), ref((size_t)R * D);
  for (float& x : q) x = 0.2f * nd(rng);
  const int64_t visible[R] = {20, 40, 41, 69, 70}, first[R] = {13, 33, 34, 40, 0};
  AttentionBlock b{q.data(), D, R, visible, out.data(), D, true, first};
  std::vector<float> scores((size_t)R * N), page((size_t)2 * KvCache::kPageTokens * D), partial((size_t)R * D);
  attend(b, cache, 0, 0, scores.data(), page.data(), partial.data());
  AttentionBlock br = b;
  br.out = ref.data();
  attend_reference(br, cache, 0, 0);
  EXPECT_LT(max_diff(out.data(), ref.data(), (int64_t)out.size()), 2e-3f);
  // Entries before `first` do not matter: a cache whose old entries differ gives the same output.
  KvCache other(1, 1, D);
  std::mt19937 rng2(99);
  for (int j = 0; j < N; j++) {
    const uint16_t* kk = cache.key_at(0, 0, j);
    const uint16_t* vv = cache.value_at(0, 0, j);
    std::vector<float> k2(D), v2(D);
    for (int i = 0; i < D; i++) k2[i] = fp16_to_fp32(kk[i]), v2[i] = fp16_to_fp32(vv[i]);
    if (j < 13)
      for (int i = 0; i < D; i++) k2[i] = nd(rng2), v2[i] = 5 * nd(rng2);
    other.append(0, 0, k2.data(), v2.data(), j);
  }
  std::vector<float> out2((size_t)R * D);
  AttentionBlock b2 = b;
  b2.out = out2.data();
  attend(b2, other, 0, 0, scores.data(), page.data(), partial.data());
  for (int r = 0; r < R - 1; r++)  // every row but the last starts at or after entry 13
    EXPECT_EQ(max_diff(&out[(size_t)r * D], &out2[(size_t)r * D], D), 0.0f) << r;
  EXPECT_GT(max_diff(&out[(size_t)(R - 1) * D], &out2[(size_t)(R - 1) * D], D), 1e-3f);
}

// An engine for one short sequence: 256-token context and batch, a KV budget that never binds.
EngineOptions small_engine(int threads) {
  EngineOptions eo;
  eo.n_threads = threads;
  eo.n_ctx = 256;
  eo.n_batch = 256;
  eo.kv_budget_bytes = (int64_t)1 << 28;
  return eo;
}

// Prefills `toks` as a context under `press`; returns each layer's stream length before the press acts
// (end_context, left to the caller).
std::vector<int64_t> prefill_under_press(Engine& engine, Sequence& seq, std::unique_ptr<Press> press,
                                         const std::vector<int32_t>& toks) {
  seq.set_press(std::move(press));
  seq.begin_context();
  engine.feed(seq, toks.data(), (int64_t)toks.size());
  std::vector<int64_t> lengths;
  for (int l = 0; l < seq.cache().n_layer(); l++) lengths.push_back(seq.cache().length(l, 0));
  return lengths;
}

// Presses prune the global layers; sliding-window layers only when asked.
TEST(Gemma3, PressesLeaveSlidingLayersAloneByDefault) {
  auto t = load({});
  const ModelConfig& c = t->model->config();
  const std::vector<int32_t> toks = tokens(96, 4, c.n_vocab);
  for (bool sliding : {false, true}) {
    Engine engine(*t->model, small_engine(1));
    auto seq = engine.new_sequence();
    PressSpec po;
    po.name = "knorm";
    po.has_ratio = true;
    po.ratio = 0.5;
    po.ratio_scope = "layer";
    po.sliding_layers = sliding;
    const std::vector<int64_t> before = prefill_under_press(engine, *seq, make_press(po, *t->model), toks);
    const KvCache& cache = seq->cache();
    seq->end_context(toks);
    for (int l = 0; l < c.n_layer; l++) {
      const int64_t len = cache.length(l, 0);
      if (c.layers[l].is_sliding() && !sliding) {
        EXPECT_EQ(len, before[l]) << "layer " << l;
      } else {
        EXPECT_EQ(len, before[l] - before[l] / 2) << "layer " << l << (sliding ? " (sliding layers on)" : "");
      }
    }
    EXPECT_GT(cache.evicted_fraction(), 0.0);
    EXPECT_LT(cache.bytes_resident(), cache.bytes_full());
  }
}

}  // namespace

namespace {

// Every context scorer of the registry (KVzip, SnapKV, the other kvpress baselines) runs on a model with
// sliding-window layers: it judges the global layers, whose streams hold the whole context, and leaves
// the sliding ones (which hold only their window) alone. Asked to judge sliding layers too, a scorer
// that needs the whole context refuses with a clear error instead of scoring a window as if it were the
// context.
TEST(Gemma3, ContextScorersJudgeTheGlobalLayers) {
  auto t = load({});
  const ModelConfig& c = t->model->config();
  const std::vector<int32_t> toks = tokens(96, 6, c.n_vocab);
  int n_context_scorers = 0;
  for (const ScorerEntry& e : scorer_registry()) {
    if (e.supports_threshold) continue;  // per-token scorers (KVzap, KNorm, random): covered above
    if (e.traits.needs_query_stats) continue;  // no statistics for this model (test_query_stats_presses.cpp)
    PressSpec po;
    po.name = e.name;
    if (e.make(po, *t->model)->per_step()) continue;
    n_context_scorers++;
    SCOPED_TRACE(e.name);
    Engine engine(*t->model, small_engine(2));
    auto seq = engine.new_sequence();
    test::give_budget(po, 0.5);
    const std::vector<int64_t> before = prefill_under_press(engine, *seq, make_press(po, *t->model), toks);
    const KvCache& cache = seq->cache();
    ASSERT_NO_THROW(seq->end_context(toks));
    int64_t global_before = 0, global_after = 0;
    for (int l = 0; l < c.n_layer; l++) {
      if (c.layers[l].is_sliding()) {
        EXPECT_EQ(cache.length(l, 0), before[l]) << "sliding layer " << l;
      } else {
        global_before += before[l];
        global_after += cache.length(l, 0);
      }
    }
    EXPECT_LT(global_after, global_before);
    EXPECT_GE(global_after, global_before / 4);

    po.sliding_layers = true;
    if (e.name == "streaming_llm") {  // it ranks by position, which a window stream has too
      EXPECT_NO_THROW(make_press(po, *t->model));
    } else {
      try {
        make_press(po, *t->model);
        ADD_FAILURE() << "judging sliding-window layers was not refused";
      } catch (const Error& err) {
        EXPECT_NE(std::string(err.what()).find("sliding"), std::string::npos) << err.what();
      }
    }
  }
  EXPECT_GE(n_context_scorers, 15);
}


// The shared-prefill path on a model with sliding-window layers: a replayed context (whose sliding layers
// free what their window no longer sees, step by step) gives the cache and logits of a prefill under the
// press, for context scorers, per-token scorers and a decoding threshold press, in one step and in chunks.
TEST(Gemma3, ReplayedContextMatchesAPrefillUnderAPress) {
  auto t = load({});
  const ModelConfig& c = t->model->config();
  const std::vector<int32_t> context = tokens(96, 8, c.n_vocab), question = tokens(12, 9, c.n_vocab);
  std::vector<PressSpec> presses;
  for (const char* name : {"snapkv", "kvzip", "knorm", "streaming_llm"}) {
    PressSpec po;
    po.name = name;
    po.has_ratio = true;
    po.ratio = 0.5;
    presses.push_back(po);
  }
  PressSpec rnd;
  rnd.name = "random";
  rnd.has_threshold = true;
  rnd.threshold = 0.5;
  rnd.window = 4;
  rnd.decoding = true;
  rnd.sliding_layers = true;
  presses.push_back(rnd);
  for (int64_t n_batch : {(int64_t)256, (int64_t)32}) {
    EngineOptions eo = small_engine(2);
    eo.n_batch = n_batch;
    for (const PressSpec& po : presses) {
      if (n_batch < 256 && po.name == "kvzip") continue;  // its repeat pass needs the context in one batch
      SCOPED_TRACE(po.name + " n_batch " + std::to_string(n_batch));
      EXPECT_GT(test::expect_replay_matches_prefill(*t->model, eo, po, context, question), 0.0);
    }
  }
}


// `kvzap score` on a model with sliding-window layers: the sliding layers' rows are null (not judged), and
// the JSON lists them and says why, while every global layer has scores.
TEST(Gemma3, ScoreJsonNamesTheUnscoredSlidingLayers) {
  auto t = load({});
  const ModelConfig& c = t->model->config();
  const std::string out = t->path + ".scores.json";
  const test::CommandResult r =
      test::run_kvzap("score -m '" + t->path + "' -p 'abc ab ba cab abc ba ab cab ba abc' --out '" + out + "' -t 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(test::slurp(out));
  std::filesystem::remove(out);
  std::vector<int> sliding;
  for (int l = 0; l < c.n_layer; l++)
    if (c.layers[(size_t)l].is_sliding()) sliding.push_back(l);
  ASSERT_FALSE(sliding.empty());
  EXPECT_EQ(j["unscored_sliding_layers"].get<std::vector<int>>(), sliding);
  EXPECT_NE(j["note"].get<std::string>().find("sliding-window"), std::string::npos);
  for (int l = 0; l < c.n_layer; l++) {
    int scored = 0;
    for (const auto& v : j["log_scores"][(size_t)l][0]) scored += !v.is_null();
    if (c.layers[(size_t)l].is_sliding())
      EXPECT_EQ(scored, 0) << "layer " << l;
    else
      EXPECT_GT(scored, 0) << "layer " << l;
  }
}

}  // namespace
