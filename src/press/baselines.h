// The kvpress baseline presses (docs/ALGORITHMS.md §8), built from the model's hyper-parameters only so
// tests can run them on hand-built caches. Each lives in its own src/press/scorer_<name>.cpp with its
// registry line; all are context scorers under the ratio policy.
//
// What they see: kvpress compresses the context alone (the question comes after compression) unless
// `query_aware` appends the question to the context. The scorers here likewise judge exactly what was
// prefilled — the window-query presses (SnapKV, PyramidKV, ChunkKV, TOVA) use the last tokens of the
// context; ContextView::question is not used.
//
// Entries kvpress pads with "max + 1" to keep them (SnapKV's window, TOVA's last token, sinks) get
// +inf here, so they are kept under every ratio scope, not only per head.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "press/baseline_math.h"
#include "press/policy.h"
#include "press/press.h"

namespace kvzap {

class ThreadPool;
struct QueryStats;

// Base of the baseline scorers: context scorers that need only the cache plus what they observed.
// kvpress ChunkPress's budget, shared by the chunk_<press> scorers: the context is cut into chunks of
// chunk_length slots (the remainder is one more chunk) and every judged (layer, KV head) keeps
// max(1, int(n (1 - ratio))) of the n entries of each chunk, the best by its scores (the ratio scope does
// not apply). A last chunk of at most keep_whole_up_to entries is kept whole (an inner press that cannot
// judge it: kvpress asserts).
class ChunkBudget : public BudgetSplit {
 public:
  explicit ChunkBudget(int64_t chunk_length, int64_t keep_whole_up_to = 0)
      : chunk_(chunk_length), keep_whole_up_to_(keep_whole_up_to) {}
  std::string budget_name() const override { return "chunks of " + std::to_string(chunk_); }
  void mark_evictions(const KvCache& cache, const CacheScores& scores, double ratio, EvictionMask& drop) override;

 protected:
  int64_t chunk_;  // slots per chunk (kvpress chunk_length)
  int64_t keep_whole_up_to_;
};

class CacheContextScorer : public Scorer, public CacheScorer {
 public:
  bool per_step() const override { return false; }
  void score_context(ContextView& ctx, CacheScores& out) override;
  void set_pool(ThreadPool* pool) override { pool_ = pool; }

 protected:
  // fn(i, thread) for i in [0, n), on the session's pool when there is one.
  void parallel_for(int64_t n, const std::function<void(int64_t, int)>& fn);
  int n_threads() const;
  ThreadPool* pool_ = nullptr;
};

// A context scorer built on another's scores (CriticalKV, CriticalAdaKV): the inner scorer watches the
// prefill and shares the pool; score_cache starts from inner_->score_cache. `what` names the wrapper in
// the error thrown when inner is not a whole-context CacheScorer.
class WrappedContextScorer : public CacheContextScorer {
 public:
  WrappedContextScorer(std::unique_ptr<Scorer> inner, const char* what);
  void observe_step(const LayerStep& step, const KvCache& cache) override { inner_->observe_step(step, cache); }
  void reset() override { inner_->reset(); }
  void set_pool(ThreadPool* pool) override {
    CacheContextScorer::set_pool(pool);
    cache_inner_->set_pool(pool);
  }

 protected:
  std::unique_ptr<Scorer> inner_;
  CacheScorer* cache_inner_;  // inner_ as a CacheScorer
};

// Every judged stream must hold the whole context (positions 0..n_past-1): the ratio presses score before
// anything is evicted. Throws kvzap::Error naming `press` otherwise. Returns n_past.
int64_t require_full_context(const KvCache& cache, const char* press);
// out[layer][head] sized to the cache's streams: values unset on judged layers, +inf (kept) on the others.
void size_scores(const KvCache& cache, CacheScores& out);

// SnapKV (kvpress SnapKVPress): the last `window` queries of the context attend (causally, after
// RoPE, 1/sqrt(D)) to every key; each non-window key's score is its attention averaged over the window
// rows, smoothed by avg_pool_same(kernel), averaged over the G query heads of its KV head. Window
// entries score +inf. Needs a context longer than the window.
// The context's last queries that vote in SnapKV (and the presses built on its scores): a context must be
// longer (the registry's min_context_tokens for them).
inline constexpr int kSnapKvWindow = 64;

class SnapKvScorer : public CacheContextScorer {
 public:
  explicit SnapKvScorer(const ModelConfig& c, int window = kSnapKvWindow, int kernel = 5);
  void observe_step(const LayerStep& step, const KvCache& cache) override { queries_.push(step); }
  void reset() override { queries_.clear(); }
  void score_cache(const KvCache& cache, CacheScores& out) override;
  int window() const { return window_; }

 protected:
  ModelConfig cfg_;
  int window_, kernel_;
  WindowQueries queries_;
};

// PyramidKV's per-layer budgets (kvpress PyramidKVPress.get_layer_budget): entries kept per head in
// `layer` for a context of T tokens at `ratio`, window 64, beta 20, Python rounding (half to even).
int64_t pyramid_layer_budget(int64_t T, double ratio, int layer, int n_layer, int window = 64, int beta = 20);

std::unique_ptr<Scorer> make_snapkv_scorer(const ModelConfig& c);
std::unique_ptr<Scorer> make_tova_scorer(const ModelConfig& c);
std::unique_ptr<Scorer> make_observed_attention_scorer(const ModelConfig& c);
// use_vnorm false: the softmax scores alone, without (score + epsilon) x ||v|| (for CriticalKV, which
// weighs values itself).
std::unique_ptr<Scorer> make_expected_attention_scorer(const ModelConfig& c, double epsilon, bool use_vnorm = true);
// kvpress ExpectedAttentionPress's arguments (kvzap's epsilon default: the leaderboard's 1e-2).
struct ExpectedAttentionOptions {
  int64_t n_future_positions = 512;
  int64_t n_sink = 4;
  bool use_covariance = true;
  bool use_vnorm = true;
  double epsilon = 1e-2;
  // Non-null: kvpress ExpectedAttentionStatsPress, the queries' mean and covariance taken from these
  // statistics (computed beforehand on calibration text, press/query_stats.h) instead of the context's.
  std::shared_ptr<const QueryStats> stats;
};
std::unique_ptr<Scorer> make_expected_attention_scorer(const ModelConfig& c, const ExpectedAttentionOptions& o);
// The options a spec gives (press parameters of expected_attention_params()), and those parameters.
ExpectedAttentionOptions expected_attention_options(const PressSpec& spec);
std::vector<PressParam> expected_attention_params();
std::unique_ptr<Scorer> make_pyramidkv_scorer(const ModelConfig& c, int window = kSnapKvWindow, int kernel = 5, int beta = 20);
// AdaKV around any scorer; the ratio policy then splits the budget as RatioScope::AdaKv, each head
// keeping at least alpha_safeguard of its uniform share (kvpress AdaKVPress alpha_safeguard).
std::unique_ptr<Scorer> make_adakv_scorer(std::unique_ptr<Scorer> inner, double alpha_safeguard = kAdaKvSafeguard);
// The alpha_safeguard press parameter every AdaKV press declares.
PressParam adakv_alpha_safeguard_param();
// DMS (kvpress DMSPress) around a context scorer: once the context is prefilled, evicts every entry scoring
// < threshold except the last `window` positions of the context and positions < sink_tokens (a BudgetSplit
// taking no ratio). Per-token scorers need no wrapper: dms_<press> runs them under the threshold policy.
std::unique_ptr<Scorer> make_dms_context_scorer(std::unique_ptr<Scorer> inner, double threshold, int window,
                                                int sink_tokens);
// kvpress PerLayerCompressionPress around a scorer: layer l keeps kvpress_n_kept(ratios[l], T) entries of
// each head (one ratio per layer of the cache, each in [0, 1)); the ratio policy calls it as a BudgetSplit.
std::unique_ptr<Scorer> make_per_layer_scorer(std::unique_ptr<Scorer> inner, std::vector<double> ratios);
std::unique_ptr<Scorer> make_keydiff_scorer();
// cross_scoring (kvpress's, "experimental"): the partition's softmaxed spread itself, not its rank, so scores
// compare across partitions.
std::unique_ptr<Scorer> make_lagkv_scorer(int64_t n_sink = 4, int64_t lag_size = 128, bool cross_scoring = false);
std::unique_ptr<Scorer> make_chunkkv_scorer(const ModelConfig& c, int64_t chunk_length = 20);
// kvpress CURPress leverage_type, in the order of the parameter's choices.
enum class CurLeverage { key, value, kv_avg, kv_product };
// use_random_leverage: norms through a Gaussian projection drawn from `seed` (press/scorer_cur.cpp).
std::unique_ptr<Scorer> make_cur_scorer(int64_t num_sinks = 4, int64_t local_window_size = 16, bool use_local_approximation = true,
                                        CurLeverage leverage = CurLeverage::kv_product, bool use_random_leverage = false,
                                        uint64_t seed = 42);
// SimLayerKV (press/scorer_simlayerkv.cpp): its own budget (BudgetSplit::uses_ratio false), whole lazy layers
// cut to their first n_initial and last n_recent - n_last entries. Throws kvzap::Error unless n_recent > n_last.
std::unique_ptr<Scorer> make_simlayerkv_scorer(const ModelConfig& c, double lazy_threshold, int n_last = 1,
                                               int64_t n_recent = 1024, int64_t n_initial = 4);
// blending: kvpress uses the compression ratio (0.35 if unset).
std::unique_ptr<Scorer> make_compactor_scorer(const ModelConfig& c, double blending, uint64_t seed);
// The tiled non-causal attention half of Compactor on its own or with other protected ends
// (press/scorer_compactor.cpp; "non_causal_attn" is kvpress NonCausalAttnPress).
struct NonCausalOptions {
  int64_t sink_start = 8, sink_end = 4;  // entries at either end that score +inf (not in any tile)
  bool leverage = true;                  // blend in the sketched leverage (Compactor)
  bool pad_last_tile = false;            // kvpress 0.5.5's padding of the last partial tile (see the source)
  int64_t tile = 256;                    // kvpress chunk_size: the tiles' length
  int sketch = 48;                       // kvpress sketch_dimension: the leverage's Gaussian sketch width
};
std::unique_ptr<Scorer> make_non_causal_scorer(const ModelConfig& c, const NonCausalOptions& o);
// blending: kvpress uses the compression ratio (0.35 if unset); o: the sinks, tile and sketch (leverage on).
std::unique_ptr<Scorer> make_compactor_scorer(const ModelConfig& c, double blending, uint64_t seed, const NonCausalOptions& o);
// Compactor's press parameters (kvpress CompactorPress sink_size_start, sink_size_end, chunk_size,
// sketch_dimension) and the options a spec gives.
std::vector<PressParam> compactor_params();
NonCausalOptions compactor_options(const PressSpec& spec);
// The blending weight a spec asks for: its "blending" parameter, or the compression ratio (kvpress's default).
double compactor_blending(const PressSpec& spec);

// CriticalKV (kvpress CriticalKVPress, press/scorer_critical_snapkv.cpp) around a context scorer: the best
// max(1, int((1 - ratio) T / 2)) entries of each head kept, every other score times ||W_O^(q) v||_1.
// wo: [layer][n_embd][n_head * head_dim], as output_projections(model) gives it.
// epsilon, first_stage_ratio: kvpress CriticalKVPress's arguments (first stage int((1 - ratio) T x
// first_stage_ratio), at least 1 unless first_stage_ratio is 0).
std::unique_ptr<Scorer> make_critical_scorer(std::unique_ptr<Scorer> inner, const ModelConfig& c,
                                             std::vector<std::vector<float>> wo, double ratio, double epsilon = 1e-4,
                                             double first_stage_ratio = 0.5);
// The press parameters of the CriticalKV presses (epsilon, first_stage_ratio; adakv: alpha_safeguard too).
std::vector<PressParam> critical_params(bool adakv);
std::vector<std::vector<float>> output_projections(const Model& m);
// CriticalAdaKV (kvpress CriticalAdaKVPress, press/scorer_critical_adakv_expected_attention.cpp) around a
// context scorer: AdaKV's per-layer budget, then CriticalKV's two stages within each head's share.
std::unique_ptr<Scorer> make_critical_adakv_scorer(std::unique_ptr<Scorer> inner, const ModelConfig& c,
                                                   std::vector<std::vector<float>> wo, double epsilon = 1e-4,
                                                   double first_stage_ratio = 0.5, double alpha_safeguard = kAdaKvSafeguard);
// make_critical_adakv_scorer with a spec's press parameters (critical_params(true)).
std::unique_ptr<Scorer> make_critical_adakv_scorer(std::unique_ptr<Scorer> inner, const Model& m, const PressSpec& spec);
// CriticalKV's value weights for stream (l, hk): out[i] = ||W_O^(q) v_i||_1 averaged over the G query heads q
// of the group; wo is the layer's [n_embd][n_head * head_dim].
void projected_value_norms(const KvCache& cache, int l, int hk, const ModelConfig& c, const std::vector<float>& wo,
                           std::vector<double>& out);

}  // namespace kvzap
