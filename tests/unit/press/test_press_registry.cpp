// Every press of the registry through what a sequence goes through in the engine and the server (issue 35):
// a fork (Press::clone is never null: the fork keeps its press), a save and restore of the compressed
// context, and a recompute after preemption (the same press made again from its PressSpec, the context
// prefilled again and the generated tokens replayed). Each must give the same kept set and the same
// greedy tokens as the sequence that never left. Run on the default model (30 layers, GQA 9:3).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/cache_file.h"
#include "engine/engine.h"
#include "model/model.h"
#include "press/press.h"
#include "test_support.h"

namespace {

using namespace kvzap;

using test::KeptSet;
using test::kept_positions;

int32_t argmax(const float* x, int n) { return (int32_t)(std::max_element(x, x + n) - x); }

class PressRegistry : public test::DefaultModelTest {
 protected:
  static EngineOptions engine_options() {
    EngineOptions eo;
    eo.n_threads = 2;
    eo.n_ctx = 1024;
    eo.n_batch = 1024;
    eo.kv_budget_bytes = (int64_t)1 << 30;
    return eo;
  }
  static std::vector<int32_t> context() {
    static const std::string text = test::slurp(std::string(KVZAP_SOURCE_DIR) + "/tests/golden/texts/english.txt");
    std::vector<int32_t> all = model_->tokenizer().encode(text, true);
    all.resize(std::min<size_t>(all.size(), 220));
    return all;
  }
  // One step of `n` tokens for `seq`; the logits of its last token.
  static void step(Engine& e, Sequence& seq, const int32_t* tokens, int64_t n) {
    Segment s;
    s.seq = &seq;
    s.tokens = tokens;
    s.n = n;
    s.logits = LogitsMode::Last;
    e.step(std::span<Segment>(&s, 1));
    ASSERT_EQ(s.status, SegmentStatus::Ok);
  }
  // Greedy tokens from the sequence's current logits, fed back one per step.
  static std::vector<int32_t> greedy(Engine& e, Sequence& seq, int n) {
    std::vector<int32_t> out;
    const int n_vocab = model_->config().n_vocab;
    for (int i = 0; i < n; i++) {
      const int32_t t = argmax(seq.logits(), n_vocab);
      out.push_back(t);
      step(e, seq, &t, 1);
    }
    return out;
  }
};

// Every registered press with a setting it accepts: ratio presses at 0.5, per-token presses by threshold
// and pruning while decoding (so the copy's own judgments matter).
std::vector<PressSpec> every_press() {
  std::vector<PressSpec> out;
  for (const ScorerEntry* entry : test::presses_under_test()) {
    const ScorerEntry& e = *entry;
    PressSpec s;
    s.name = e.name;
    if (e.supports_threshold) {
      s.has_threshold = true;
      s.threshold = e.name == "random" ? 0.5 : e.name == "knorm" ? -15 : -4;
      s.window = 32;
      s.decoding = true;
    } else {
      test::give_budget(s, 0.5);
      s.ratio_scope = press_traits(e.name).kvpress_ratio_scope;
    }
    out.push_back(s);
  }
  // dms_<press> (kvpress DMSPress) is no registry entry of its own: one per-token press pruning while
  // decoding, one whole-context press (judged once the context is prefilled, a ratio press's protocol).
  if (test::press_selected("dms_knorm")) {
    PressSpec s;
    s.name = "dms_knorm";
    s.has_threshold = true;
    s.threshold = -15;
    s.window = 32;
    s.decoding = true;
    out.push_back(s);
  }
  // key_rerotation_<press> (kvpress KeyRerotationPress): its keys re-rotated, which a fork, a saved file
  // and a recompute must all carry.
  if (test::press_selected("key_rerotation_snapkv")) {
    PressSpec s;
    s.name = "key_rerotation_snapkv";
    test::give_budget(s, 0.5);
    s.ratio_scope = "head";
    out.push_back(s);
  }
  if (test::press_selected("dms_snapkv")) {
    PressSpec s;
    s.name = "dms_snapkv";
    s.has_threshold = true;
    s.threshold = 0.005;
    s.window = 32;
    out.push_back(s);
  }
  return out;
}

TEST_F(PressRegistry, EveryPressSurvivesForkSaveRestoreAndRecompute) {
  const std::vector<int32_t> ids = context();
  const std::vector<PressSpec> presses = every_press();
  ASSERT_GE(presses.size(), test::every_press_under_test() ? 20u : 1u);
  const std::string file = (std::filesystem::temp_directory_path() / ("kvzap_registry_" + std::to_string(::getpid()) + ".kvc")).string();
  for (const PressSpec& spec : presses) {
    SCOPED_TRACE(press_spec_key(&spec));
    Engine engine(*model_, engine_options());
    auto seq = engine.new_sequence();
    seq->set_press(make_press(spec, *model_));
    seq->begin_context();
    step(engine, *seq, ids.data(), (int64_t)ids.size());
    seq->end_context(ids);
    const KeptSet after_context = kept_positions(seq->cache());
    int64_t kept = 0;
    for (const auto& s : after_context) kept += (int64_t)s.size();
    EXPECT_LT(kept, (int64_t)after_context.size() * (int64_t)ids.size()) << "the press evicted nothing";

    // Save the compressed context before anything else touches it.
    CacheFileMeta meta;
    meta.press = press_spec_key(&spec);
    meta.tokens = ids;
    meta.logits.assign(seq->logits(), seq->logits() + model_->config().n_vocab);
    save_cache_file(file, *model_, seq->cache(), meta);

    // Fork: the copy has its own press, and continues exactly as the original.
    auto fork = seq->fork();
    ASSERT_NE(fork->press(), nullptr) << "the fork lost its press";
    EXPECT_NE(fork->press(), seq->press());
    const std::vector<int32_t> tokens = greedy(engine, *seq, 12);
    const KeptSet after_decoding = kept_positions(seq->cache());
    EXPECT_EQ(greedy(engine, *fork, 12), tokens);
    EXPECT_EQ(kept_positions(fork->cache()), after_decoding);
    if (spec.decoding) EXPECT_NE(after_decoding, after_context) << "a decoding press judged none of the new tokens";

    // Restore: same kept set, same continuation under the press restored after the context.
    auto restored = engine.new_sequence();
    const CacheFileMeta back = load_cache_file(file, *model_, restored->cache());
    EXPECT_EQ(back.press, press_spec_key(&spec));
    EXPECT_EQ(kept_positions(restored->cache()), after_context);
    std::copy(back.logits.begin(), back.logits.end(), restored->mutable_logits());
    restored->set_press_after_context(make_press(spec, *model_));
    const std::vector<int32_t> restored_tokens = greedy(engine, *restored, 12);
    EXPECT_EQ(restored_tokens.front(), tokens.front());
    if (!spec.decoding) EXPECT_EQ(restored_tokens, tokens);  // a decoding press leaves the saved last window unjudged (docs/SERVER.md)

    // Recompute after preemption: the press made again from the same spec, the context prefilled again,
    // the generated tokens replayed one per step.
    auto again = engine.new_sequence();
    again->set_press(make_press(spec, *model_));
    again->begin_context();
    step(engine, *again, ids.data(), (int64_t)ids.size());
    again->end_context(ids);
    EXPECT_EQ(kept_positions(again->cache()), after_context);
    for (int32_t t : tokens) {
      EXPECT_EQ(argmax(again->logits(), model_->config().n_vocab), t);
      step(engine, *again, &t, 1);
    }
    EXPECT_EQ(kept_positions(again->cache()), after_decoding);
  }
  std::filesystem::remove(file);
}

// A ratio press mid-context holds partial scores that cannot be copied: the fork says so rather than
// running without a press.
TEST_F(PressRegistry, ForkInsideARatioContextIsRefused) {
  PressSpec spec;
  spec.name = "snapkv";
  spec.has_ratio = true;
  spec.ratio = 0.5;
  const std::vector<int32_t> ids = context();
  Engine engine(*model_, engine_options());
  auto seq = engine.new_sequence();
  seq->set_press(make_press(spec, *model_));
  seq->begin_context();
  step(engine, *seq, ids.data(), 100);
  EXPECT_THROW(seq->fork(), Error);
  step(engine, *seq, ids.data() + 100, (int64_t)ids.size() - 100);
  seq->end_context(ids);
  EXPECT_NE(seq->fork()->press(), nullptr);
}

}  // namespace
