// AdaKV (docs/ALGORITHMS.md §7, §8.14, kvpress AdaKVPress) around any press: per layer the heads share one
// budget and the lowest scores go wherever they are, but each head keeps at least 20% of its uniform
// share (RatioScope::AdaKv, press/policy.h). Registered as "adakv_snapkv" and "adakv_compactor"
// (kvpress leaderboard names); make_press also accepts "adakv_<press>" for any registered press, and
// --ratio-scope adakv does the same for a plain press name.
#include "kvzap/error.h"
#include "model/model.h"
#include "press/baselines.h"

namespace kvzap {
namespace {

class AdaKvScorer : public Scorer, public CacheScorer, public BudgetSplit {
 public:
  explicit AdaKvScorer(std::unique_ptr<Scorer> inner) : inner_(std::move(inner)), cache_inner_(dynamic_cast<CacheScorer*>(inner_.get())) {}

  bool per_step() const override { return inner_->per_step(); }
  bool scores_sliding_layers() const override { return inner_->scores_sliding_layers(); }
  void score_step(const LayerStep& step, const KvCache& cache, float* out) override { inner_->score_step(step, cache, out); }
  void score_context(ContextView& ctx, CacheScores& out) override { inner_->score_context(ctx, out); }
  void observe_step(const LayerStep& step, const KvCache& cache) override { inner_->observe_step(step, cache); }
  void reset() override { inner_->reset(); }

  void set_pool(ThreadPool* pool) override {
    if (cache_inner_) cache_inner_->set_pool(pool);
  }
  void score_cache(const KvCache& cache, CacheScores& out) override {
    if (!cache_inner_) throw Error("internal: this press needs the session to score a context");
    cache_inner_->score_cache(cache, out);
  }

  std::string budget_name() const override { return "adakv"; }
  void mark_evictions(const KvCache& cache, const CacheScores& scores, double ratio, EvictionMask& drop) override {
    mark_lowest(cache, scores, ratio, RatioScope::AdaKv, drop);
  }

 private:
  std::unique_ptr<Scorer> inner_;
  CacheScorer* cache_inner_;
};

}  // namespace

std::unique_ptr<Scorer> make_adakv_scorer(std::unique_ptr<Scorer> inner) {
  if (dynamic_cast<BudgetSplit*>(inner.get())) throw Error("AdaKV cannot wrap a press that splits its budget itself");
  return std::make_unique<AdaKvScorer>(std::move(inner));
}

namespace {
RegisterScorer reg_snapkv({"adakv_snapkv",
                           "AdaKV(SnapKV): per-layer budget shared by the heads, each keeps >= 20% of its share "
                           "(also adakv_<any press>, or --ratio-scope adakv)",
                           false, [](const PressSpec&, const Model& m) { return make_adakv_scorer(make_snapkv_scorer(m.config())); },
                           {.min_context_tokens = kSnapKvWindow, .kvpress_parity = "exact (kvpress AdaKVPress(SnapKVPress))"}});
RegisterScorer reg_compactor({"adakv_compactor", "AdaKV(Compactor), the kvpress leaderboard's Compactor entry", false,
                              [](const PressSpec& o, const Model& m) {
                                return make_adakv_scorer(make_compactor_scorer(m.config(), o.ratio, o.seed));
                              },
                              {.kvpress_parity = "cannot match exactly: kvpress draws its Gaussian sketch unseeded (Jaccard ~0.9)"}});
}  // namespace

}  // namespace kvzap
