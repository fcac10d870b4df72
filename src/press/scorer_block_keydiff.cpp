// "block_keydiff" (docs/ALGORITHMS.md §8.17, kvpress BlockPress(KeyDiffPress(), block_size=128)): KeyDiff
// applied block by block, as a streaming cache would. Per (layer, KV head) of T entries with n = max(1,
// int(T (1 - ratio))) to keep: the kept set starts as the first n entries; for each next block of 128 (block_size)
// entries (the last one shorter), KeyDiff scores the kept set plus the block (anchor = mean of their
// L2-normalised keys, score = -cos(k, anchor)) and the n best of them stay. It chooses its own kept sets
// (the ratio scope does not apply). Its scores (what `score` and the recompute test see) are KeyDiff's on
// the whole stream; the eviction is the block procedure's.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "kvzap/error.h"
#include "press/baseline_math.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

// -cos(k_i, anchor) for the entries `idx` of one stream's keys [T][D], anchor over the same entries.
void keydiff_scores(const std::vector<float>& keys, int D, const std::vector<int64_t>& idx, std::vector<double>& out) {
  out.resize(idx.size());
  kvzap::keydiff_scores(keys.data(), D, idx.data(), idx.size(), out.data());
}

class BlockKeyDiffScorer : public CacheContextScorer, public BudgetSplit {
 public:
  explicit BlockKeyDiffScorer(int64_t block_size) : inner_(make_keydiff_scorer()), block_(block_size) {}
  std::string budget_name() const override { return "blocks of " + std::to_string(block_); }

  void set_pool(ThreadPool* pool) override {
    CacheContextScorer::set_pool(pool);
    if (auto* cs = dynamic_cast<CacheScorer*>(inner_.get())) cs->set_pool(pool);
  }

  void score_cache(const KvCache& cache, CacheScores& out) override {
    auto* cs = dynamic_cast<CacheScorer*>(inner_.get());
    if (!cs) throw Error("internal: block_keydiff's inner scorer scores no cache");
    cs->score_cache(cache, out);
  }

  void mark_evictions(const KvCache& cache, const CacheScores&, double ratio, EvictionMask& drop) override {
    const int L = cache.n_layer(), H = cache.n_head_kv(), D = cache.head_dim();
    parallel_for((int64_t)L * H, [&](int64_t task, int) {
      const int l = (int)(task / H), h = (int)(task % H);
      if (!judged_layer(cache, l)) return;
      const int64_t T = cache.length(l, h);
      if (T <= 0 || !(ratio > 0)) return;
      const int64_t n = std::max<int64_t>(1, (int64_t)((double)T * (1.0 - ratio)));
      const int64_t block = std::min(block_, T);
      std::vector<float> keys;
      stream_keys(cache, l, h, keys);
      std::vector<int64_t> kept((size_t)n), cand, order;
      std::iota(kept.begin(), kept.end(), 0);
      std::vector<double> s;
      for (int64_t i = n; i < T; i += block) {
        cand = kept;
        for (int64_t j = i; j < std::min(i + block, T); j++) cand.push_back(j);
        keydiff_scores(keys, D, cand, s);
        order.resize(cand.size());
        std::iota(order.begin(), order.end(), 0);
        // The n best; among equal scores the earlier candidate (kvpress's order is torch.topk's own).
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[(size_t)a] > s[(size_t)b]; });
        for (int64_t r = 0; r < n; r++) kept[(size_t)r] = cand[(size_t)order[(size_t)r]];
      }
      std::vector<uint8_t>& d = drop[(size_t)l * H + h];
      std::fill(d.begin(), d.end(), 1);
      for (int64_t i : kept) d[(size_t)i] = 0;
    });
  }

 private:
  std::unique_ptr<Scorer> inner_;
  int64_t block_;  // kvpress block_size
};

}  // namespace

// For the unit test (tests/unit/press/test_baseline_presses.cpp), which has no Model.
std::unique_ptr<Scorer> make_block_keydiff_scorer(int64_t block_size) { return std::make_unique<BlockKeyDiffScorer>(block_size); }

namespace {
RegisterScorer reg({"block_keydiff",
                    "BlockPress(KeyDiff): KeyDiff over the kept entries plus each next block of 128, keeping the "
                    "budget every block (the ratio scope does not apply)",
                    false,
                    [](const PressSpec& o, const Model&) { return make_block_keydiff_scorer((int64_t)press_param(o, "block_size")); },
                    {.params = {{"block_size", 128, 1, 1 << 20, true, "entries added to the kept set per step"}},
                     .kvpress_parity = "exact (kvpress BlockPress(KeyDiffPress))"}});

}  // namespace
}  // namespace kvzap
