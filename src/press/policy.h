// The two eviction policies that wrap a Scorer (spec §4.2 threshold + window, §1.4-1.5 fixed ratio).
// Declared here, not only behind make_*_press, so tests can drive them with a bare KvCache and
// hand-built LayerSteps (start_context / finish_context need no Session).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "press/press.h"

namespace kvzap {

// kvpress DMSPress semantics with real eviction. Per layer, a window buffer holds the scores of the
// most recent tokens; when tokens leave it (buffer longer than `window`), every (head, token) among
// them whose score < threshold (strict) is evicted from the cache at once.
class ThresholdPress : public Press {
 public:
  ThresholdPress(std::unique_ptr<Scorer> scorer, const PressOptions& opt);

  std::string name() const override;
  void begin_context(Session& session) override { start_context(); }
  void end_context(ContextView& ctx) override { finish_context(); }
  bool prunes_decoding() const override { return decoding_; }
  void after_attention(const LayerStep& step, KvCache& cache) override;

  // Every step between these two is judged, whatever its size (a context prefilled in several
  // steps is judged completely even without `decoding`).
  void start_context();
  void finish_context() { in_context_ = false; }
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

  std::unique_ptr<Scorer> scorer_;
  std::string scorer_name_;
  double threshold_;
  int window_;
  bool decoding_;
  bool in_context_ = false;
  int64_t n_evicted_ = 0;
  std::vector<Window> windows_;     // [n_layer], sized on first use
  std::vector<float> step_scores_;  // [n_head_kv][n_tok] scratch, grows to the largest step
  std::vector<uint8_t> drop_;       // eviction mask scratch
};

enum class RatioScope { Global, Layer, Head };
RatioScope parse_ratio_scope(const std::string& s);  // throws kvzap::Error on an unknown scope

// Removes the lowest-scored entries: n = floor(ratio * entries) chosen over all layers and heads
// (Global), per layer (Layer) or per (layer, head) (Head). Ties are broken by (layer, head,
// position), lowest first, so the choice is deterministic. NaN scores count as lowest.
// scores: [layer][head][slot] for every kept entry. Returns the number of entries removed.
int64_t evict_lowest(KvCache& cache, const CacheScores& scores, double ratio, RatioScope scope);

// Fixed-ratio policy (kvpress ScorerPress / KVzipPress budgets): scores every context entry, then
// evicts the lowest fraction once the context is prefilled. Never touches later tokens.
class RatioPress : public Press {
 public:
  RatioPress(std::unique_ptr<Scorer> scorer, const PressOptions& opt);

  std::string name() const override;
  void begin_context(Session& session) override { start_context(); }
  void end_context(ContextView& ctx) override;
  bool prunes_decoding() const override { return false; }
  void after_attention(const LayerStep& step, KvCache& cache) override;

  void start_context();
  // ctx may be null for per-step scorers (tests). Returns the number of entries removed.
  int64_t finish_context(KvCache& cache, ContextView* ctx);

 private:
  std::unique_ptr<Scorer> scorer_;
  std::string scorer_name_;
  double ratio_;
  RatioScope scope_;
  bool in_context_ = false;
  CacheScores recorded_;            // per-step scorers: [layer][head][position] of the context
  std::vector<float> step_scores_;  // [n_head_kv][n_tok] scratch
};

}  // namespace kvzap
