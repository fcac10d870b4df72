// Shared check for the shared-prefill path (engine/context_recording.h): a context replayed under a
// press leaves the cache, and the logits of what follows, exactly as prefilling it under that press.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "engine/context_recording.h"
#include "engine/engine.h"
#include "press/press.h"

namespace kvzap::test {

inline void expect_same_cache(const KvCache& a, const KvCache& b) {
  ASSERT_EQ(a.n_past(), b.n_past());
  EXPECT_EQ(a.entries_window_dropped(), b.entries_window_dropped());
  EXPECT_EQ(a.evicted_fraction(), b.evicted_fraction());
  EXPECT_EQ(a.bytes_resident(), b.bytes_resident());
  std::vector<float> ra((size_t)a.head_dim()), rb((size_t)a.head_dim());
  for (int l = 0; l < a.n_layer(); l++)
    for (int h = 0; h < a.n_head_kv(); h++) {
      ASSERT_EQ(a.length(l, h), b.length(l, h)) << "layer " << l << " head " << h;
      for (int64_t i = 0; i < a.length(l, h); i++) {
        ASSERT_EQ(a.position_at(l, h, i), b.position_at(l, h, i)) << "layer " << l << " head " << h << " slot " << i;
        a.key_row(l, h, i, ra.data());
        b.key_row(l, h, i, rb.data());
        ASSERT_EQ(std::memcmp(ra.data(), rb.data(), ra.size() * sizeof(float)), 0) << "key, layer " << l << " slot " << i;
        a.value_row(l, h, i, ra.data());
        b.value_row(l, h, i, rb.data());
        ASSERT_EQ(std::memcmp(ra.data(), rb.data(), ra.size() * sizeof(float)), 0) << "value, layer " << l << " slot " << i;
      }
    }
}

// Prefills `context` under a press made from `po` and feeds `question`, once directly and once as a
// replay of a recorded press-free prefill; caches and the question's last logits must be identical.
// Returns the evicted fraction after the context (so callers can check the press really pruned).
inline double expect_replay_matches_prefill(const Model& model, const EngineOptions& eo, const PressSpec& po,
                                            const std::vector<int32_t>& context, const std::vector<int32_t>& question) {
  Engine engine(model, eo);
  const int V = model.config().n_vocab;
  // Directly under the press.
  auto direct = engine.new_sequence();
  direct->set_press(make_press(po, model));
  direct->begin_context();
  engine.feed(*direct, context.data(), (int64_t)context.size());
  direct->end_context(context);
  // Recorded without a press, replayed under a fresh one.
  auto base = engine.new_sequence();
  ContextRecording rec(model.config());
  engine.prefill_recorded(*base, context, rec);
  EXPECT_EQ(rec.n_tokens(), (int64_t)context.size());
  auto replayed = engine.new_sequence();
  replayed->set_press(make_press(po, model));
  replayed->begin_context();
  engine.replay(*replayed, rec);
  replayed->end_context(context);
  expect_same_cache(direct->cache(), replayed->cache());
  // The context's own logits, then the question's on each (a decoding press keeps judging).
  EXPECT_EQ(std::memcmp(direct->logits(), replayed->logits(), (size_t)V * sizeof(float)), 0);
  engine.feed(*direct, question.data(), (int64_t)question.size());
  engine.feed(*replayed, question.data(), (int64_t)question.size());
  EXPECT_EQ(std::memcmp(direct->logits(), replayed->logits(), (size_t)V * sizeof(float)), 0) << "after the question";
  expect_same_cache(direct->cache(), replayed->cache());
  return direct->cache().evicted_fraction();
}

}  // namespace kvzap::test
