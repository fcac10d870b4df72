// key_rerotation_<press> (kvpress KeyRerotationPress, issue 38): the press's kept set unchanged, each kept key
// rotated from its token's position to its rank among its head's kept entries (checked against RoPE written out
// independently, press/small_config.h), shared pages copied before they change, and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "cache/page_pool.h"
#include "engine/engine.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "press/press.h"
#include "press/small_config.h"
#include "test_support.h"

namespace kvzap {
namespace {

using test::kept_positions;

class KeyRerotation : public test::DefaultModelTest {
 protected:
  static EngineOptions engine_options() {
    EngineOptions eo;
    eo.n_threads = 2;
    eo.n_ctx = 1024;
    eo.n_batch = 1024;
    eo.kv_budget_bytes = (int64_t)1 << 28;
    return eo;
  }
  // A 300-token context prefilled under `spec`, compressed.
  static std::unique_ptr<Sequence> run(Engine& engine, const PressSpec& spec) {
    static const std::string text = test::slurp(std::string(KVZAP_SOURCE_DIR) + "/tests/golden/texts/english.txt");
    std::vector<int32_t> ids = model_->tokenizer().encode(text, true);
    ids.resize(std::min<size_t>(ids.size(), 300));
    auto seq = engine.new_sequence();
    seq->set_press(make_press(spec, *model_));
    seq->begin_context();
    Segment s;
    s.seq = seq.get();
    s.tokens = ids.data();
    s.n = (int64_t)ids.size();
    s.logits = LogitsMode::Last;
    engine.step(std::span<Segment>(&s, 1));
    EXPECT_EQ(s.status, SegmentStatus::Ok);
    seq->end_context(ids);
    return seq;
  }
  static PressSpec spec(const std::string& name, double ratio = 0.5) {
    PressSpec s;
    s.name = name;
    s.has_ratio = true;
    s.ratio = ratio;
    s.ratio_scope = "head";
    return s;
  }
};

TEST_F(KeyRerotation, KeepsThePressSetAndRotatesEachKeyToItsRank) {
  Engine engine(*model_, engine_options());
  auto plain = run(engine, spec("snapkv"));
  auto rerotated = run(engine, spec("key_rerotation_snapkv"));
  const KvCache& a = plain->cache();
  const KvCache& b = rerotated->cache();
  ASSERT_EQ(kept_positions(a), kept_positions(b));
  const ModelConfig& cfg = model_->config();
  const int D = cfg.head_dim;
  std::vector<float> want((size_t)D), got((size_t)D);
  int64_t moved = 0;
  for (int l = 0; l < a.n_layer(); l++)
    for (int h = 0; h < a.n_head_kv(); h++)
      for (int64_t i = 0; i < a.length(l, h); i++) {
        const int32_t p = a.position_at(l, h, i);
        a.key_row(l, h, i, want.data());
        press_test::rotate(cfg, want.data(), p - i, -1.0);  // back by p - i: from position p to position i
        b.key_row(l, h, i, got.data());
        moved += p != i;
        for (int d = 0; d < D; d++)
          ASSERT_NEAR(got[(size_t)d], want[(size_t)d], 2e-3 * std::fabs(want[(size_t)d]) + 2e-3)
              << "layer " << l << " head " << h << " slot " << i << " (position " << p << ") dim " << d;
        // Values are not rotated.
        a.value_row(l, h, i, want.data());
        b.value_row(l, h, i, got.data());
        for (int d = 0; d < D; d++) ASSERT_EQ(got[(size_t)d], want[(size_t)d]);
      }
  EXPECT_GT(moved, 0) << "nothing was evicted before a kept entry: the test checks no rotation";
  // Same answer length and a valid continuation; the logits of the context's last token are the prefill's
  // (compression happens after each layer's attention), so they agree.
  for (int v = 0; v < cfg.n_vocab; v += 97) EXPECT_EQ(plain->logits()[v], rerotated->logits()[v]);
}

TEST(KeyRerotationCache, SetKeyRowCopiesASharedPage) {
  const int L = 1, H = 1, D = 8;
  PagePool pool(KvCache::page_bytes_for(D), (int64_t)1 << 20);
  KvCache a(L, H, D, &pool), b(L, H, D, &pool);
  std::vector<float> k((size_t)D, 1.0f), v((size_t)D, 2.0f), row((size_t)D);
  for (int32_t p = 0; p < 5; p++) a.append(0, 0, k.data(), v.data(), p);
  b.share_from(a);
  const std::vector<float> changed((size_t)D, -3.0f);
  b.set_key_row(0, 0, 3, changed.data());
  a.key_row(0, 0, 3, row.data());
  EXPECT_EQ(row, k) << "the fork's change reached the shared page";
  b.key_row(0, 0, 3, row.data());
  EXPECT_EQ(row, changed);
  b.key_row(0, 0, 2, row.data());
  EXPECT_EQ(row, k);
  EXPECT_THROW(b.set_key_row(0, 0, 5, changed.data()), Error);
}

TEST_F(KeyRerotation, RefusesWhatItCannotWrap) {
  auto error = [&](PressSpec s) -> std::string {
    try {
      make_press(s, *model_);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  PressSpec t;
  t.name = "key_rerotation_knorm";
  t.has_threshold = true;
  t.threshold = -5;
  EXPECT_NE(error(t).find("takes a ratio"), std::string::npos) << error(t);
  PressSpec own;
  own.name = "key_rerotation_simlayerkv";
  EXPECT_NE(error(own).find("sets its own budget"), std::string::npos) << error(own);
  EXPECT_NE(error(spec("key_rerotation_nosuch")).find("unknown press"), std::string::npos);
  EXPECT_EQ(press_traits("key_rerotation_snapkv").threshold_by_default, false);
  EXPECT_NE(press_traits("key_rerotation_snapkv").kvpress_parity.find("KeyRerotationPress"), std::string::npos);
}

}  // namespace
}  // namespace kvzap
