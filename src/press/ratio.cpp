// Fixed-ratio policy (docs/ALGORITHMS.md §7, §8): once the context is prefilled, evict the lowest-scored
// fraction of its entries — over the whole cache (kvpress KVzip default), per layer, per (layer, head)
// (kvpress ScorerPress), or AdaKV-style per layer with a per-head safeguard; scorers implementing
// BudgetSplit (PyramidKV, ChunkKV, AdaKV wrappers) choose the split themselves.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "kvzap/error.h"
#include "press/policy.h"

namespace kvzap {

void WrappedBudgetScorer::score_cache(const KvCache& cache, CacheScores& out) {
  if (!cache_inner_) throw Error("internal: this press needs the session to score a context");
  cache_inner_->score_cache(cache, out);
}

RatioScope parse_ratio_scope(const std::string& s) {
  if (s == "global") return RatioScope::Global;
  if (s == "layer") return RatioScope::Layer;
  if (s == "head") return RatioScope::Head;
  if (s == "adakv") return RatioScope::AdaKv;
  throw Error("unknown ratio scope '" + s + "' (expected global, layer, head or adakv)");
}

namespace {

const char* scope_name(RatioScope s) {
  switch (s) {
    case RatioScope::Global: return "global";
    case RatioScope::Layer: return "layer";
    case RatioScope::Head: return "head";
    case RatioScope::AdaKv: return "adakv";
  }
  return "?";
}

struct Candidate {
  float score;
  int32_t layer, head, slot;  // slot order = position order within a stream
};

bool lower(const Candidate& a, const Candidate& b) {
  if (a.score != b.score) return a.score < b.score;
  if (a.layer != b.layer) return a.layer < b.layer;
  if (a.head != b.head) return a.head < b.head;
  return a.slot < b.slot;
}

int64_t budget(double ratio, int64_t n) { return (int64_t)std::floor(ratio * (double)n); }

// Marks the k lowest candidates in the per-stream masks.
void mark_k_lowest(std::vector<Candidate>& cands, int64_t k, EvictionMask& drop, int n_head) {
  if (k <= 0) return;
  k = std::min<int64_t>(k, (int64_t)cands.size());
  std::nth_element(cands.begin(), cands.begin() + (k - 1), cands.end(), lower);
  for (int64_t i = 0; i < k; i++) {
    const Candidate& c = cands[(size_t)i];
    drop[(size_t)c.layer * n_head + c.head][(size_t)c.slot] = 1;
  }
}

float sortable(float v) {
  // NaN would break the ordering; a scorer that produced one gets its entry evicted first.
  return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v;
}

void add_stream(std::vector<Candidate>& cands, const std::vector<float>& s, int l, int h) {
  for (size_t i = 0; i < s.size(); i++) cands.push_back({sortable(s[i]), (int32_t)l, (int32_t)h, (int32_t)i});
}

// kvpress AdaKVPress for one layer (see evict_lowest in policy.h).
void mark_adakv_layer(const KvCache& cache, const CacheScores& scores, int l, double ratio, EvictionMask& drop,
                      std::vector<Candidate>& cands, double alpha_safeguard) {
  const int H = cache.n_head_kv();
  cands.clear();
  int64_t n_pruned = 0;
  std::vector<Candidate> head;
  for (int h = 0; h < H; h++) {
    const std::vector<float>& s = scores[(size_t)l][(size_t)h];
    const int64_t T = (int64_t)s.size();
    const int64_t n_kept = kvpress_n_kept(ratio, T);
    // kvpress: at least one protected entry per head while any is kept.
    // (alpha_safeguard 0: none protected.)
    int64_t n_safe = (int64_t)((double)n_kept * alpha_safeguard);
    if (alpha_safeguard > 0) n_safe = n_kept > 0 ? std::max<int64_t>(1, n_safe) : 0;
    n_pruned += T - n_kept;
    head.clear();
    add_stream(head, s, l, h);
    // The n_safe best entries (ties: the later slot is the better one, the mirror of eviction order)
    // are protected: they never become candidates.
    if (n_safe > 0)
      std::nth_element(head.begin(), head.begin() + (T - n_safe), head.end(), lower);
    cands.insert(cands.end(), head.begin(), head.begin() + (T - n_safe));
  }
  mark_k_lowest(cands, n_pruned, drop, H);
}

}  // namespace

int64_t kvpress_n_kept(double ratio, int64_t T) {
  if (T <= 0) return 0;
  return std::max<int64_t>(1, (int64_t)((double)T * (1.0 - ratio)));
}

EvictionMask empty_mask(const KvCache& cache) {
  const int L = cache.n_layer(), H = cache.n_head_kv();
  EvictionMask drop((size_t)L * H);
  for (int l = 0; l < L; l++)
    for (int h = 0; h < H; h++) drop[(size_t)l * H + h].assign((size_t)cache.length(l, h), 0);
  return drop;
}

int64_t evict_marked(KvCache& cache, const EvictionMask& drop) {
  const int L = cache.n_layer(), H = cache.n_head_kv();
  if (drop.size() != (size_t)L * H) throw Error("internal: eviction mask for the wrong number of streams");
  int64_t removed = 0;
  for (int l = 0; l < L; l++)
    for (int h = 0; h < H; h++) {
      const std::vector<uint8_t>& d = drop[(size_t)l * H + h];
      if ((int64_t)d.size() != cache.length(l, h)) throw Error("internal: eviction mask of the wrong length");
      if (std::find(d.begin(), d.end(), 1) != d.end()) removed += cache.evict(l, h, d);
    }
  return removed;
}

void check_score_shape(const KvCache& cache, const CacheScores& scores) {
  const int L = cache.n_layer(), H = cache.n_head_kv();
  if (scores.size() != (size_t)L) throw Error("internal: scores for " + std::to_string(scores.size()) + " layers, cache has " + std::to_string(L));
  for (int l = 0; l < L; l++) {
    if (scores[(size_t)l].size() != (size_t)H) throw Error("internal: scores for a layer have the wrong head count");
    for (int h = 0; h < H; h++)
      if ((int64_t)scores[(size_t)l][(size_t)h].size() != cache.length(l, h))
        throw Error("internal: " + std::to_string(scores[(size_t)l][(size_t)h].size()) + " scores for a stream of " +
                    std::to_string(cache.length(l, h)) + " entries (layer " + std::to_string(l) + ", head " +
                    std::to_string(h) + ")");
  }
}

void mark_lowest_in_stream(const std::vector<float>& scores, int64_t n, std::vector<uint8_t>& drop) {
  std::vector<Candidate> cands;
  cands.reserve(scores.size());
  add_stream(cands, scores, 0, 0);
  EvictionMask one(1);
  one[0].swap(drop);
  mark_k_lowest(cands, n, one, 1);
  one[0].swap(drop);
}

void mark_lowest(const KvCache& cache, const CacheScores& scores, double ratio, RatioScope scope, EvictionMask& drop,
                 bool include_sliding, double alpha_safeguard) {
  check_score_shape(cache, scores);
  if (!(ratio > 0)) return;  // ratio 0: the cache is not touched at all
  const int L = cache.n_layer(), H = cache.n_head_kv();
  auto skip = [&](int l) { return !include_sliding && cache.layer_window(l) > 0; };
  std::vector<Candidate> cands;
  switch (scope) {
    case RatioScope::Global:
      cands.reserve((size_t)cache.entries_kept());
      for (int l = 0; l < L; l++)
        for (int h = 0; h < H && !skip(l); h++) add_stream(cands, scores[(size_t)l][(size_t)h], l, h);
      mark_k_lowest(cands, budget(ratio, (int64_t)cands.size()), drop, H);
      break;
    case RatioScope::Layer:
      for (int l = 0; l < L; l++) {
        if (skip(l)) continue;
        cands.clear();
        for (int h = 0; h < H; h++) add_stream(cands, scores[(size_t)l][(size_t)h], l, h);
        mark_k_lowest(cands, budget(ratio, (int64_t)cands.size()), drop, H);
      }
      break;
    case RatioScope::Head:
      for (int l = 0; l < L; l++)
        for (int h = 0; h < H && !skip(l); h++) {
          cands.clear();
          add_stream(cands, scores[(size_t)l][(size_t)h], l, h);
          mark_k_lowest(cands, (int64_t)cands.size() - kvpress_n_kept(ratio, (int64_t)cands.size()), drop, H);
        }
      break;
    case RatioScope::AdaKv:
      for (int l = 0; l < L; l++)
        if (!skip(l)) mark_adakv_layer(cache, scores, l, ratio, drop, cands, alpha_safeguard);
      break;
  }
}

int64_t evict_lowest(KvCache& cache, const CacheScores& scores, double ratio, RatioScope scope,
                     bool include_sliding) {
  check_score_shape(cache, scores);
  if (!(ratio > 0)) return 0;
  EvictionMask drop = empty_mask(cache);
  mark_lowest(cache, scores, ratio, scope, drop, include_sliding);
  return evict_marked(cache, drop);
}

RatioPress::RatioPress(std::unique_ptr<Scorer> scorer, const PressSpec& opt, ScorerFactory remake)
    : scorer_(std::move(scorer)),
      remake_(std::move(remake)),
      spec_(opt),
      scorer_name_(opt.name),
      ratio_(opt.ratio),
      scope_(parse_ratio_scope(opt.ratio_scope)),
      sliding_layers_(opt.sliding_layers) {
  if (!scorer_) throw Error("internal: the ratio policy needs a scorer");
  if (!(ratio_ >= 0 && ratio_ < 1)) throw Error("the ratio must be in [0, 1), got " + std::to_string(ratio_));
  if (sliding_layers_ && !scorer_->per_step() && !scorer_->scores_sliding_layers())
    throw Error(opt.name + " scores the whole context, which a sliding-window layer does not hold: it judges the "
                "global layers only (turn off sliding_layers / --press-sliding-layers, or use a per-token press such as kvzap-mlp or knorm)");
}

std::string RatioPress::name() const {
  const auto* split = dynamic_cast<const BudgetSplit*>(scorer_.get());
  const std::string budget = split ? split->budget_name() : scope_name(scope_);
  char buf[200];
  if (split && !split->uses_ratio()) {
    std::snprintf(buf, sizeof buf, "%s (%s)", scorer_name_.c_str(), budget.c_str());
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%s (ratio %g, %s)", scorer_name_.c_str(), ratio_, budget.c_str());
  return buf;
}

void RatioPress::begin_context(ContextRunner& runner) {
  start_context();
  if (auto* cs = dynamic_cast<CacheScorer*>(scorer_.get())) cs->set_pool(&runner.threads());
}

void RatioPress::start_context() {
  recorded_.clear();  // also forgets the scores of an earlier sequence
  score_log_.clear();
  scorer_->reset();
  in_context_ = true;
}

void RatioPress::after_attention(const LayerStep& step, KvCache& cache) {
  if (!in_context_ || step.n_tok <= 0) return;
  if (!scorer_->per_step()) {
    // A context scorer judges the global layers only (Scorer::score_context).
    if (sliding_layers_ || judged_layer(cache, step.layer)) scorer_->observe_step(step, cache);
    return;
  }
  const int H = cache.n_head_kv();
  if (recorded_.size() != (size_t)cache.n_layer()) {
    recorded_.assign((size_t)cache.n_layer(), {});
    for (auto& layer : recorded_) layer.resize((size_t)H);
  }
  auto& layer = recorded_[(size_t)step.layer];
  const int64_t n = step.n_tok;
  if (step_scores_.size() < (size_t)(H * n)) step_scores_.resize((size_t)(H * n));
  scorer_->score_step(step, cache, step_scores_.data());  // [H][n]
  for (int h = 0; h < H; h++) {
    const float* s = step_scores_.data() + (size_t)h * n;
    layer[(size_t)h].insert(layer[(size_t)h].end(), s, s + n);
  }
}

void RatioPress::end_context(ContextView& ctx) { finish_context(ctx.cache, &ctx); }

int64_t RatioPress::finish_context(KvCache& cache, ContextView* ctx) {
  in_context_ = false;
  CacheScores scores;
  if (!scorer_->per_step()) {
    auto* cs = dynamic_cast<CacheScorer*>(scorer_.get());
    if (ctx)
      scorer_->score_context(*ctx, scores);
    else if (cs)
      cs->score_cache(cache, scores);
    else
      throw Error("internal: a context scorer needs the context view");
    if (cs) cs->set_pool(nullptr);  // the session's pool may not outlive this context
  } else {
    if (cache.entries_kept() == 0) return 0;
    // Scores exist only if the press watched the prefill (start_context, then the press as observer).
    if (recorded_.empty()) throw Error("internal: the ratio press saw no step of the context");
    scores = std::move(recorded_);
    recorded_.clear();
    // A sliding-window layer freed its oldest entries while the context was prefilled: its stream holds
    // the last length() of the recorded positions. An earlier stage of a composed press (scorer_composed.cpp)
    // evicted some: the stream holds the recorded scores of the positions it kept (recorded in position
    // order from 0, the context's first position).
    for (int l = 0; l < cache.n_layer() && l < (int)scores.size(); l++)
      for (int h = 0; h < cache.n_head_kv() && h < (int)scores[(size_t)l].size(); h++) {
        std::vector<float>& s = scores[(size_t)l][(size_t)h];
        const int64_t len = cache.length(l, h);
        if ((int64_t)s.size() <= len) continue;
        if (cache.layer_window(l) > 0) {
          s.erase(s.begin(), s.end() - len);
          continue;
        }
        std::vector<float> kept((size_t)len);
        for (int64_t i = 0; i < len; i++) {
          const int32_t p = cache.position_at(l, h, i);
          if (p < 0 || (size_t)p >= s.size()) throw Error("internal: a kept entry's position was never scored");
          kept[(size_t)i] = s[(size_t)p];
        }
        s.swap(kept);
      }
  }
  if (ScoreLog* log = scores_to_keep(cache)) {
    check_score_shape(cache, scores);
    for (int l = 0; l < cache.n_layer(); l++)
      for (int h = 0; h < cache.n_head_kv(); h++)
        for (int64_t i = 0; i < cache.length(l, h); i++)
          log->put(l, h, cache.position_at(l, h, i), scores[(size_t)l][(size_t)h][(size_t)i]);
  }
  if (auto* split = dynamic_cast<BudgetSplit*>(scorer_.get())) {
    check_score_shape(cache, scores);
    if (!(ratio_ > 0) && split->uses_ratio()) return 0;
    EvictionMask drop = empty_mask(cache);
    split->mark_evictions(cache, scores, ratio_, drop);
    if (!sliding_layers_)  // its own budget split: the sliding-window layers' share is not taken
      for (int l = 0; l < cache.n_layer(); l++)
        if (cache.layer_window(l) > 0)
          for (int h = 0; h < cache.n_head_kv(); h++)
            std::fill(drop[(size_t)l * cache.n_head_kv() + h].begin(), drop[(size_t)l * cache.n_head_kv() + h].end(), 0);
    return evict_marked(cache, drop);
  }
  return evict_lowest(cache, scores, ratio_, scope_, sliding_layers_);
}

std::unique_ptr<Press> RatioPress::clone() const {
  if (in_context_)
    throw Error("press '" + scorer_name_ + "' cannot be copied while it scores a context: fork the sequence before "
                "or after the context");
  if (!remake_) throw Error("internal: press '" + scorer_name_ + "' was built without a scorer factory and cannot be copied");
  auto copy = std::make_unique<RatioPress>(remake_(), spec_, remake_);
  copy->copy_score_log(*this);
  return copy;
}

std::unique_ptr<Press> make_ratio_press(const ScorerFactory& make_scorer, const PressSpec& opt) {
  return std::make_unique<RatioPress>(make_scorer(), opt, make_scorer);
}

}  // namespace kvzap
