// The two eviction policies that wrap a Scorer (docs/ALGORITHMS.md §6 threshold + window, §7 fixed ratio).
// Declared here, not only behind make_*_press, so tests can drive them with a bare KvCache and
// hand-built LayerSteps (start_context / finish_context need no Session).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "press/press.h"

namespace kvzap {

class ThreadPool;

// kvpress DMSPress semantics with real eviction. Per layer, a window buffer holds the scores of the
// most recent tokens; when tokens leave it (buffer longer than `window`), every (head, token) among
// them whose score < threshold (strict) is evicted from the cache — at once while decoding; while
// prefilling a context, at its end, or every `prefill_evict_every` positions when that is set.
class ThresholdPress : public Press {
 public:
  ThresholdPress(std::unique_ptr<Scorer> scorer, const PressSpec& opt);

  std::string name() const override;
  void begin_context(ContextRunner& runner) override { start_context(); }
  void end_context(ContextView& ctx) override { finish_context(ctx.cache); }
  bool prunes_decoding() const override { return decoding_; }
  int64_t context_eviction_interval() const override { return in_context_ ? evict_every_ : 0; }
  void after_attention(const LayerStep& step, KvCache& cache) override;
  int h_readout_dim(int layer) const override { return in_context_ || decoding_ ? scorer_->h_readout_dim(layer) : 0; }
  void h_readout(int layer, const float* h, int64_t n, float* out) const override { scorer_->h_readout(layer, h, n, out); }
  // A copy of the window buffers (per-step scorers are stateless between steps: shared).
  std::unique_ptr<Press> clone() const override { return std::make_unique<ThresholdPress>(*this); }

  // Every step between these two is judged, whatever its size (a context prefilled in several
  // steps is judged completely even without `decoding`). Inside a context nothing is evicted until
  // finish_context (every context token attends to the whole context, as in a one-step prefill), unless
  // prefill_evict_every = E > 0: then a step ending at a multiple b of E evicts the buffered tokens
  // before b - window. Steps never cross a multiple of E (Engine::step), so either way the result does
  // not depend on how the context was chunked, and given the same scores the kept set is the one
  // finish_context alone would choose.
  void start_context();
  void finish_context(KvCache& cache);
  // Entries this press removed since it was made (all layers and heads).
  int64_t n_evicted() const { return n_evicted_; }

 private:
  // Scores of the tokens still inside the window of one layer, oldest first.
  struct Window {
    std::vector<int32_t> pos;                // [len]
    std::vector<std::vector<float>> score;   // [n_head_kv][len]
    void clear();
    void drop_from(int32_t first_stale_pos);  // forget positions >= first_stale_pos (after a truncate)
    void drop_front(size_t n);
  };
  void evict_leaving(int layer, size_t n_leave, KvCache& cache);
  void evict_overflow(int layer, KvCache& cache);  // judges the tokens beyond the window
  void evict_before(int layer, int32_t limit, KvCache& cache);  // judges the buffered tokens at positions < limit

  std::shared_ptr<Scorer> scorer_;
  std::string scorer_name_;
  double threshold_;
  int window_;
  int64_t evict_every_;             // judge a context every this many positions (0 = at its end)
  int sink_tokens_;                 // positions < this are never evicted
  bool decoding_;
  bool in_context_ = false;
  int64_t n_evicted_ = 0;
  bool sliding_layers_;             // also judge sliding-window layers
  std::vector<Window> windows_;     // [n_layer], sized on first use
  std::vector<float> step_scores_;  // [n_head_kv][n_tok] scratch, grows to the largest step
  std::vector<uint8_t> drop_;       // eviction mask scratch
};

// AdaKv: kvpress AdaKVPress — per layer, the budget of every head pooled and chosen across heads,
// each head keeping at least kAdaKvSafeguard of its uniform share.
enum class RatioScope { Global, Layer, Head, AdaKv };
RatioScope parse_ratio_scope(const std::string& s);  // throws kvzap::Error on an unknown scope
constexpr double kAdaKvSafeguard = 0.2;  // kvpress alpha_safeguard

// Which entries to evict: drop[layer * n_head_kv + head][slot] != 0.
using EvictionMask = std::vector<std::vector<uint8_t>>;
EvictionMask empty_mask(const KvCache& cache);
// Evicts every marked entry; returns the number removed.
int64_t evict_marked(KvCache& cache, const EvictionMask& drop);

// Removes the lowest-scored entries: n = floor(ratio * entries) chosen over all layers and heads
// (Global), per layer (Layer) or per (layer, head) (Head). Ties are broken by (layer, head,
// position), lowest first, so the choice is deterministic. NaN scores count as lowest.
// AdaKv follows kvpress AdaKVPress instead: per layer, a head of T entries keeps
// n_kept = int(T * (1 - ratio)); its int(n_kept * kAdaKvSafeguard) best entries are protected, and
// the layer's sum of (T - n_kept) is evicted among the rest of all its heads.
// Sliding-window layers of the cache (KvCache::layer_window > 0) are neither candidates nor counted
// in the budget unless include_sliding.
// scores: [layer][head][slot] for every kept entry. Returns the number of entries removed.
int64_t evict_lowest(KvCache& cache, const CacheScores& scores, double ratio, RatioScope scope,
                     bool include_sliding = false);
// The same choice, as a mask (nothing is evicted); AdaKv protects alpha_safeguard of each head's share.
void mark_lowest(const KvCache& cache, const CacheScores& scores, double ratio, RatioScope scope, EvictionMask& drop,
                 bool include_sliding = false, double alpha_safeguard = kAdaKvSafeguard);
// kvpress's compute_n_kept: int(T (1 - ratio)) entries of a stream of T stay, at least one (ScorerPress,
// AdaKVPress, PerLayerCompressionPress). With an odd T and ratio 0.5 this keeps (T - 1) / 2, one fewer than
// T - floor(ratio T).
int64_t kvpress_n_kept(double ratio, int64_t T);
// Marks the n lowest entries of one stream (ties: lowest slot first).
void mark_lowest_in_stream(const std::vector<float>& scores, int64_t n, std::vector<uint8_t>& drop);
// Checks that scores has one value per kept entry of the cache; throws kvzap::Error otherwise.
void check_score_shape(const KvCache& cache, const CacheScores& scores);

// Optional interface of context scorers that need only the cache and what observe_step saw (the
// kvpress baselines, press/baselines.h). The ratio policy hands them the session's thread pool
// (idle while observers run), and tests can score a bare KvCache (finish_context without a view).
class CacheScorer {
 public:
  virtual ~CacheScorer() = default;
  virtual void set_pool(ThreadPool* pool) = 0;  // null: run on the calling thread
  virtual void score_cache(const KvCache& cache, CacheScores& out) = 0;
};

// Optional interface of scorers whose kvpress press splits the budget its own way (PyramidKV's
// per-layer budgets, ChunkKV's whole chunks, AdaKV): the ratio policy lets them choose the evicted
// entries and ignores the ratio scope.
class BudgetSplit {
 public:
  virtual ~BudgetSplit() = default;
  virtual std::string budget_name() const = 0;  // shown in the press name instead of the scope
  // False for a press that sets its own budget and takes no ratio (PressTraits::own_budget): the policy
  // then calls mark_evictions with ratio 0 and names the press without a ratio.
  virtual bool uses_ratio() const { return true; }
  // drop comes sized (empty_mask) and all 0; mark the entries to evict.
  virtual void mark_evictions(const KvCache& cache, const CacheScores& scores, double ratio, EvictionMask& drop) = 0;
};

// A budget split around another press's scores (AdaKV, DMS on a context, per-layer ratios): everything but
// the choice of what to evict goes to the inner scorer, whether it scores step by step or the whole cache.
class WrappedBudgetScorer : public Scorer, public CacheScorer, public BudgetSplit {
 public:
  explicit WrappedBudgetScorer(std::unique_ptr<Scorer> inner)
      : inner_(std::move(inner)), cache_inner_(dynamic_cast<CacheScorer*>(inner_.get())) {}

  bool per_step() const override { return inner_->per_step(); }
  bool scores_sliding_layers() const override { return inner_->scores_sliding_layers(); }
  void score_step(const LayerStep& step, const KvCache& cache, float* out) override { inner_->score_step(step, cache, out); }
  void score_context(ContextView& ctx, CacheScores& out) override { inner_->score_context(ctx, out); }
  void observe_step(const LayerStep& step, const KvCache& cache) override { inner_->observe_step(step, cache); }
  void reset() override { inner_->reset(); }
  void set_pool(ThreadPool* pool) override {
    if (cache_inner_) cache_inner_->set_pool(pool);
  }
  void score_cache(const KvCache& cache, CacheScores& out) override;  // throws when the inner press has none

 protected:
  std::unique_ptr<Scorer> inner_;
  CacheScorer* cache_inner_;  // inner_ as a CacheScorer, or null
};

// Fixed-ratio policy (kvpress ScorerPress / KVzipPress budgets): scores every context entry, then
// evicts the lowest fraction once the context is prefilled. Never touches later tokens.
class RatioPress : public Press {
 public:
  // remake: builds a fresh scorer of this press, so the press can be copied outside a context (clone).
  RatioPress(std::unique_ptr<Scorer> scorer, const PressSpec& opt, ScorerFactory remake = {});

  std::string name() const override;
  void begin_context(ContextRunner& runner) override;
  void end_context(ContextView& ctx) override;
  bool prunes_decoding() const override { return false; }
  // Outside a context the press holds no state (it judged its context, or has not started one): the copy
  // is a fresh press. Inside one, the scorer's partial state cannot be copied: throws.
  std::unique_ptr<Press> clone() const override;
  void after_attention(const LayerStep& step, KvCache& cache) override;
  int h_readout_dim(int layer) const override { return in_context_ && scorer_->per_step() ? scorer_->h_readout_dim(layer) : 0; }
  void h_readout(int layer, const float* h, int64_t n, float* out) const override { scorer_->h_readout(layer, h, n, out); }

  void start_context();
  // ctx may be null for per-step scorers and CacheScorers (tests). Returns the number of entries removed.
  int64_t finish_context(KvCache& cache, ContextView* ctx);
  Scorer& scorer() { return *scorer_; }

 private:
  std::unique_ptr<Scorer> scorer_;
  ScorerFactory remake_;
  PressSpec spec_;
  std::string scorer_name_;
  double ratio_;
  RatioScope scope_;
  bool sliding_layers_;             // also prune sliding-window layers
  bool in_context_ = false;
  CacheScores recorded_;            // per-step scorers: [layer][head][position] of the context
  std::vector<float> step_scores_;  // [n_head_kv][n_tok] scratch
};

}  // namespace kvzap
