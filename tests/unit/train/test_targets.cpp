// KVzap training targets (docs/ALGORITHMS.md §5.1): the shared KVzip math against naive double-precision
// versions, the repeat prompt's spans, the targets of a short text against an independent naive
// computation (direct W_O products from the dequantised weights, full softmax in double), window cutting,
// resumable collection (interrupted and torn runs continue to the same file), and the progress line.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/progress.h"
#include "engine/session.h"
#include "kernels/thread_pool.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "press/kvzip.h"
#include "press/kvzip_math.h"
#include "press/surrogate.h"
#include "train/dataset.h"
#include "train/targets.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace kvzap;

namespace {

std::string find_model() {
  return kvzap::test::default_model_path();
}

fs::path temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("kvzap_test_targets_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// ------------------------------------------------------------------ progress

TEST(Progress, FormatsDurations) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(59.4), "59s");
  EXPECT_EQ(format_duration(378), "6m18s");
  EXPECT_EQ(format_duration(3720), "1h02m");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(NAN), "?");
}

TEST(Progress, FormatsTheLine) {
  // 45 of 200 at 0.41/s: 22.5 %, bar 2 of 10 filled, 155 left -> 378 s.
  const std::string s = format_progress_line("collect", 45, 200, 0.41, 10, "win", "9000 records");
  EXPECT_EQ(s, "collect [##........]  45/200  22.5%  2.4 s/win  ETA 6m18s  9000 records");
  // Fast rates are shown per second; done == total has no ETA; no bar when width is 0.
  EXPECT_EQ(format_progress_line("train", 7, 7, 250.0, 0, "rec", ""), "train 7/7 100.0%  250 rec/s");
  EXPECT_EQ(format_progress_line("x", 3, 0, 0.0, 8, "it", ""), "x 3");
}

TEST(Progress, ResumedItemsMoveTheBarButNotTheRate) {
  // A resumed sweep finds 1,965 of 2,500 samples done after its bar exists: they must not count as work
  // of this run, or the ETA claims thousands of samples per second.
  Progress p("sweep", 2500, "sample", 0, nullptr);
  p.resumed(1965);
  EXPECT_EQ(p.done(), 1965);
  EXPECT_EQ(p.rate(), 0.0);  // nothing run yet in this process
  p.add(1);
  EXPECT_EQ(p.done(), 1966);
  const double elapsed_before = p.elapsed_seconds();
  const double rate = p.rate();  // one item over this run's elapsed time (at least elapsed_before)
  EXPECT_GT(rate, 0.0);
  EXPECT_LE(rate, 1.0 / elapsed_before);
}

TEST(Progress, LogsSparselyWhenNotATerminal) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    Progress p("job", 100, "it", 0, f);
    EXPECT_FALSE(p.is_tty());
    for (int i = 1; i <= 100; i++) p.update(i);  // within the 5 s log interval: only the first draws
    p.finish();
  }
  std::rewind(f);
  std::string all;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f)) all += buf;
  std::fclose(f);
  int lines = 0;
  for (char c : all) lines += c == '\n';
  EXPECT_EQ(lines, 2) << all;
  EXPECT_NE(all.find("job 100/100 100.0%"), std::string::npos) << all;
  EXPECT_EQ(all.find('\r'), std::string::npos);
}

// ------------------------------------------------------------------ shared math

TEST(KvzipMath, FastExpIsAccurate) {
  std::vector<float> x;
  for (double v = -86.9; v <= 0; v += 0.0173) x.push_back((float)v);
  x.push_back(0.0f);
  std::vector<float> y = x;
  exp_nonpositive_inplace(y.data(), (int64_t)y.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); i++) worst = std::max(worst, std::abs(y[i] / std::exp((double)x[i]) - 1.0));
  EXPECT_LT(worst, 1e-6);
  float under[3] = {-88.0f, -1000.0f, -INFINITY};
  exp_nonpositive_inplace(under, 3);
  for (float u : under) EXPECT_EQ(u, 0.0f);
}

// logit_scale 0 = 1/sqrt(D); an explicit one stands for Gemma's query_pre_attn_scalar (1/sqrt(168) on 27B).
void check_column_max(float logit_scale) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.5f, 2.0f);
  const int D = 64, G = 3, n_rows = 37, nk = 90;
  const int64_t visible0 = 54, col0 = 5, n_cols = 60;  // rows see 54.., so the last columns only late rows
  std::vector<float> q((size_t)n_rows * G * D), k((size_t)nk * D), rs(n_rows), cs((size_t)G * n_cols);
  for (auto& v : q) v = 2.0f * nd(rng);
  for (auto& v : k) v = 2.0f * nd(rng);
  for (auto& v : rs) v = ud(rng);
  for (auto& v : cs) v = ud(rng);
  std::vector<float> kt((size_t)D * nk);
  transpose_rows(k.data(), D, nk, D, kt.data());
  ColumnMaxProblem p;
  p.q = q.data();
  p.q_row_stride = G * D;
  p.q_head_stride = D;
  p.n_rows = n_rows;
  p.n_group = G;
  p.head_dim = D;
  p.keys_t = kt.data();
  p.n_keys = nk;
  p.visible0 = visible0;
  p.col0 = col0;
  p.n_cols = n_cols;
  p.row_scale = rs.data();
  p.col_scale = cs.data();
  p.logit_scale = logit_scale;
  const double scale = logit_scale > 0 ? (double)logit_scale : 1.0 / std::sqrt((double)D);
  std::vector<double> ref((size_t)n_cols, 0.0);
  for (int g = 0; g < G; g++)
    for (int j = 0; j < n_rows; j++) {
      const int64_t vis = std::min<int64_t>(nk, visible0 + j);
      std::vector<double> l((size_t)vis);
      double mx = -1e300, sum = 0;
      for (int64_t i = 0; i < vis; i++) {
        double d = 0;
        for (int a = 0; a < D; a++) d += (double)q[((size_t)j * G + g) * D + a] * k[(size_t)i * D + a];
        l[(size_t)i] = d * scale;
        mx = std::max(mx, l[(size_t)i]);
      }
      for (double v : l) sum += std::exp(v - mx);
      for (int64_t c = 0; c < n_cols && col0 + c < vis; c++)
        ref[(size_t)c] = std::max(ref[(size_t)c], std::exp(l[(size_t)(col0 + c)] - mx) / sum * rs[j] * cs[(size_t)g * n_cols + c]);
    }
  std::vector<float> out1((size_t)n_cols), out2((size_t)n_cols);
  ColumnMaxWorkspace ws1, ws2;
  ThreadPool one(1), two(2);
  attention_column_max(p, one, ws1, out1.data());
  attention_column_max(p, two, ws2, out2.data());
  for (int64_t c = 0; c < n_cols; c++) {
    EXPECT_NEAR(out1[(size_t)c], ref[(size_t)c], 1e-5 * ref[(size_t)c] + 1e-30) << "column " << c;
    EXPECT_EQ(out1[(size_t)c], out2[(size_t)c]) << "thread count changed column " << c;
  }
  EXPECT_GT(ref[(size_t)(n_cols - 1)], 0.0);  // the test reaches the causal edge
}

TEST(KvzipMath, ColumnMaxMatchesNaiveDouble) {
  {
    SCOPED_TRACE("default scale");
    check_column_max(0.0f);
  }
  {
    SCOPED_TRACE("model's query scale");
    check_column_max(0.3f);
  }
}

TEST(KvzipMath, NpyHeaderIsWellFormed) {
  const fs::path dir = temp_dir("npy");
  const float v[6] = {1, 2, 3, 4, 5, 6};
  write_npy_f32((dir / "a.npy").string(), v, {2, 3});
  const std::string s = slurp(dir / "a.npy");
  ASSERT_EQ(s.size() % 64, 24u);  // header padded to 64 bytes, then 24 data bytes
  EXPECT_EQ(s.substr(1, 5), "NUMPY");
  EXPECT_NE(s.find("'shape': (2, 3)"), std::string::npos);
  EXPECT_EQ(s[s.size() - 25], '\n');
  float back[6];
  std::memcpy(back, s.data() + s.size() - 24, 24);
  EXPECT_EQ(back[5], 6.0f);
  fs::remove_all(dir);
}

TEST(KvzipMath, DefaultThresholdFile) {
  const fs::path dir = temp_dir("thr");
  EXPECT_FALSE(default_kvzap_threshold(dir.string()).has_value());
  std::ofstream(dir / "kvzap.json") << R"({"default_threshold": -4.5, "target": 0.5})";
  EXPECT_EQ(default_kvzap_threshold(dir.string()).value(), -4.5);
  std::ofstream(dir / "kvzap.json") << R"({"default_threshold": "low"})";
  EXPECT_THROW(default_kvzap_threshold(dir.string()), Error);
  fs::remove_all(dir);
}

TEST(Targets, SamplesDistinctSortedPositions) {
  const auto a = sample_positions(1000, 200, 42);
  ASSERT_EQ(a.size(), 200u);
  for (size_t i = 1; i < a.size(); i++) EXPECT_LT(a[i - 1], a[i]);
  EXPECT_GE(a.front(), 0);
  EXPECT_LT(a.back(), 1000);
  EXPECT_EQ(a, sample_positions(1000, 200, 42));
  EXPECT_NE(a, sample_positions(1000, 200, 43));
  EXPECT_EQ(sample_positions(5, 9, 1), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  // Uniform: the mean of many draws is near the middle.
  double mean = 0;
  for (int64_t v : sample_positions(100000, 20000, 3)) mean += (double)v / 20000;
  EXPECT_NEAR(mean, 50000, 1000);
}

TEST(Targets, StripsLikePython) {
  EXPECT_EQ(strip_text(" \t\n a b \r\n\x0b\x0c"), "a b");
  EXPECT_EQ(strip_text("   "), "");
}

// ------------------------------------------------------------------ with the model

class TargetsModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = find_model();
    if (!fs::exists(path)) return;
    model_ = Model::load(path).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(model_, nullptr) << "default model not found at " << find_model()
                               << ": run `kvzap pull` (or set KVZAP_MODEL)";
  }
  static Session make_session(int64_t ctx) {
    SessionOptions o;
    o.n_threads = 2;
    o.n_ctx = ctx;
    return Session(*model_, o);
  }
  static Model* model_;
};
Model* TargetsModel::model_ = nullptr;

TEST_F(TargetsModel, RepeatPromptSpansAreTheTwoCopies) {
  const Tokenizer& tok = model_->tokenizer();
  const std::string text = "The quick brown fox jumps over the lazy dog.\nIt was 42 degrees.";
  const RepeatPrompt p = build_repeat_prompt(tok, "  \n" + text + " \n");
  const std::vector<int32_t> t = tok.encode(text, false, true);
  ASSERT_EQ(p.n_text(), (int64_t)t.size());
  EXPECT_EQ(std::vector<int32_t>(p.ids.begin() + p.start_prompt, p.ids.begin() + p.end_prompt), t);
  EXPECT_EQ(std::vector<int32_t>(p.ids.begin() + p.start_rep, p.ids.begin() + p.end_rep), t);
  EXPECT_GT(p.start_rep, p.end_prompt);
  // The whole thing is the SmolLM2 template with its default system turn, user then assistant.
  const std::string whole = tok.decode(p.ids);
  EXPECT_EQ(whole.rfind("<|im_start|>system\n", 0), 0u) << whole;
  EXPECT_NE(whole.find("<|im_start|>user\n" + text + "\n\nRepeat the previous context exactly.<|im_end|>\n"
                       "<|im_start|>assistant\n" + text + "<|im_end|>\n"),
            std::string::npos)
      << whole;
  EXPECT_EQ(tok.decode(std::vector<int32_t>(p.ids.begin() + p.end_prompt, p.ids.begin() + p.start_rep)),
            "\n\nRepeat the previous context exactly.<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_THROW(build_repeat_prompt(tok, " \n "), Error);
}

// Qwen2.5's pre-tokenizer joins a final "." with the "\n\n" that follows it in the template, so the text does
// not tokenise on its own as inside the conversation; the spans then come from character offsets.
TEST(RepeatPrompt, SpansFollowCharacterOffsetsWhenATokenCrossesABoundary) {
  const std::string path = kvzap::test::pulled_model_path("Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "SKIPPED: " << path << " not found (kvzap pull qwen2.5-coder-0.5b)";
  const auto tok = Tokenizer::from_gguf(*gguf::File::open(path));
  const std::string text = "It was a truth universally acknowledged.";
  const RepeatPrompt p = build_repeat_prompt(*tok, text);
  const auto piece = [&](int64_t a, int64_t b) {
    return tok->decode(std::vector<int32_t>(p.ids.begin() + a, p.ids.begin() + b));
  };
  // The user's copy ends in the merged ".\n\n"; the assistant's copy ends in "." (then <|im_end|>).
  EXPECT_EQ(piece(p.start_prompt, p.end_prompt), text + "\n\n");
  EXPECT_EQ(piece(p.start_rep, p.end_rep), text);
  EXPECT_EQ(p.n_text(), p.end_rep - p.start_rep);
  EXPECT_EQ(piece(p.end_prompt, p.start_rep), "Repeat the previous context exactly.<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(tok->decode(p.ids), tok->decode(tok->encode(tok->decode(p.ids), false, true)));
}

// Captures every layer's h, q, k, v of a single-step forward.
struct Capture : LayerObserver {
  std::vector<std::vector<float>> h, q, k, v;
  void after_attention(const LayerStep& st, KvCache&) override {
    const ModelConfig& c = model->config();
    const size_t n = (size_t)st.n_tok;
    h.emplace_back(st.h, st.h + n * c.n_embd);
    q.emplace_back(st.q, st.q + n * c.n_head * c.head_dim);
    k.emplace_back(st.k, st.k + n * c.n_head_kv * c.head_dim);
    v.emplace_back(st.v, st.v + n * c.n_head_kv * c.head_dim);
  }
  const Model* model = nullptr;
};

TEST_F(TargetsModel, TargetsMatchANaiveDoublePrecisionComputation) {
  const ModelConfig& c = model_->config();
  const int64_t D = c.head_dim, H = c.n_head, Hkv = c.n_head_kv, G = c.n_group(), E = c.n_embd;
  const RepeatPrompt p = build_repeat_prompt(model_->tokenizer(), "Alice sent Bob 17 apples; Bob ate three of them.");
  const int64_t n = p.n_text(), T = p.end_rep;
  Session s = make_session(256);
  TargetComputer tc(*model_);
  const std::vector<int64_t> sample = {0, 3, n - 1};
  const WindowTargets got = tc.compute(s, p, sample);
  ASSERT_EQ(got.n_text, n);
  ASSERT_EQ(got.x.size(), sample.size() * c.n_layer * E);

  Capture cap;
  cap.model = model_;
  s.reset();
  s.forward().run(p.ids.data(), T, s.cache(), LogitsMode::None, nullptr, &cap);
  ASSERT_EQ((int)cap.h.size(), c.n_layer);

  for (int l : {0, 13, c.n_layer - 1}) {
    // W_O dequantised, [E][H*D], in double.
    const WeightMatrix& wo = model_->weights().layers[l].wo;
    std::vector<float> row((size_t)(H * D));
    std::vector<double> w((size_t)(E * H * D));
    for (int64_t e = 0; e < E; e++) {
      dequantize_row(wo.type, wo.data + (size_t)e * wo.row_stride, row.data(), H * D);
      for (int64_t i = 0; i < H * D; i++) w[(size_t)(e * H * D + i)] = row[(size_t)i];
    }
    const auto& Q = cap.q[(size_t)l];
    const auto& K = cap.k[(size_t)l];
    const auto& V = cap.v[(size_t)l];
    const auto& Hs = cap.h[(size_t)l];
    for (int64_t hk = 0; hk < Hkv; hk++) {
      std::vector<double> best((size_t)n, 0.0);
      for (int64_t g = 0; g < G; g++) {
        const int64_t qh = hk * G + g;
        std::vector<double> vnorm((size_t)n);  // ||W_O^(q) v_i|| by the direct product
        for (int64_t i = 0; i < n; i++) {
          const float* vi = &V[(size_t)((p.start_prompt + i) * Hkv * D + hk * D)];
          double ss = 0;
          for (int64_t e = 0; e < E; e++) {
            double u = 0;
            for (int64_t d = 0; d < D; d++) u += w[(size_t)(e * H * D + qh * D + d)] * vi[d];
            ss += u * u;
          }
          vnorm[(size_t)i] = std::sqrt(ss);
        }
        for (int64_t j = p.start_rep; j < p.end_rep; j++) {
          const float* qj = &Q[(size_t)(j * H * D + qh * D)];
          std::vector<double> a((size_t)(j + 1));
          double mx = -1e300, sum = 0, hn = 0;
          for (int64_t i = 0; i <= j; i++) {
            double d = 0;
            for (int64_t t = 0; t < D; t++) d += (double)qj[t] * K[(size_t)(i * Hkv * D + hk * D + t)];
            a[(size_t)i] = d / std::sqrt((double)D);
            mx = std::max(mx, a[(size_t)i]);
          }
          for (double& x : a) sum += (x = std::exp(x - mx));
          for (int64_t e = 0; e < E; e++) hn += (double)Hs[(size_t)(j * E + e)] * Hs[(size_t)(j * E + e)];
          hn = std::sqrt(hn);
          for (int64_t i = 0; i < n; i++)
            best[(size_t)i] = std::max(best[(size_t)i], a[(size_t)(p.start_prompt + i)] / sum * vnorm[(size_t)i] / hn);
        }
      }
      for (int64_t i = 0; i < n; i++)
        EXPECT_NEAR(got.log_score(l, (int)hk, i), std::log(std::max(best[(size_t)i], 1e-30)), 1e-4)
            << "layer " << l << " head " << hk << " position " << i;
    }
    for (size_t si = 0; si < sample.size(); si++)
      for (int64_t e = 0; e < E; e++)
        ASSERT_EQ(got.x[(si * c.n_layer + l) * E + e], Hs[(size_t)((p.start_prompt + sample[si]) * E + e)]);
  }
  // A session that cannot take the prompt in one step is refused.
  SessionOptions small;
  small.n_threads = 1;
  small.n_ctx = 256;
  small.n_batch = 16;
  Session s2(*model_, small);
  EXPECT_THROW(tc.compute(s2, p, sample), Error);
}

// A small corpus: two "sources" of numbered sentences in paragraphs.
std::vector<std::string> write_corpus(const fs::path& dir) {
  std::vector<std::string> docs;
  const char* words[] = {"river", "stone", "lamp", "garden", "window", "letter", "market", "winter"};
  for (const char* src : {"alpha", "beta"}) {
    fs::create_directories(dir / src);
    for (int d = 0; d < 3; d++) {
      const fs::path f = dir / src / (std::string(src) + "_" + std::to_string(d) + ".txt");
      std::ofstream out(f);
      for (int para = 0; para < 12; para++) {
        for (int line = 0; line < 2; line++)
          out << "The " << words[(para + d) % 8] << " number " << para * 10 + line << " of " << src << " is "
              << words[(line + para * 3) % 8] << ".\n";
        out << "\n";
      }
      docs.push_back(f.string());
    }
  }
  return docs;
}

TEST_F(TargetsModel, WindowsAreInRangeDeterministicAndExtendable) {
  const fs::path dir = temp_dir("windows");
  const auto docs = write_corpus(dir);
  WindowOptions o;
  o.min_tokens = 30;
  o.max_tokens = 45;
  o.seed = 5;
  const Tokenizer& tok = model_->tokenizer();
  const auto w5 = cut_windows(tok, docs, 5, o);
  const auto w3 = cut_windows(tok, docs, 3, o);
  ASSERT_EQ(w5.size(), 5u);
  ASSERT_EQ(w3.size(), 3u);
  for (size_t i = 0; i < w5.size(); i++) {
    EXPECT_EQ(w5[i].id, i);
    const int64_t n = (int64_t)tok.encode(w5[i].text, false, true).size();
    EXPECT_EQ(n, w5[i].n_tokens);
    EXPECT_GE(n, o.min_tokens);
    EXPECT_LE(n, o.max_tokens);
    EXPECT_NE(slurp(w5[i].doc).find(w5[i].text), std::string::npos);
    if (i < 3) EXPECT_EQ(w3[i].text, w5[i].text);
  }
  EXPECT_NE(w5[0].source, w5[1].source);  // sources alternate
  o.seed = 6;
  const auto other = cut_windows(tok, docs, 5, o);
  bool differs = false;
  for (size_t i = 0; i < 5; i++) differs |= other[i].text != w5[i].text;
  EXPECT_TRUE(differs);
  fs::remove_all(dir);
}

TEST_F(TargetsModel, CollectionResumesToTheSameFile) {
  const fs::path dir = temp_dir("collect");
  const auto docs = write_corpus(dir / "corpus");
  WindowOptions wo;
  wo.min_tokens = 24;
  wo.max_tokens = 36;
  const auto windows = cut_windows(model_->tokenizer(), docs, 4, wo);
  ASSERT_EQ(windows.size(), 4u);
  CollectOptions co;
  co.tokens_per_window = 6;
  co.seed = 9;
  co.settings = R"({"test": 1})";
  Session s = make_session(160);
  TargetComputer tc(*model_);

  // Uninterrupted reference run.
  const std::string full = (dir / "full.kvzd").string();
  const CollectReport r0 = collect_targets(s, tc, windows, full, co);
  EXPECT_EQ(r0.windows_done, 4);
  EXPECT_EQ(r0.records, 24);
  EXPECT_FALSE(r0.stopped);

  // Interrupted after two windows (the callback says stop), then the same call again.
  const std::string part = (dir / "part.kvzd").string();
  int calls = 0;
  const CollectReport r1 = collect_targets(s, tc, windows, part, co, [&](const CollectEvent& ev) {
    return ev.window == nullptr || ++calls < 2;
  });
  EXPECT_TRUE(r1.stopped);
  EXPECT_EQ(r1.records, 12);
  const CollectReport r2 = collect_targets(s, tc, windows, part, co);
  EXPECT_EQ(r2.windows_resumed, 2);
  EXPECT_EQ(r2.records, 24);
  EXPECT_EQ(slurp(part), slurp(full));

  // Torn write: the file ends inside window 2 (3 of its 6 records, then half a record).
  const std::string torn = (dir / "torn.kvzd").string();
  {
    const Dataset ref = Dataset::open(full);
    DatasetWriter w = DatasetWriter::create(torn, ref.shape());
    std::vector<float> x((size_t)ref.n_layers() * ref.d_model());
    for (int64_t i = 0; i < 15; i++) {
      for (int l = 0; l < ref.n_layers(); l++) ref.x_row(i, l, &x[(size_t)l * ref.d_model()]);
      w.append(ref.group(i), ref.position(i), x.data(), ref.y_record(i));
    }
    w.flush();
  }
  fs::resize_file(torn, fs::file_size(torn) + 100);  // a partial record
  fs::copy_file(full + ".json", torn + ".json");
  const CollectReport r3 = collect_targets(s, tc, windows, torn, co);
  EXPECT_TRUE(r3.dropped_partial);
  EXPECT_EQ(r3.windows_resumed, 2);
  EXPECT_EQ(r3.records, 24);
  {
    // Same records as the reference (f16 inputs decode to the same floats).
    const Dataset a = Dataset::open(full), b = Dataset::open(torn);
    ASSERT_EQ(a.size(), b.size());
    std::vector<float> xa((size_t)a.d_model()), xb((size_t)a.d_model());
    for (int64_t i = 0; i < a.size(); i++) {
      EXPECT_EQ(a.group(i), b.group(i));
      EXPECT_EQ(a.position(i), b.position(i));
      for (int l = 0; l < a.n_layers(); l += 7) {
        a.x_row(i, l, xa.data());
        b.x_row(i, l, xb.data());
        ASSERT_EQ(xa, xb);
        for (int h = 0; h < a.n_heads(); h++) ASSERT_EQ(a.y(i, l, h), b.y(i, l, h));
      }
    }
  }

  // Each window's records are the sampled positions of that window.
  const Dataset d = Dataset::open(full);
  for (int64_t i = 0; i < d.size(); i++) {
    EXPECT_EQ(d.group(i), (uint32_t)(i / 6));
    EXPECT_LT(d.position(i), (uint32_t)windows[(size_t)(i / 6)].n_tokens);
  }
  // Different settings are refused instead of mixing records.
  co.settings = R"({"test": 2})";
  EXPECT_THROW(collect_targets(s, tc, windows, full, co), Error);
  fs::remove_all(dir);
}

}  // namespace
