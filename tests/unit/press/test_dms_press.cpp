// dms_<press> (issue 38, kvpress DMSPress(press, threshold, sliding_window_size, decoding)): the inner press's
// raw scores against a threshold, the most recent `window` tokens protected, entries really freed. Checked on
// the default model against the scores the press logged (Press::keep_scores): an entry is kept iff it lies in
// the window or its score is not below the threshold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/session.h"
#include "kvzap/error.h"
#include "model/model.h"
#include "press/press.h"
#include "test_support.h"

namespace {

using namespace kvzap;

class DmsPress : public test::DefaultModelTest {
 protected:
  static constexpr int64_t kT = 300;
  static std::vector<int32_t> context_ids() {
    std::string text;
    for (int i = 0; text.size() < 4000; i++)
      text += "The harbour master counted " + std::to_string(3 * i + 7) + " boats at dawn; the north pier held the "
              "blue trawlers and the fog lifted by nine. Entry " + std::to_string(i) + " is closed. ";
    std::vector<int32_t> ids = model_->tokenizer().encode(text, true);
    ids.resize((size_t)kT);
    return ids;
  }
  struct Run {
    test::KeptSet kept;
    std::vector<std::vector<float>> scores;  // [layer * n_head_kv + head][position], from the press's log
    std::string name;
  };
  static Run run(const nlohmann::json& spec) {
    SessionOptions so;
    so.n_threads = 2;
    so.n_ctx = 512;
    Session s(*model_, so);
    auto press = make_press(press_spec_from_json(spec), *model_);
    press->keep_scores(true);
    s.prefill_context(context_ids(), press.get());
    Run r{test::kept_positions(s.cache()), {}, press->name()};
    const ScoreLog* log = press->score_log();
    for (int l = 0; l < log->n_layer(); l++)
      for (int h = 0; h < log->n_head_kv(); h++) {
        const float* row = log->data() + ((size_t)l * log->n_head_kv() + h) * log->capacity();
        r.scores.emplace_back(row, row + kT);
      }
    return r;
  }
  // The median of every score outside the last `window` positions (finite ones): evicts about half.
  static double median_threshold(const Run& r, int window) {
    std::vector<float> all;
    for (const auto& s : r.scores)
      for (int64_t p = 0; p < kT - window; p++)
        if (std::isfinite(s[(size_t)p])) all.push_back(s[(size_t)p]);
    std::nth_element(all.begin(), all.begin() + all.size() / 2, all.end());
    return all[all.size() / 2];
  }
  // Kept iff in the window or score >= threshold (strict eviction, NaN kept), stream by stream.
  static void expect_exactly_thresholded(const Run& r, double threshold, int window) {
    ASSERT_EQ(r.kept.size(), r.scores.size());
    int64_t evicted = 0;
    for (size_t i = 0; i < r.kept.size(); i++) {
      std::vector<int32_t> want;
      for (int32_t p = 0; p < kT; p++)
        if (p >= kT - window || !(r.scores[i][(size_t)p] < threshold)) want.push_back(p);
      EXPECT_EQ(r.kept[i], want) << r.name << " stream " << i;
      evicted += kT - (int64_t)want.size();
    }
    EXPECT_GT(evicted, 0) << r.name;
  }
};

TEST_F(DmsPress, KnormEvictsExactlyTheScoresBelowTheThresholdOutsideTheWindow) {
  // KNorm scores -||k||: the threshold is compared with those raw scores.
  const Run probe = run({{"press", "dms_knorm"}, {"threshold", -1e6}});
  for (const auto& s : probe.kept) EXPECT_EQ((int64_t)s.size(), kT);  // nothing below -1e6
  const double t = median_threshold(probe, 128);
  const Run r = run({{"press", "dms_knorm"}, {"threshold", t}});
  EXPECT_EQ(r.scores, probe.scores);
  EXPECT_NE(r.name.find("dms_knorm (threshold"), std::string::npos) << r.name;
  EXPECT_NE(r.name.find("window 128"), std::string::npos) << r.name;  // the registry's default window
  expect_exactly_thresholded(r, t, 128);
  // The same as the plain press under the threshold policy (which is DMSPress).
  EXPECT_EQ(run({{"press", "knorm"}, {"threshold", t}, {"window", 128}}).kept, r.kept);
  // Another window: the last 32 positions are kept whatever their score, and more is judged.
  const Run w32 = run({{"press", "dms_knorm"}, {"threshold", t}, {"window", 32}});
  expect_exactly_thresholded(w32, t, 32);
  EXPECT_NE(w32.kept, r.kept);
}

TEST_F(DmsPress, ContextScorersAreJudgedOnceTheContextIsComplete) {
  // SnapKV scores the whole prefill (its last window_size queries vote): judged at the end of the context.
  EXPECT_TRUE(press_traits("dms_snapkv").threshold_on_context);
  EXPECT_FALSE(press_traits("dms_knorm").threshold_on_context);
  EXPECT_TRUE(judges_whole_contexts(press_spec_from_json({{"press", "dms_snapkv"}, {"threshold", 0.01}})));
  EXPECT_FALSE(judges_whole_contexts(press_spec_from_json({{"press", "dms_knorm"}, {"threshold", -3}})));
  const Run probe = run({{"press", "dms_snapkv"}, {"threshold", -1e6}});
  const double t = median_threshold(probe, 128);
  const Run r = run({{"press", "dms_snapkv"}, {"threshold", t}});
  EXPECT_NE(r.name.find("threshold"), std::string::npos) << r.name;
  expect_exactly_thresholded(r, t, 128);
  // Its parameters pass through: another SnapKV window changes the scores, and so what is kept.
  const Run w16 = run({{"press", "dms_snapkv"}, {"threshold", t}, {"window_size", 16}});
  expect_exactly_thresholded(w16, t, 128);
  EXPECT_NE(w16.scores, r.scores);
  // The sliding window of DMS is kept whole, whatever the scores.
  const Run w200 = run({{"press", "dms_snapkv"}, {"threshold", t}, {"window", 200}});
  expect_exactly_thresholded(w200, t, 200);
}

TEST_F(DmsPress, InnerParametersPassThrough) {
  EXPECT_EQ(press_param(press_spec_from_json({{"press", "dms_lagkv"}, {"threshold", 0}, {"lag_size", 32}}), "lag_size"), 32);
  EXPECT_EQ(press_param(press_spec_from_json({{"press", "dms_snapkv"}, {"threshold", 0}}), "window_size"), 64);
  EXPECT_TRUE(press_traits("dms_knorm").threshold_by_default);
  EXPECT_FALSE(press_traits("dms_knorm").kvpress_parity.empty());
  EXPECT_EQ(find_press_entry("dms_keydiff"), find_press_entry("keydiff"));
  EXPECT_EQ(find_press_entry("dms_nope"), nullptr);
  // KeyDiff scores against the context's mean key (a whole-context press): thresholded once prefilled.
  const Run probe = run({{"press", "dms_keydiff"}, {"threshold", -1e6}, {"window", 64}});
  const double t = median_threshold(probe, 64);
  expect_exactly_thresholded(run({{"press", "dms_keydiff"}, {"threshold", t}, {"window", 64}}), t, 64);
  // The plain press refuses a threshold; dms_ is the way to threshold it.
  EXPECT_THROW(make_press(press_spec_from_json({{"press", "keydiff"}, {"threshold", t}}), *model_), Error);
}

TEST_F(DmsPress, BadNamesAndSettingsAreRefusedClearly) {
  auto error_of = [&](const nlohmann::json& spec) -> std::string {
    try {
      make_press(press_spec_from_json(spec), *model_);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of({{"press", "dms_nope"}, {"threshold", 0}}).find("unknown press 'dms_nope'"), std::string::npos);
  EXPECT_NE(error_of({{"press", "dms_nope"}, {"threshold", 0}}).find("dms_<press>"), std::string::npos);
  EXPECT_NE(error_of({{"press", "dms_knorm"}}).find("needs a threshold"), std::string::npos);
  EXPECT_NE(error_of({{"press", "dms_knorm"}, {"ratio", 0.5}}).find("takes no ratio"), std::string::npos);
  EXPECT_NE(error_of({{"press", "dms_knorm"}, {"threshold", -3}, {"window", -1}}).find("window"), std::string::npos)
      << error_of({{"press", "dms_knorm"}, {"threshold", -3}, {"window", -1}});
  EXPECT_NE(error_of({{"press", "dms_snapkv"}, {"threshold", 0.1}, {"decoding", true}}).find("cannot prune while decoding"),
            std::string::npos);
  EXPECT_NE(error_of({{"press", "dms_simlayerkv"}, {"threshold", 0.1}}).find("own budget"), std::string::npos);
  EXPECT_NE(error_of({{"press", "dms_pyramidkv"}, {"threshold", 0.1}}).find("splits its budget"), std::string::npos);
  EXPECT_NE(error_of({{"press", "dms_adakv_snapkv"}, {"threshold", 0.1}}).find("splits its budget"), std::string::npos);
  // A parameter the inner press does not declare, or out of its range.
  EXPECT_THROW(press_spec_from_json({{"press", "dms_knorm"}, {"threshold", 0}, {"window_size", 8}}), Error);
  EXPECT_THROW(press_spec_from_json({{"press", "dms_snapkv"}, {"threshold", 0}, {"window_size", 0}}), Error);
  // A per-token press prunes while decoding (kvpress decoding=True).
  EXPECT_TRUE(make_press(press_spec_from_json({{"press", "dms_knorm"}, {"threshold", -3}, {"decoding", true}}), *model_)
                  ->prunes_decoding());
}

}  // namespace
