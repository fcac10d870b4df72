// Press framework: a Scorer says how much each KV pair matters; a policy (threshold + window, or a
// fixed ratio) decides what the cache frees. One scorer = one file + one registry line (registry.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "model/forward.h"
#include "press/press_spec.h"

namespace kvzap {

class ThreadPool;

// Scores of every kept entry of the cache: [layer][head][slot], slot order = the stream's order.
using CacheScores = std::vector<std::vector<std::vector<float>>>;

// The narrow part of the engine a press may use: its idle workers, and scratch forward passes.
class ContextRunner {
 public:
  virtual ~ContextRunner() = default;
  virtual ThreadPool& threads() = 0;
  virtual int64_t n_ctx() const = 0;            // per-sequence context limit
  virtual int64_t max_step_tokens() const = 0;  // most tokens one forward step takes
  // Runs `tokens` (one step) on a copy-on-write scratch fork of `cache` with `obs` watching every layer
  // (obs receives the fork's cache); the fork is dropped afterwards and `cache` is left untouched.
  virtual void run_on_scratch_fork(const KvCache& cache, const int32_t* tokens, int64_t n, LayerObserver& obs) = 0;
};

// What a context scorer may use after the context was prefilled.
struct ContextView {
  KvCache& cache;                           // the sequence's cache, holding the whole context
  ContextRunner& runner;
  const std::vector<int32_t>& context_ids;  // the tokens just prefilled (positions 0..n-1)
  const std::string& question;              // only for query-aware scorers; empty otherwise
};

class Scorer {
 public:
  virtual ~Scorer() = default;
  // Per-token scorers judge each new token from the step's tensors (KVzap, KNorm, random...): they
  // work in prefill and decoding, under either policy.
  virtual bool per_step() const = 0;
  // out: [n_head_kv][step.n_tok], higher = more important. Called after the step's attention.
  virtual void score_step(const LayerStep& step, const KvCache& cache, float* out) {
    (void)step, (void)cache, (void)out;
  }
  // Context scorers (KVzip, SnapKV...) score every kept entry once the context is prefilled. They judge
  // the global layers only: a sliding-window layer's entries score +inf (kept; its window bounds it) and
  // the scorer sees none of its steps, unless scores_sliding_layers() says it can judge them.
  virtual void score_context(ContextView& ctx, CacheScores& out) { (void)ctx, (void)out; }
  // Context scorers only: true if the scorer can judge a sliding-window layer's stream (which holds its
  // window, not the whole context), so --press-sliding-layers may hand it those layers.
  virtual bool scores_sliding_layers() const { return false; }
  // Optional: see every step of the context prefill (e.g. to keep the last window's queries).
  virtual void observe_step(const LayerStep& step, const KvCache& cache) { (void)step, (void)cache; }
  virtual void reset() {}
  // Optional, for per-step scorers that are a cheap function of h alone (the linear surrogate): the
  // forward evaluates it next to the attention norm (LayerObserver::h_readout) and score_step finds the
  // results in step.h_readout, so h is not read back from memory. Width 0 = not offered.
  virtual int h_readout_dim(int layer) const { (void)layer; return 0; }
  virtual void h_readout(int layer, const float* h, int64_t n, float* out) const { (void)layer, (void)h, (void)n, (void)out; }
};

// The layers a context scorer judges: the global ones. A sliding-window layer (Gemma 3's local layers)
// holds only its window; the ratio policy leaves it alone and shows the scorer none of its steps.
inline bool judged_layer(const KvCache& cache, int layer) { return cache.layer_window(layer) == 0; }

// The scores a press gave, by position, for research access (the C API's kvzap_sequence_press_scores,
// Python's Sequence.press_scores): values [n_layer][n_head_kv][capacity], NaN where a position was
// never scored (layers a press leaves alone, positions not reached; a ratio press scores the entries
// its context kept when it judges it, so an earlier eviction leaves NaN), +inf where a context scorer
// marks an entry as always kept (sliding-window layers). Kept
// only when asked (Press::keep_scores): it holds n_layer x n_head_kv x positions floats.
class ScoreLog {
 public:
  // Forgets every score (a new context starts at position 0).
  void clear();
  void put(int layer, int head, int32_t pos, float score);
  int n_layer() const { return n_layer_; }
  int n_head_kv() const { return n_head_kv_; }
  int64_t n_pos() const { return n_pos_; }        // 1 + the highest position scored (0 = none)
  int64_t capacity() const { return capacity_; }  // the row stride of data()
  const float* data() const { return values_.data(); }
  void set_shape(int n_layer, int n_head_kv);

 private:
  void grow(int64_t min_capacity);
  int n_layer_ = 0, n_head_kv_ = 0;
  int64_t n_pos_ = 0, capacity_ = 0;
  std::vector<float> values_;  // [n_layer][n_head_kv][capacity_]
};

// A press watches the forward pass (LayerObserver) and frees cache entries.
class Press : public LayerObserver {
 public:
  virtual ~Press() = default;
  virtual std::string name() const = 0;
  // Context protocol (kvpress pipeline), told explicitly by the sequence: begin_context before
  // prefilling a new context into an empty cache (the press forgets any earlier sequence), end_context
  // after it (ratio presses evict here).
  virtual void begin_context(ContextRunner& runner) = 0;
  virtual void end_context(ContextView& ctx) = 0;
  // After end_context: true if the press keeps judging question and generated tokens.
  virtual bool prunes_decoding() const = 0;
  // Inside a context: the press frees entries every this many positions (a step must not cross a
  // multiple of it, Engine::step cuts it there); 0 = it frees nothing before end_context.
  virtual int64_t context_eviction_interval() const { return 0; }
  // A copy of this press and its per-sequence state, for a fork of the sequence (shares the scorer's
  // read-only weights). Never null: a press that cannot be copied at this point throws kvzap::Error, so a
  // fork never silently runs without its press.
  virtual std::unique_ptr<Press> clone() const = 0;

  // Keep every score this press gives from now on (score_log); off by default. Copies (clone) keep
  // the setting and the scores so far.
  void keep_scores(bool on) { keep_scores_ = on; }
  // The scores given so far, or null when they are not kept.
  const ScoreLog* score_log() const { return keep_scores_ ? &score_log_ : nullptr; }

 protected:
  // Where the policy writes the scores it judges with: null unless kept (shaped to the cache).
  ScoreLog* scores_to_keep(const KvCache& cache) {
    if (!keep_scores_) return nullptr;
    score_log_.set_shape(cache.n_layer(), cache.n_head_kv());
    return &score_log_;
  }
  void copy_score_log(const Press& from) { keep_scores_ = from.keep_scores_, score_log_ = from.score_log_; }
  bool keep_scores_ = false;
  ScoreLog score_log_;
};

std::unique_ptr<Press> make_press(const PressSpec& opt, const Model& model);

// A parameter a press takes (kvpress's argument name), its default and range.
struct PressParam {
  std::string name;
  double default_value;
  double min, max;
  bool integer;
  std::string help;
  // A parameter kvpress takes as one of a few words (CURPress leverage_type="key"): the words, the value being
  // the chosen word's index (default_value too). Given by the word in JSON, Python and --press-param.
  std::vector<std::string> choices = {};
};

// What the registry knows of a press besides its factory: capabilities and defaults, so that no code
// elsewhere asks for a press by its name.
struct PressTraits {
  bool threshold_by_default = false;         // a sweep runs it by threshold (KVzap); others by ratio
  std::string kvpress_ratio_scope = "head";  // how kvpress splits its ratio budget (KVzip: global)
  int64_t min_context_tokens = 0;            // the context must be longer (SnapKV votes with 64 queries)
  std::string min_context_param;             // ... or longer than this parameter's value, when it declares one
  std::vector<PressParam> params;            // the press's own parameters (PressSpec::params)
  bool repeats_context = false;              // scoring runs the context again: needs ~2x it in n_ctx (KVzip)
  // The threshold of a spec that gives neither a threshold nor a ratio (KVzap: calibrated beside its
  // surrogate); empty or nullopt = none, the spec is refused.
  std::function<std::optional<double>(const PressSpec&, const Model&)> default_threshold;
  // The press decides itself how much to evict (SimLayerKV: whole "lazy" layers cut to their ends) and
  // takes neither a ratio nor a threshold: make_press refuses either. It runs under the ratio policy's
  // context protocol (judged once the context is prefilled) and its scorer is a BudgetSplit whose
  // uses_ratio() is false.
  bool own_budget = false;
  // Parameters under which the press prunes a short context (a few hundred tokens): the setting the tests
  // that run every press give a press with its own budget (whose defaults may leave such a context whole).
  std::map<std::string, double> demo_params;
  // "dms_<context scorer>" (kvpress DMSPress around a press that scores the whole context): a threshold judged
  // once the context is prefilled, under the ratio policy's context protocol (press/scorer_dms.cpp).
  bool threshold_on_context = false;
  // The press reads query statistics computed beforehand for the model by `kvzap query-stats`
  // (press/query_stats.h: qfilter, expected_attention_stats); without them make_press throws an Error
  // naming that command. The tests that run every press on models without statistics leave it out.
  bool needs_query_stats = false;
  // How its kept sets compare with kvpress's (tests/python/check_kvpress_parity.py, docs/PARITY.md), shown by
  // `kvzap presses`; empty = not compared.
  std::string kvpress_parity;
};

// Registry of scorers: name -> factory. Policies wrap them (threshold.cpp, ratio.cpp).
struct ScorerEntry {
  std::string name;
  std::string description;
  bool supports_threshold;  // per-step scorers only
  std::function<std::unique_ptr<Scorer>(const PressSpec&, const Model&)> make;
  PressTraits traits = {};
};
std::vector<ScorerEntry>& scorer_registry();
// The entry a press name runs: its own, or for "adakv_<press>" / "dms_<press>" (when not registered as
// such) the wrapped press's. Null if unknown.
const ScorerEntry* find_press_entry(const std::string& name);
// For "per_layer_<press>" (kvpress PerLayerCompressionPress, ratios in PressSpec::ratios): "<press>"; "" for
// any other name.
std::string per_layer_inner(const std::string& name);
// For "composed_<a>+<b>[+...]" (kvpress ComposedPress, one ratio per stage in PressSpec::ratios): the stage
// names in order; empty for any other name.
std::vector<std::string> composed_stages(const std::string& name);
// Builds a composed press (press/scorer_composed.cpp); make_press calls it for composed_<a>+<b>.
std::unique_ptr<Press> make_composed_press(const PressSpec& spec, const std::vector<std::string>& stage_names,
                                           const Model& model);
// For "decoding_<press>" (kvpress DecodingPress) and "compression_ratio_decoding_<press>" (kvpress
// CompressionRatioDecodingPress), press/scorer_decoding.cpp: "<press>"; "" for any other name.
inline constexpr const char* kDecodingPrefix = "decoding_";
inline constexpr const char* kRatioDecodingPrefix = "compression_ratio_decoding_";
std::string decoding_inner(const std::string& name);
// True for a compression_ratio_decoding_<press> name (whether or not the inner press exists).
bool is_ratio_decoding_name(const std::string& name);
// Builds decoding_<press> / compression_ratio_decoding_<press> from its spec (make_press calls it), or around a
// per-token scorer (tests): nothing is evicted inside a context; after it, every compression_interval steps of
// a layer each of its heads keeps its target best-scored entries: target_size, or with target_ratio >= 0
// max(1, int(P (1 - target_ratio))) for P the tokens seen so far (the step's last position + 1).
std::unique_ptr<Press> make_decoding_press(const PressSpec& spec, const ScorerEntry& entry, const Model& model);
std::unique_ptr<Press> make_decoding_press(std::unique_ptr<Scorer> scorer, const PressSpec& spec,
                                           int64_t compression_interval, int64_t target_size, double target_ratio = -1);
// find_press_entry(name)'s traits, or the defaults for an unknown name (make_press refuses it).
const PressTraits& press_traits(const std::string& name);
// Whether the spec's press judges whole contexts once prefilled (a ratio, or its own budget): evicting
// while prefilling (prefill_evict_every) does not apply to it.
inline bool judges_whole_contexts(const PressSpec& s) {
  const PressTraits& t = press_traits(s.name);
  return s.has_ratio || !s.ratios.empty() || t.own_budget || t.threshold_on_context;
}
// kvpress DMSPress(press): "dms_<press>" runs any registered press's scores under a threshold with a protected
// window of the most recent tokens. True for such a name (whether or not the inner press exists).
inline constexpr const char* kDmsPrefix = "dms_";
bool is_dms_name(const std::string& name);
// The value of a parameter the press declares: the spec's, else the registry's default. Throws
// kvzap::Error (internal) for an undeclared name.
double press_param(const PressSpec& spec, const std::string& name);
// The context a press needs, in tokens (it must be longer): min_context_tokens or its parameter's value.
int64_t press_min_context(const PressSpec& spec);
struct RegisterScorer {
  explicit RegisterScorer(ScorerEntry e) { scorer_registry().push_back(std::move(e)); }
};

// A press kvpress ships that kvzap does not have, and why (press/kvpress_gaps.cpp).
struct KvpressGap {
  const char* kvpress_class;  // "QFilterPress"
  const char* name;           // the name it would have here ("qfilter")
  const char* reason;
};
std::span<const KvpressGap> kvpress_gaps();
// The gap a press name refers to (its name or kvpress's class name, any case, "Press" optional), or null.
const KvpressGap* find_kvpress_gap(const std::string& press_name);

// KVzap surrogate folder for `kind` ("linear" | "mlp"): opt.surrogate_dir, else the one shipped for the
// model under data/surrogates/ (throws kvzap::Error telling the user to pass --surrogate otherwise).
std::string kvzap_surrogate_dir(const PressSpec& opt, const Model& model, const std::string& kind);

std::unique_ptr<Press> make_threshold_press(std::unique_ptr<Scorer> scorer, const PressSpec& opt);
// Builds a fresh scorer of the same press (for RatioPress::clone).
using ScorerFactory = std::function<std::unique_ptr<Scorer>()>;
std::unique_ptr<Press> make_ratio_press(const ScorerFactory& make_scorer, const PressSpec& opt);

}  // namespace kvzap
