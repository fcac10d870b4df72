// The many-sequence engine: batched steps give what each sequence gets alone, copy-on-write forks,
// the shared page budget, and no allocation on the decode path.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/page_pool.h"
#include "engine/engine.h"
#include "engine/session.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "press/press.h"
#include "test_support.h"

// Allocation counter for the hot-path test: every operator new in this binary goes through here.
namespace {
std::atomic<bool> g_count_allocs{false};
std::atomic<int64_t> g_allocs{0};
}  // namespace

void* operator new(std::size_t n) {
  if (g_count_allocs.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace {

using namespace kvzap;

class EngineTest : public test::DefaultModelTest {
 protected:
  static EngineOptions options(int64_t n_batch, int64_t budget = 0, KvType kv_type = KvType::F16) {
    EngineOptions o;
    o.kv_type = kv_type;
    o.n_threads = 2;
    o.n_ctx = 1024;
    o.n_batch = n_batch;
    o.kv_budget_bytes = budget > 0 ? budget : ((int64_t)1 << 30);
    return o;
  }
  // Distinct prompts of different lengths cut from the golden English text.
  static std::vector<int32_t> prompt(int index, int64_t n_tokens) {
    static const std::string text = test::slurp(std::string(KVZAP_SOURCE_DIR) + "/tests/golden/texts/english.txt");
    const std::vector<int32_t> all = model_->tokenizer().encode(text, true);
    std::vector<int32_t> p;
    p.push_back(all[0]);
    for (int64_t i = 0; (int64_t)p.size() < n_tokens; i++) p.push_back(all[1 + (index * 97 + i) % (all.size() - 1)]);
    return p;
  }
  static PressSpec press_kind(int kind) {
    PressSpec o;
    if (kind == 1) {  // KVzap-MLP, pruning while decoding (small window so decoding really evicts)
      o.name = "kvzap-mlp";
      o.has_threshold = true;
      o.threshold = -4;
      o.window = 16;
      o.decoding = true;
    } else if (kind == 2) {
      o.name = "knorm";
      o.has_ratio = true;
      o.ratio = 0.5;
    }
    return o;
  }
  static std::unique_ptr<Press> make(int kind) { return kind == 0 ? nullptr : make_press(press_kind(kind), *model_); }
  static double logprob(const float* logits, int32_t id) {
    const int V = model_->config().n_vocab;
    const float mx = *std::max_element(logits, logits + V);
    double s = 0;
    for (int i = 0; i < V; i++) s += std::exp((double)logits[i] - mx);
    return (double)logits[id] - mx - std::log(s);
  }
  static std::vector<std::vector<int64_t>> lengths(const KvCache& c) {
    std::vector<std::vector<int64_t>> r((size_t)c.n_layer(), std::vector<int64_t>((size_t)c.n_head_kv()));
    for (int l = 0; l < c.n_layer(); l++)
      for (int h = 0; h < c.n_head_kv(); h++) r[l][h] = c.length(l, h);
    return r;
  }
  // Batched steps (chunked prefills sharing steps with decodes) give what each sequence gets alone.
  static void batched_equals_alone(KvType type);
};

struct Trace {
  std::vector<int32_t> tokens;
  std::vector<double> logprobs;
  std::vector<std::vector<int64_t>> lengths;
};

TEST_F(EngineTest, BatchedStepsGiveWhatEachSequenceGetsAlone) { batched_equals_alone(KvType::F16); }

// The same with f32 caches (--kv-type f32), presses included (KVzap-MLP while decoding, KNorm).
TEST_F(EngineTest, BatchedStepsGiveWhatEachSequenceGetsAloneF32) { batched_equals_alone(KvType::F32); }

// The same with quantised caches (--kv-type q8_0 / q4_0): rows are quantised alone, so batching
// cannot change them.
TEST_F(EngineTest, BatchedStepsGiveWhatEachSequenceGetsAloneQ8_0) { batched_equals_alone(KvType::Q8_0); }
TEST_F(EngineTest, BatchedStepsGiveWhatEachSequenceGetsAloneQ4_0) { batched_equals_alone(KvType::Q4_0); }

void EngineTest::batched_equals_alone(KvType type) {
  auto options = [&](int64_t n_batch) { return EngineTest::options(n_batch, 0, type); };
  constexpr int kSeqs = 8, kDecode = 12;
  const int64_t lens[kSeqs] = {40, 150, 90, 300, 17, 210, 64, 130};
  const int kinds[kSeqs] = {0, 1, 2, 0, 1, 2, 1, 0};
  const int V = model_->config().n_vocab;

  // Alone: each sequence on its own, prefill in one step, then greedy decoding.
  std::vector<Trace> alone(kSeqs);
  {
    Engine engine(*model_, options(1024));
    for (int s = 0; s < kSeqs; s++) {
      auto seq = engine.new_sequence();
      seq->set_press(make(kinds[s]));
      const std::vector<int32_t> p = prompt(s, lens[s]);
      seq->begin_context();
      engine.feed(*seq, p.data(), (int64_t)p.size());
      seq->end_context(p);
      for (int i = 0; i < kDecode; i++) {
        const int32_t id = Sampler::argmax(seq->logits(), V);
        alone[s].tokens.push_back(id);
        alone[s].logprobs.push_back(logprob(seq->logits(), id));
        engine.feed(*seq, &id, 1);
      }
      alone[s].lengths = lengths(seq->cache());
    }
  }

  // Together: prompts prefilled in chunks of at most 64 tokens that share steps with the other
  // sequences' decode tokens (at most 160 tokens a step), as a continuous-batching scheduler does.
  Engine engine(*model_, options(160));
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> fed(kSeqs, 0);  // prompt tokens fed
  std::vector<int> dec_fed(kSeqs, 0);    // generated tokens fed back
  std::vector<Trace> together(kSeqs);
  std::vector<int32_t> next(kSeqs, -1);
  for (int s = 0; s < kSeqs; s++) {
    seqs.push_back(engine.new_sequence());
    seqs[s]->set_press(make(kinds[s]));
    prompts.push_back(prompt(s, lens[s]));
    seqs[s]->begin_context();
  }
  auto record = [&](int s) {
    const int32_t id = Sampler::argmax(seqs[s]->logits(), V);
    together[s].tokens.push_back(id);
    together[s].logprobs.push_back(logprob(seqs[s]->logits(), id));
    next[s] = id;
  };
  int steps = 0;
  for (;;) {
    std::vector<Segment> segs;
    std::vector<int> owner;
    int64_t budget = 160;
    for (int s = 0; s < kSeqs && budget > 0; s++) {
      Segment g;
      g.seq = seqs[s].get();
      if (fed[s] < (int64_t)prompts[s].size()) {
        const int64_t m = std::min<int64_t>({64, budget, (int64_t)prompts[s].size() - fed[s]});
        g.tokens = prompts[s].data() + fed[s];
        g.n = m;
        g.logits = fed[s] + m == (int64_t)prompts[s].size() ? LogitsMode::Last : LogitsMode::None;
      } else if (dec_fed[s] < kDecode) {
        g.tokens = &next[s];
        g.n = 1;
      } else {
        continue;
      }
      budget -= g.n;
      segs.push_back(g);
      owner.push_back(s);
    }
    if (segs.empty()) break;
    engine.step(segs);
    steps++;
    for (size_t i = 0; i < segs.size(); i++) {
      ASSERT_EQ(segs[i].status, SegmentStatus::Ok);
      const int s = owner[i];
      if (fed[s] < (int64_t)prompts[s].size()) {
        fed[s] += segs[i].n;
        if (fed[s] < (int64_t)prompts[s].size()) continue;
        seqs[s]->end_context(prompts[s]);
        record(s);
      } else if (++dec_fed[s] < kDecode) {
        record(s);
      }
    }
  }
  EXPECT_GT(steps, 8);
  for (int s = 0; s < kSeqs; s++) {
    together[s].lengths = lengths(seqs[s]->cache());
    EXPECT_EQ(together[s].tokens, alone[s].tokens) << "sequence " << s;
    double worst = 0;
    for (int i = 0; i < kDecode; i++) worst = std::max(worst, std::abs(together[s].logprobs[i] - alone[s].logprobs[i]));
    EXPECT_LE(worst, 1e-4) << "sequence " << s;
    EXPECT_EQ(together[s].lengths, alone[s].lengths) << "sequence " << s;
    EXPECT_EQ(seqs[s]->cache().kv_type(), type);
  }
  // The presses really pruned (kinds 1 and 2), so the comparison covers eviction too.
  EXPECT_GT(seqs[1]->cache().evicted_fraction(), 0.05);
  EXPECT_GT(seqs[2]->cache().evicted_fraction(), 0.4);
}

TEST_F(EngineTest, ForksSharePagesAndPruneIndependently) {
  Engine engine(*model_, options(512));
  auto base = engine.new_sequence();
  base->set_press(make(1));  // KVzap-MLP with decoding pruning
  const std::vector<int32_t> p = prompt(3, 400);
  base->begin_context();
  engine.feed(*base, p.data(), (int64_t)p.size());
  base->end_context(p);
  const int64_t base_bytes = engine.pages().bytes_in_use();
  EXPECT_EQ(base_bytes, base->cache().bytes_resident());

  auto a = base->fork();
  auto b = base->fork();
  // Forks share every page: the pool counts them once.
  EXPECT_EQ(engine.pages().bytes_in_use(), base_bytes);
  EXPECT_EQ(a->cache().bytes_resident(), base_bytes);
  EXPECT_EQ(a->cache().bytes_exclusive(), 0);
  ASSERT_NE(a->press(), nullptr);  // a decoding press is copied with its window state

  auto snapshot = [](const KvCache& c) {
    std::vector<int32_t> pos;
    std::vector<uint16_t> keys;
    for (int l = 0; l < c.n_layer(); l++)
      for (int h = 0; h < c.n_head_kv(); h++)
        for (int64_t i = 0; i < c.length(l, h); i++) {
          pos.push_back(c.position_at(l, h, i));
          keys.insert(keys.end(), c.key_at(l, h, i), c.key_at(l, h, i) + c.head_dim());
        }
    return std::make_pair(pos, keys);
  };
  const auto b_before = snapshot(b->cache());
  const auto base_before = snapshot(base->cache());
  // Decode 40 tokens in fork a: its press evicts (window 16), appends and evictions copy pages.
  const int V = model_->config().n_vocab;
  const int64_t kept_before = a->cache().entries_kept();
  for (int i = 0; i < 40; i++) {
    const int32_t id = Sampler::argmax(a->logits(), V);
    engine.feed(*a, &id, 1);
  }
  EXPECT_LT(a->cache().entries_kept(), kept_before + 40 * a->cache().n_layer() * a->cache().n_head_kv());
  EXPECT_EQ(snapshot(b->cache()), b_before);
  EXPECT_EQ(snapshot(base->cache()), base_before);
  EXPECT_GT(engine.pages().bytes_in_use(), base_bytes);
  // Dropping a frees only its own pages.
  const int64_t a_own = a->cache().bytes_exclusive();
  EXPECT_GT(a_own, 0);
  const int64_t before_drop = engine.pages().bytes_in_use();
  a.reset();
  EXPECT_EQ(engine.pages().bytes_in_use(), before_drop - a_own);
  EXPECT_EQ(engine.pages().bytes_in_use(), base_bytes);
  EXPECT_EQ(snapshot(b->cache()), b_before);
  b.reset();
  base.reset();
  EXPECT_EQ(engine.pages().bytes_in_use(), 0);
}

TEST_F(EngineTest, AnswersOnForksOfOneContextAreIdentical) {
  // The kvpress pipeline on a compressed context with decoding pruning: the same question twice gives
  // the same answer, because each question runs on its own fork.
  Session s(*model_, SessionOptions{2, 1024, 0, -1});
  std::unique_ptr<Press> press = make(1);
  const std::vector<int32_t> ctx = prompt(5, 500);
  s.prefill_context(ctx, press.get());
  GenerateOptions g;
  g.max_new_tokens = 60;
  g.sampling.temperature = 0;
  g.stop_at_eog = false;
  const std::vector<int32_t> q = model_->tokenizer().encode("\n\nWhat happened next?\n", false, true);
  std::vector<GenerateResult> answers;
  for (int i = 0; i < 2; i++) {
    auto fork = s.sequence().fork();
    answers.push_back(Session::generate_on(*fork, q, g));
    EXPECT_GT(fork->cache().evicted_fraction(), 0.0);
  }
  EXPECT_EQ(answers[0].tokens, answers[1].tokens);
  EXPECT_EQ(answers[0].text, answers[1].text);
  EXPECT_EQ(answers[0].tokens.size(), 60u);
}

TEST_F(EngineTest, BudgetRefusesTheSequenceThatDoesNotFitAndAccountingReturnsToZero) {
  const ModelConfig& c = model_->config();
  constexpr int kFit = 3;
  const int64_t T = 100;
  const int64_t pages_per_seq = (int64_t)c.n_layer * c.n_head_kv * ((T + 15) / 16);
  const int64_t budget = kFit * pages_per_seq * KvCache::page_bytes_for(c.head_dim);
  Engine engine(*model_, options(512, budget));
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (int s = 0; s < kFit; s++) {
    seqs.push_back(engine.new_sequence());
    const std::vector<int32_t> p = prompt(s, T);
    EXPECT_EQ(seqs.back()->cache().pages_needed(T), pages_per_seq);
    engine.feed(*seqs.back(), p.data(), T);
  }
  EXPECT_EQ(engine.pages().bytes_in_use(), budget);
  EXPECT_EQ(engine.pages().pages_available(), 0);
  // Sequence N+1: the step skips it with a status; feed throws the budget error; nothing crashes.
  auto extra = engine.new_sequence();
  const std::vector<int32_t> p = prompt(9, T);
  Segment g;
  g.seq = extra.get();
  g.tokens = p.data();
  g.n = T;
  engine.step(std::span<Segment>(&g, 1));
  EXPECT_EQ(g.status, SegmentStatus::OutOfKvMemory);
  EXPECT_EQ(extra->n_past(), 0);
  EXPECT_THROW(engine.feed(*extra, p.data(), T), KvBudgetExceeded);
  EXPECT_LE(engine.pages().bytes_in_use(), budget);
  // A running sequence's next token does not fit either (its last pages are full: 100 = 6*16 + 4,
  // so one more token fits in the partly filled pages).
  const int32_t id = 42;
  Segment d;
  d.seq = seqs[0].get();
  d.tokens = &id;
  d.n = 1;
  engine.step(std::span<Segment>(&d, 1));
  EXPECT_EQ(d.status, SegmentStatus::Ok);
  // Freed pages are reused at once by another sequence.
  seqs[1].reset();
  EXPECT_NO_THROW(engine.feed(*extra, p.data(), T));
  seqs.clear();
  extra.reset();
  EXPECT_EQ(engine.pages().bytes_in_use(), 0);
  EXPECT_EQ(engine.pages().pages_in_use(), 0);
}

TEST_F(EngineTest, DecodeStepsAllocateNothingAfterWarmUp) {
  // kind 0: no press, 1: KVzap-MLP while decoding, 2: no press over a q8_0 cache (quantising on append).
  for (int kind : {0, 1, 2}) {
    Engine engine(*model_, options(256, 0, kind == 2 ? KvType::Q8_0 : KvType::F16));
    std::vector<std::unique_ptr<Sequence>> seqs;
    std::vector<std::vector<int32_t>> prompts;
    for (int s = 0; s < 4; s++) {
      seqs.push_back(engine.new_sequence());
      seqs[s]->set_press(make(kind == 1 ? 1 : 0));
      prompts.push_back(prompt(s, 100 + 20 * s));
      seqs[s]->begin_context();
      engine.feed(*seqs[s], prompts[s].data(), (int64_t)prompts[s].size());
      seqs[s]->end_context(prompts[s]);
    }
    const int V = model_->config().n_vocab;
    std::vector<int32_t> ids(4);
    std::vector<Segment> segs(4);
    auto decode = [&](int n_steps) {
      for (int i = 0; i < n_steps; i++) {
        for (int s = 0; s < 4; s++) {
          ids[s] = Sampler::argmax(seqs[s]->logits(), V);
          segs[s] = Segment{};
          segs[s].seq = seqs[s].get();
          segs[s].tokens = &ids[s];
          segs[s].n = 1;
        }
        engine.step(segs);
      }
    };
    decode(48);  // warm-up: buffers reach their size, pages go through the free list
    for (int s = 0; s < 4; s++) seqs[s]->rewind((int64_t)prompts[s].size() + 8);
    g_allocs = 0;
    g_count_allocs = true;
    decode(32);
    g_count_allocs = false;
    EXPECT_EQ(g_allocs.load(), 0) << (kind == 1 ? "kvzap-mlp decoding press" : kind == 2 ? "q8_0 cache" : "no press");
  }
}

TEST(PagePool, ReferenceCountsAndBudget) {
  PagePool pool(1000, 3000);
  uint8_t* a = pool.take();
  uint8_t* b = pool.take();
  uint8_t* c = pool.take();
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(pool.take(), nullptr);  // the budget holds three pages
  EXPECT_EQ(pool.pages_available(), 0);
  pool.ref(a);
  EXPECT_EQ(pool.refcount(a), 2);
  pool.unref(a);
  EXPECT_EQ(pool.pages_in_use(), 3);  // still held once
  pool.unref(a);
  EXPECT_EQ(pool.pages_in_use(), 2);
  uint8_t* d = pool.take();
  EXPECT_EQ(d, a);  // reused from the free list at once
  uint8_t* e = pool.take_forced();  // copy-on-write may overshoot
  ASSERT_NE(e, nullptr);
  EXPECT_TRUE(pool.over_budget());
  for (uint8_t* p : {b, c, d, e}) pool.unref(p);
  EXPECT_EQ(pool.bytes_in_use(), 0);
  EXPECT_EQ(pool.peak_bytes(), 4000);
}

TEST(ByteSize, ParsesUnitsAndRejectsGarbage) {
  EXPECT_EQ(parse_byte_size("512MiB"), 512ll << 20);
  EXPECT_EQ(parse_byte_size("2G"), 2ll << 30);
  EXPECT_EQ(parse_byte_size("1.5GiB"), 3ll << 29);
  EXPECT_EQ(parse_byte_size("1000000"), 1000000);
  EXPECT_THROW(parse_byte_size("lots"), Error);
  EXPECT_THROW(parse_byte_size("12XB"), Error);
  EXPECT_THROW(parse_byte_size("-5M"), Error);
  EXPECT_THROW(parse_byte_size(""), Error);
}

}  // namespace
namespace {
TEST_F(EngineTest, PromptChunkingDoesNotChangeLogits) {
  const int V = model_->config().n_vocab;
  const std::vector<int32_t> p = prompt(3, 300);
  for (int64_t nb : {1024, 64, 16, 128}) {
    Engine engine(*model_, options(nb));
    auto seq = engine.new_sequence();
    engine.feed(*seq, p.data(), 300);
    static std::vector<float> ref;
    if (ref.empty()) ref.assign(seq->logits(), seq->logits() + V);
    double worst = 0;
    for (int i = 0; i < V; i++) worst = std::max(worst, (double)std::abs(ref[i] - seq->logits()[i]));
    EXPECT_EQ(worst, 0.0) << "n_batch " << nb;
  }
}

// f32 caches: one-step prefill, chunks and token-by-token decoding give bit-identical logits, which
// differ from the f16 cache's.
TEST_F(EngineTest, PromptChunkingAndDecodingDoNotChangeLogitsF32) {
  const int V = model_->config().n_vocab;
  const std::vector<int32_t> p = prompt(3, 200);
  std::vector<float> ref;
  for (int64_t nb : {1024, 64, 16, 1}) {
    Engine engine(*model_, options(nb, 0, KvType::F32));
    auto seq = engine.new_sequence();
    engine.feed(*seq, p.data(), 200);
    if (ref.empty()) ref.assign(seq->logits(), seq->logits() + V);
    double worst = 0;
    for (int i = 0; i < V; i++) worst = std::max(worst, (double)std::abs(ref[i] - seq->logits()[i]));
    EXPECT_EQ(worst, 0.0) << "n_batch " << nb;
  }
  Engine engine(*model_, options(1024));
  auto seq = engine.new_sequence();
  engine.feed(*seq, p.data(), 200);
  double diff = 0;
  for (int i = 0; i < V; i++) diff = std::max(diff, (double)std::abs(ref[i] - seq->logits()[i]));
  EXPECT_GT(diff, 0.0);
}
}
namespace {
// A long context decoded alone spreads each KV head's pages over the threads (Forward's split attention);
// with enough other sequences in the step it does not, and on one thread never. All three must give the
// same logits bit for bit, with and without a press that prunes streams to different lengths.
TEST_F(EngineTest, SplitAttentionGivesWhatUnsplitAttentionGives) {
  const int V = model_->config().n_vocab;
  const std::vector<int32_t> p = prompt(5, 760);
  constexpr int kDecode = 5;
  for (int kind : {0, 1}) {
    // The context is prefilled once per engine (the long part of this test under TSan in CI); a fork of
    // it decodes among `companions` other sequences, so its decode steps attend unsplit.
    auto run = [&](int threads, const std::vector<int>& companion_counts) {
      EngineOptions o = options(1024);
      o.n_threads = threads;
      Engine engine(*model_, o);
      auto context = engine.new_sequence();
      context->set_press(make(kind));
      context->begin_context();
      engine.feed(*context, p.data(), (int64_t)p.size());
      context->end_context(p);
      std::vector<std::vector<float>> traces;
      for (int companions : companion_counts) {
        std::vector<std::unique_ptr<Sequence>> others;
        std::vector<int32_t> other_next(companions);
        for (int c = 0; c < companions; c++) {
          others.push_back(engine.new_sequence());
          const std::vector<int32_t> pc = prompt(c, 20);
          engine.feed(*others.back(), pc.data(), (int64_t)pc.size());
        }
        auto seq = context->fork();
        std::vector<float> trace;
        for (int i = 0; i < kDecode; i++) {
          trace.insert(trace.end(), seq->logits(), seq->logits() + V);
          int32_t id = Sampler::argmax(seq->logits(), V);
          std::vector<Segment> segs(1 + companions);
          segs[0].seq = seq.get(); segs[0].tokens = &id; segs[0].n = 1;
          for (int c = 0; c < companions; c++) {
            other_next[c] = Sampler::argmax(others[c]->logits(), V);
            segs[1 + c].seq = others[c].get(); segs[1 + c].tokens = &other_next[c]; segs[1 + c].n = 1;
          }
          engine.step(segs);
          for (const Segment& g : segs) EXPECT_EQ(g.status, SegmentStatus::Ok);
        }
        trace.insert(trace.end(), seq->logits(), seq->logits() + V);
        traces.push_back(std::move(trace));
      }
      return traces;
    };
    const std::vector<std::vector<float>> two_threads = run(2, {0, 3});
    const std::vector<float>& split = two_threads[0];
    const std::vector<float>& batched = two_threads[1];
    const std::vector<float> one_thread = run(1, {0})[0];
    ASSERT_EQ(split.size(), batched.size());
    ASSERT_EQ(split.size(), one_thread.size());
    double worst_b = 0, worst_1 = 0;
    for (size_t i = 0; i < split.size(); i++) {
      worst_b = std::max(worst_b, (double)std::abs(split[i] - batched[i]));
      worst_1 = std::max(worst_1, (double)std::abs(split[i] - one_thread[i]));
    }
    EXPECT_EQ(worst_b, 0.0) << "press kind " << kind;
    EXPECT_EQ(worst_1, 0.0) << "press kind " << kind;
  }
}

TEST_F(EngineTest, OtherSequencesInTheStepDoNotChangeLogits) {
  const int V = model_->config().n_vocab;
  const std::vector<int32_t> p = prompt(3, 64), q = prompt(4, 40);
  std::vector<float> ref;
  {
    Engine engine(*model_, options(512));
    auto seq = engine.new_sequence();
    engine.feed(*seq, p.data(), 64);
    ref.assign(seq->logits(), seq->logits() + V);
  }
  for (int extra : {1, 3, 17, 40}) {
    Engine engine(*model_, options(512));
    auto a = engine.new_sequence(), b = engine.new_sequence();
    Segment s[2];
    s[0].seq = b.get(); s[0].tokens = q.data(); s[0].n = extra;
    s[1].seq = a.get(); s[1].tokens = p.data(); s[1].n = 64;
    engine.step(std::span<Segment>(s, 2));
    double worst = 0;
    for (int i = 0; i < V; i++) worst = std::max(worst, (double)std::abs(ref[i] - a->logits()[i]));
    EXPECT_EQ(worst, 0.0) << extra << " tokens of another sequence in the step";
  }
}
}

namespace {
// The issue as a new user met it: the same question twice on a compressed context with decoding
// pruning must give the same answer twice.
TEST(EngineCli, SameQuestionTwiceOnACompressedContextGivesTheSameAnswer) {
  const std::string text = kvzap::test::slurp(std::string(KVZAP_SOURCE_DIR) + "/tests/golden/texts/english.txt");
  const std::string ctx_path = (std::filesystem::temp_directory_path() / ("kvzap_ctx_" + std::to_string(::getpid()) + ".txt")).string();
  {
    std::ofstream f(ctx_path);
    f << text.substr(0, 7000);  // about 1,500 tokens
  }
  const auto r = kvzap::test::run_kvzap("generate --chat --context-file '" + ctx_path +
                                        "' --press kvzap-mlp --decode-press --question 'Summarize the text.' "
                                        "--question 'Summarize the text.' -n 120 --temp 0 -t 2 --json");
  std::filesystem::remove(ctx_path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["answers"].size(), 2u);
  EXPECT_GT(j["n_context_tokens"].get<int64_t>(), 1200);
  EXPECT_FALSE(j["answers"][0]["text"].get<std::string>().empty());
  EXPECT_EQ(j["answers"][0]["text"], j["answers"][1]["text"]);
  EXPECT_GT(j["evicted_fraction"].get<double>(), 0.3);
}
}  // namespace
