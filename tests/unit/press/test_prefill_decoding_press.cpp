// prefill_decoding_<a>+<b> (kvpress PrefillDecodingPress(prefilling_press, decoding_press)): after the context
// the kept set is press <a>'s alone; each later compression is the decoding press's choice over what <a> kept
// (its scores by position in the score log); a KVzap-linear press on either side scores as it does alone (the
// read-out goes to the side that asks, or to neither); the name and spec are checked with clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/session.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "press/prefill_decoding.h"
#include "press/press.h"
#include "press/press_spec.h"
#include "press/best_by_log.h"
#include "test_support.h"

namespace kvzap {
namespace {

using nlohmann::json;

class PrefillDecodingPressModel : public test::DefaultModelTest {
 protected:
  static std::vector<int32_t> context_ids(int64_t n) {
    std::string text;
    for (int i = 0; text.size() < 3000; i++)
      text += "The harbour master counted " + std::to_string(3 * i + 7) + " boats at dawn; the north pier held the "
              "blue trawlers and the fog lifted by nine. Entry " + std::to_string(i) + " is closed. ";
    std::vector<int32_t> ids = model_->tokenizer().encode(text, true);
    ids.resize((size_t)n);
    return ids;
  }
  static SessionOptions options() {
    SessionOptions so;
    so.n_threads = 2;
    so.n_ctx = 512;
    return so;
  }
  // The kept set after prefilling `n` context tokens under `spec`.
  static test::KeptSet after_context(const json& spec, int64_t n) {
    Session s(*model_, options());
    auto press = make_press(press_spec_from_json(spec), *model_);
    s.prefill_context(context_ids(n), press.get());
    return test::kept_positions(s.cache());
  }
  std::string error_of(const json& spec) {
    try {
      make_press(press_spec_from_json(spec), *model_);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

using test::best_by_log;

TEST_F(PrefillDecodingPressModel, ThePrefillPressJudgesTheContextThenTheDecodingPressWhatItKept) {
  constexpr int64_t kT = 200, kInterval = 8, kTarget = 60;
  const json spec = {{"press", "prefill_decoding_snapkv+decoding_knorm"}, {"ratio", 0.5}, {"ratio_scope", "head"}, {"window_size", 16},
                     {"compression_interval", kInterval}, {"target_size", kTarget}};
  Session s(*model_, options());
  auto press = make_press(press_spec_from_json(spec), *model_);
  EXPECT_TRUE(press->prunes_decoding());
  EXPECT_NE(press->name().find("decoding_knorm (every 8 decoding steps to 60 tokens)"), std::string::npos) << press->name();
  press->keep_scores(true);
  s.prefill_context(context_ids(kT), press.get());
  // The context: SnapKV's kept set alone (its window_size reached it), kvpress's int(T (1 - r)) per head.
  const test::KeptSet after = test::kept_positions(s.cache());
  EXPECT_EQ(after, after_context({{"press", "snapkv"}, {"ratio", 0.5}, {"ratio_scope", "head"}, {"window_size", 16}}, kT));
  EXPECT_NE(after, after_context({{"press", "snapkv"}, {"ratio", 0.5}, {"ratio_scope", "head"}}, kT));
  for (const auto& st : after) ASSERT_EQ((int64_t)st.size(), kT / 2);
  // Decoding: the counter starts with the question's step; the kept entries plus the new ones are cut to the
  // target by knorm's scores, recorded for every entry while the context went in.
  const std::vector<int32_t> gen = context_ids(2 * kInterval);
  for (int i = 0; i < kInterval - 1; i++) s.feed({gen[(size_t)i]});
  test::KeptSet judged = test::kept_positions(s.cache());
  for (const auto& st : judged) ASSERT_EQ((int64_t)st.size(), kT / 2 + kInterval - 1);
  s.feed({gen[(size_t)kInterval - 1]});
  for (auto& st : judged) st.push_back((int32_t)(kT + kInterval - 1));
  const ScoreLog* log = press->score_log();
  ASSERT_NE(log, nullptr);
  for (int32_t p = 0; p < kT + kInterval; p++) ASSERT_FALSE(std::isnan(log->data()[p])) << p;  // every token scored
  const test::KeptSet kept = test::kept_positions(s.cache());
  for (const auto& st : kept) EXPECT_EQ((int64_t)st.size(), kTarget);
  EXPECT_EQ(kept, best_by_log(judged, *log, kTarget));
  // The same scores as decoding_knorm alone gives (knorm: a function of the entry's key).
  Session alone(*model_, options());
  auto dk = make_press(press_spec_from_json({{"press", "decoding_knorm"}}), *model_);
  dk->keep_scores(true);
  alone.prefill_context(context_ids(kT), dk.get());
  for (int32_t p = 0; p < kT; p++) EXPECT_EQ(log->data()[p], dk->score_log()->data()[p]) << p;
  // A fork keeps both presses and the step counter: the next interval ends on the same step.
  for (int i = kInterval; i < kInterval + 3; i++) s.feed({gen[(size_t)i]});
  std::unique_ptr<Sequence> fork = s.sequence().fork();
  ASSERT_NE(fork->press(), nullptr);
  for (int i = kInterval + 3; i < 2 * kInterval; i++) {
    Segment seg[2] = {{&s.sequence(), &gen[(size_t)i], 1}, {fork.get(), &gen[(size_t)i], 1}};
    s.engine().step(seg);
    ASSERT_EQ(seg[0].status, SegmentStatus::Ok);
    ASSERT_EQ(seg[1].status, SegmentStatus::Ok);
  }
  for (const auto& st : test::kept_positions(s.cache())) EXPECT_EQ((int64_t)st.size(), kTarget);
  EXPECT_EQ(test::kept_positions(fork->cache()), test::kept_positions(s.cache()));
}

TEST_F(PrefillDecodingPressModel, AKvzapLinearPressOnEitherSideScoresAsAlone) {
  constexpr int64_t kT = 160;
  // Prefill side: the read-out goes to it (knorm asks for none); its kept set is KVzap-linear's alone.
  EXPECT_EQ(after_context({{"press", "prefill_decoding_kvzap-linear+decoding_knorm"}, {"ratio", 0.5}}, kT),
            after_context({{"press", "kvzap-linear"}, {"ratio", 0.5}}, kT));
  EXPECT_EQ(after_context({{"press", "prefill_decoding_kvzap-linear+decoding_knorm"}, {"threshold", -4}}, kT),
            after_context({{"press", "kvzap-linear"}, {"threshold", -4}}, kT));
  // Decoding side, alone asking or both asking (then neither gets a read-out and each computes from h): its
  // recorded scores are decoding_kvzap-linear's alone.
  auto logged = [&](const json& spec) {
    Session s(*model_, options());
    auto press = make_press(press_spec_from_json(spec), *model_);
    press->keep_scores(true);
    s.prefill_context(context_ids(kT), press.get());
    const ScoreLog* log = press->score_log();
    std::vector<float> out;
    for (int l = 0; l < log->n_layer(); l++)
      for (int h = 0; h < log->n_head_kv(); h++)
        for (int32_t p = 0; p < kT; p++) out.push_back(log->data()[((size_t)l * log->n_head_kv() + h) * log->capacity() + p]);
    return out;
  };
  const std::vector<float> ref = logged({{"press", "decoding_kvzap-linear"}});
  for (const char* name : {"prefill_decoding_knorm+decoding_kvzap-linear", "prefill_decoding_kvzap-linear+decoding_kvzap-linear"}) {
    SCOPED_TRACE(name);
    const std::vector<float> got = logged({{"press", name}, {"ratio", 0.5}});
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); i++) ASSERT_NEAR(got[i], ref[i], 1e-4f * (1 + std::fabs(ref[i]))) << i;
  }
}

TEST_F(PrefillDecodingPressModel, NamesSpecsAndRefusals) {
  EXPECT_EQ(prefill_decoding_parts("prefill_decoding_snapkv+decoding_knorm"),
            (std::pair<std::string, std::string>{"snapkv", "decoding_knorm"}));
  // The split is at the last '+' that starts a decoding name: the prefill press may hold one.
  EXPECT_EQ(prefill_decoding_parts("prefill_decoding_kvzip++compression_ratio_decoding_knorm"),
            (std::pair<std::string, std::string>{"kvzip+", "compression_ratio_decoding_knorm"}));
  EXPECT_EQ(prefill_decoding_parts("snapkv"), (std::pair<std::string, std::string>{}));
  EXPECT_EQ(find_press_entry("prefill_decoding_snapkv+decoding_knorm"), find_press_entry("snapkv"));
  EXPECT_EQ(find_press_entry("prefill_decoding_adakv_snapkv+decoding_knorm"), find_press_entry("adakv_snapkv"));
  EXPECT_EQ(find_press_entry("prefill_decoding_snapkv+decoding_snapkv"), find_press_entry("snapkv"));  // refused when built
  EXPECT_EQ(find_press_entry("prefill_decoding_nope+decoding_knorm"), nullptr);
  EXPECT_EQ(find_press_entry("prefill_decoding_snapkv+decoding_nope"), nullptr);
  EXPECT_EQ(find_press_entry("prefill_decoding_snapkv"), nullptr);
  EXPECT_EQ(find_kvpress_gap("PrefillDecodingPress"), nullptr);
  // The parameters of both sides; the ratio is the prefill press's.
  const PressSpec s = press_spec_from_json({{"press", "prefill_decoding_snapkv+decoding_knorm"}, {"ratio", 0.25},
                                            {"window_size", 16}, {"target_size", 64}});
  EXPECT_EQ(press_param(s, "window_size"), 16);
  EXPECT_EQ(press_param(s, "target_size"), 64);
  EXPECT_EQ(press_param(s, "compression_interval"), 512);
  EXPECT_FALSE(press_traits(s.name).kvpress_parity.empty());
  EXPECT_TRUE(judges_whole_contexts(s));
  EXPECT_THROW(press_spec_from_json({{"press", "prefill_decoding_knorm+decoding_knorm"}, {"window_size", 16}}), Error);
  EXPECT_EQ(error_of({{"press", "prefill_decoding_adakv_snapkv+compression_ratio_decoding_knorm"}, {"ratio", 0.5}}), "");
  EXPECT_EQ(error_of({{"press", "prefill_decoding_kvzap-mlp+decoding_kvzap-mlp"}}), "");  // calibrated threshold
  EXPECT_EQ(press_traits("prefill_decoding_kvzap-mlp+decoding_knorm").threshold_by_default, true);

  auto has = [&](const json& spec, const std::string& part) {
    const std::string e = error_of(spec);
    EXPECT_NE(e.find(part), std::string::npos) << spec.dump() << ": " << e;
  };
  has({{"press", "prefill_decoding_snapkv"}, {"ratio", 0.5}}, "prefill_decoding_<prefill press>+<decoding press>");
  has({{"press", "prefill_decoding_snapkv+knorm"}, {"ratio", 0.5}}, "'knorm' is not a decoding press");
  has({{"press", "prefill_decoding_+decoding_knorm"}}, "the prefill press before '+decoding_knorm' is missing");
  has({{"press", "prefill_decoding_nope+decoding_knorm"}, {"ratio", 0.5}}, "its prefill press: unknown press 'nope'");
  has({{"press", "prefill_decoding_snapkv+decoding_nope"}, {"ratio", 0.5}}, "its decoding press: unknown press 'decoding_nope'");
  has({{"press", "prefill_decoding_snapkv+decoding_snapkv"}, {"ratio", 0.5}}, "token by token");
  has({{"press", "prefill_decoding_snapkv+decoding_knorm"}, {"threshold", -3}}, "cannot use a threshold");
  has({{"press", "prefill_decoding_snapkv+decoding_knorm"}}, "needs exactly one of a threshold or a ratio");
  has({{"press", "prefill_decoding_decoding_knorm+decoding_knorm"}}, "is a decoding press");
  has({{"press", "prefill_decoding_snapkv+decoding_knorm"}, {"ratio", 0.5}, {"decoding", true}}, "leave `decoding` unset");
  has({{"press", "prefill_decoding_knorm+decoding_knorm"}, {"ratio", 0.5}, {"prefill_evict_every", 64}},
      "evicting while prefilling needs a threshold press");
}

}  // namespace
}  // namespace kvzap
