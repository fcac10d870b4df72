// Eviction while prefilling (PressSpec::prefill_evict_every): a threshold press judges the context every
// E positions instead of once at its end, so a request holds about kept + window + E entries per stream.
// Checked on the default model (30 layers, 3 KV heads shared by 9 query heads: GQA) through the real
// engine, for every per-token press of the registry:
// - the kept set does not depend on how the prompt is chunked (steps are cut at multiples of E);
// - given the same scores it is the set one judgment at the context's end chooses: exactly so for a
//   score that depends on position only (random), and in layer 0 for every press (its keys and hidden
//   states depend on the token alone); later layers attend to the pruned cache, as decoding does;
// - sinks and page boundaries (E and the window not multiples of the 16-entry page) hold;
// - pages are freed as the prompt goes in: every stream stays within kept + window + E.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/model.h"
#include "press/press.h"
#include "test_support.h"

namespace {

using namespace kvzap;

using test::KeptSet;
using test::kept_positions;

class PrefillEviction : public test::DefaultModelTest {
 protected:
  static std::vector<int32_t> prompt(int64_t n) {
    static const std::string text = test::slurp(std::string(KVZAP_SOURCE_DIR) + "/tests/golden/texts/english.txt");
    const std::vector<int32_t> all = model_->tokenizer().encode(text, true);
    std::vector<int32_t> p(all.begin(), all.begin() + std::min<int64_t>(n, (int64_t)all.size()));
    for (size_t i = p.size(); (int64_t)p.size() < n; i++) p.push_back(all[1 + i % (all.size() - 1)]);
    return p;
  }
  // A threshold that evicts about half of the entries for each per-token press.
  static PressSpec options(const std::string& name, int64_t every) {
    PressSpec o;
    o.name = name;
    o.has_threshold = true;
    o.threshold = name == "random" ? 0.5 : name == "knorm" ? -15 : -4;
    o.window = 40;      // not a multiple of the 16-entry page
    o.sink_tokens = 3;  // never evicted
    o.prefill_evict_every = every;
    return o;
  }

  static EngineOptions engine_options() {
    EngineOptions eo;
    eo.n_threads = 2;
    eo.n_ctx = 1024;
    eo.n_batch = 512;
    eo.kv_budget_bytes = (int64_t)1 << 30;
    return eo;
  }

  struct Result {
    KeptSet kept;
    int64_t peak_pages = 0;
  };
  // Prefills `ids` as one context in steps of the given sizes (cycled), as the server or CLI would.
  static Result run(const PressSpec& opt, const std::vector<int32_t>& ids, const std::vector<int64_t>& chunks) {
    Engine engine(*model_, engine_options());
    auto seq = engine.new_sequence();
    seq->set_press(make_press(opt, *model_));
    seq->begin_context();
    Result r;
    const int64_t n = (int64_t)ids.size();
    for (int64_t done = 0, k = 0; done < n; k++) {
      Segment s;
      s.seq = seq.get();
      s.tokens = ids.data() + done;
      s.n = std::min(chunks[(size_t)k % chunks.size()], n - done);
      s.logits = done + s.n == n ? LogitsMode::Last : LogitsMode::None;
      engine.step(std::span<Segment>(&s, 1));
      EXPECT_EQ(s.status, SegmentStatus::Ok);
      if (opt.prefill_evict_every > 0) {
        // Steps never cross a multiple of E.
        EXPECT_LE(done % opt.prefill_evict_every + s.n, opt.prefill_evict_every) << "step at " << done;
      }
      done += s.n;
      r.peak_pages = std::max(r.peak_pages, engine.pages().pages_in_use());
    }
    seq->end_context(ids);
    r.kept = kept_positions(seq->cache());
    return r;
  }
};

std::vector<std::string> per_token_presses() {
  std::vector<std::string> names;
  for (const ScorerEntry& e : scorer_registry())
    if (e.supports_threshold && !e.traits.needs_query_stats) names.push_back(e.name);  // qfilter: no statistics here
  std::sort(names.begin(), names.end());
  return names;
}

TEST_F(PrefillEviction, KeptSetDoesNotDependOnChunkingAndMatchesOneJudgmentWhereScoresAgree) {
  const std::vector<int32_t> ids = prompt(420);
  const std::vector<std::string> names = per_token_presses();
  ASSERT_GE(names.size(), 4u) << "kvzap-linear, kvzap-mlp, knorm, random";
  const int n_head_kv = model_->config().n_head_kv;
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const Result at_end = run(options(name, 0), ids, {512});
    const Result whole = run(options(name, 48), ids, {512});        // the engine cuts it at 48, 96, ...
    const Result ragged = run(options(name, 48), ids, {37, 5, 100, 16, 1});
    const Result server = run(options(name, 48), ids, {64});
    EXPECT_EQ(whole.kept, ragged.kept) << "the kept set depends on the chunking";
    EXPECT_EQ(whole.kept, server.kept) << "the kept set depends on the chunking";

    int64_t kept = 0, full = 0, common = 0, either = 0;
    for (size_t s = 0; s < at_end.kept.size(); s++) {
      const int layer = (int)(s / (size_t)n_head_kv);
      // Sinks and the last window are never evicted.
      const std::set<int32_t> k(whole.kept[s].begin(), whole.kept[s].end());
      for (int32_t p = 0; p < 3; p++) EXPECT_TRUE(k.count(p)) << "sink " << p << " evicted, stream " << s;
      for (int32_t p = (int32_t)ids.size() - 40; p < (int32_t)ids.size(); p++) EXPECT_TRUE(k.count(p)) << "window entry " << p;
      if (layer == 0 || name == "random") EXPECT_EQ(whole.kept[s], at_end.kept[s]) << "stream " << s;
      std::vector<int32_t> both, any;
      std::set_intersection(whole.kept[s].begin(), whole.kept[s].end(), at_end.kept[s].begin(), at_end.kept[s].end(), std::back_inserter(both));
      std::set_union(whole.kept[s].begin(), whole.kept[s].end(), at_end.kept[s].begin(), at_end.kept[s].end(), std::back_inserter(any));
      common += (int64_t)both.size(), either += (int64_t)any.size();
      kept += (int64_t)whole.kept[s].size();
      full += (int64_t)ids.size();
    }
    // Later layers attend to the pruned cache: how far that moves the kept set (reported, not asserted).
    std::printf("[ prefill ] %-13s evicted %.3f, kept set vs one judgment at the end: Jaccard %.4f, peak pages %lld vs %lld\n",
                name.c_str(), 1.0 - (double)kept / (double)full, (double)common / (double)either, (long long)whole.peak_pages,
                (long long)at_end.peak_pages);
    // The press really evicts, and frees pages while prefilling.
    EXPECT_LT(kept, full * 9 / 10);
    EXPECT_LT(whole.peak_pages, at_end.peak_pages);
  }
}

// The bound on what a stream holds while the prompt goes in: its kept entries among the judged ones plus
// at most window + E unjudged ones.
TEST_F(PrefillEviction, StreamsHoldKeptPlusWindowPlusOneInterval) {
  const std::vector<int32_t> ids = prompt(500);
  const PressSpec opt = options("random", 64);
  Engine engine(*model_, engine_options());
  auto seq = engine.new_sequence();
  seq->set_press(make_press(opt, *model_));
  seq->begin_context();
  // What one judgment at the end keeps (the random press's scores depend on position only).
  const Result at_end = run(options("random", 0), ids, {512});
  int64_t done = 0;
  while (done < (int64_t)ids.size()) {
    Segment s;
    s.seq = seq.get();
    s.tokens = ids.data() + done;
    s.n = (int64_t)ids.size() - done;
    engine.step(std::span<Segment>(&s, 1));
    ASSERT_EQ(s.status, SegmentStatus::Ok);
    done += s.n;
    const int64_t judged_before = std::max<int64_t>(0, done / 64 * 64 - opt.window);
    const KvCache& c = seq->cache();
    for (int l = 0; l < c.n_layer(); l++)
      for (int h = 0; h < c.n_head_kv(); h++) {
        const std::vector<int32_t>& final_kept = at_end.kept[(size_t)l * c.n_head_kv() + h];
        const int64_t kept_judged = std::lower_bound(final_kept.begin(), final_kept.end(), (int32_t)judged_before) - final_kept.begin();
        EXPECT_EQ(c.length(l, h), kept_judged + (done - judged_before)) << "layer " << l << " head " << h << " after " << done;
        EXPECT_LE(done - judged_before, opt.window + 64);
      }
  }
  seq->end_context(ids);
  EXPECT_EQ(kept_positions(seq->cache()), at_end.kept);
}

TEST_F(PrefillEviction, RatioPressesRefuseIt) {
  PressSpec o;
  o.name = "snapkv";
  o.has_ratio = true;
  o.ratio = 0.5;
  o.prefill_evict_every = 64;
  try {
    make_press(o, *model_);
    FAIL() << "a ratio press accepted prefill_evict_every";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("threshold press"), std::string::npos) << e.what();
  }
}

}  // namespace
