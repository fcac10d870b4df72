// Shared-prefill evaluation (engine/context_recording.h): a context prefilled once without a press and
// replayed under any press gives the cache, evictions and logits of prefilling it under that press, bit
// for bit; so a sweep can judge one prefill with every press of its grid.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/context_recording.h"
#include "engine/engine.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "press/press.h"
#include "replay_check.h"
#include "test_support.h"

namespace {

using namespace kvzap;

const Model& model() {
  static std::unique_ptr<Model> m = [] {
    const std::string path = test::default_model_path();
    return std::filesystem::exists(path) ? Model::load(path) : nullptr;
  }();
  if (!m) throw std::runtime_error("model not found at " + test::default_model_path() + " (run `kvzap pull`)");
  return *m;
}

std::vector<int32_t> text_tokens(size_t skip, size_t n) {
  static const std::string text = test::slurp(std::string(KVZAP_SOURCE_DIR) + "/tests/golden/texts/english.txt");
  const std::vector<int32_t> all = model().tokenizer().encode(text, true);
  std::vector<int32_t> t{all[0]};
  for (size_t i = 0; t.size() < n; i++) t.push_back(all[1 + (skip + i) % (all.size() - 1)]);
  return t;
}

EngineOptions engine_options(int64_t n_batch) {
  EngineOptions o;
  o.n_threads = 2;
  o.n_ctx = 1024;
  o.n_batch = n_batch;
  o.kv_budget_bytes = (int64_t)1 << 30;
  return o;
}

// Every press of the registry under the ratio policy (kvpress's budget split), and the per-token ones
// under the threshold policy as well, pruning while decoding with a small window.
std::vector<PressSpec> every_press() {
  std::vector<PressSpec> out;
  for (const ScorerEntry* entry : test::presses_under_test()) {
    const ScorerEntry& e = *entry;
    PressSpec r;
    r.name = e.name;
    test::give_budget(r, 0.5);
    r.ratio_scope = e.name == "kvzip" || e.name == "kvzip+" ? "global" : "head";
    out.push_back(r);
    if (!e.supports_threshold) continue;
    PressSpec t;
    t.name = e.name;
    t.has_threshold = true;
    t.threshold = e.name == "random" ? 0.5 : e.name == "knorm" ? 0.0 : -4.0;  // knorm: -||k|| < 0 evicts all it judges
    t.window = 16;
    t.decoding = true;
    out.push_back(t);
  }
  return out;
}

TEST(ContextRecording, ReplayUnderEveryPressMatchesAPrefill) {
  const std::vector<int32_t> context = text_tokens(0, 160), question = text_tokens(900, 16);
  int n = 0;
  // The context as one step (how the sweep prefills) under every press, and in 64-token chunks under
  // the presses that watch every step (KVzip's repeat pass needs the whole context in one batch).
  for (int64_t n_batch : {(int64_t)512, (int64_t)64}) {
    for (const PressSpec& po : every_press()) {
      if (n_batch < 512 && !po.has_threshold && po.name != "snapkv" && po.name != "observed_attention") continue;
      SCOPED_TRACE(po.name + (po.has_threshold ? " threshold" : " ratio") + " n_batch " + std::to_string(n_batch));
      const double evicted = test::expect_replay_matches_prefill(model(), engine_options(n_batch), po, context, question);
      EXPECT_GT(evicted, 0.0);  // the press really pruned, so the comparison covers its evictions
      n++;
    }
  }
  if (test::every_press_under_test()) EXPECT_GE(n, 20 + 6);
}

TEST(ContextRecording, ReplayNeedsABegunEmptySequenceAndRespectsTheBudget) {
  const std::vector<int32_t> context = text_tokens(0, 200);
  Engine engine(model(), engine_options(512));
  auto base = engine.new_sequence();
  ContextRecording rec(model().config());
  engine.prefill_recorded(*base, context, rec);
  EXPECT_EQ(rec.bytes(), ContextRecording::bytes_for(model().config(), (int64_t)context.size()));
  auto seq = engine.new_sequence();
  EXPECT_THROW(engine.replay(*seq, rec), Error);  // no begin_context
  seq->begin_context();
  engine.replay(*seq, rec);
  EXPECT_EQ(seq->n_past(), (int64_t)context.size());
  EXPECT_THROW(engine.replay(*seq, rec), Error);  // not empty any more
  // A budget too small for the context: the replay is refused like a feed.
  EngineOptions tight = engine_options(512);
  tight.kv_budget_bytes = 64 * 1024;
  Engine small(model(), tight);
  auto s = small.new_sequence();
  s->begin_context();
  EXPECT_THROW(small.replay(*s, rec), KvBudgetExceeded);
}

}  // namespace
