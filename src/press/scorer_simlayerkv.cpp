// "simlayerkv" (docs/ALGORITHMS.md §8.29, kvpress SimLayerKVPress): per layer, the last n_last queries of the
// context attend (causally, as SnapKV's window does) to every key; the attention they give the keys before
// the window, averaged over the window rows and all query heads, is summed over the first n_initial keys
// and the last n_recent of them. A layer whose sum exceeds lazy_threshold is "lazy": every head keeps only
// slots [0, n_initial) and the last n_recent - n_last slots (kvpress's keys[-n_recent + n_last:]); the other
// layers keep everything. Nothing is evicted when lazy_threshold is 1 or the context holds no more than
// n_initial + n_recent + n_last tokens. The press sets its own budget: it takes no ratio.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kvzap/error.h"
#include "model/model.h"
#include "press/baselines.h"
#include "press/kvzip_math.h"

namespace kvzap {
namespace {

class SimLayerKvScorer : public CacheContextScorer, public BudgetSplit {
 public:
  SimLayerKvScorer(const ModelConfig& c, double lazy_threshold, int n_last, int64_t n_recent, int64_t n_initial)
      : cfg_(c), threshold_(lazy_threshold), n_last_(n_last), n_recent_(n_recent), n_initial_(n_initial),
        queries_(c.n_layer, c.n_head, c.head_dim, n_last) {
    // kvpress slices keys[-n_recent + n_last:]: with n_recent <= n_last that slice is no longer the recent
    // end (it repeats the whole cache or its head), which a cache that frees entries cannot copy.
    if (n_recent <= n_last)
      throw Error("simlayerkv needs n_recent > n_last (a lazy layer keeps its last n_recent - n_last keys), got n_recent " +
                  std::to_string(n_recent) + ", n_last " + std::to_string(n_last));
  }
  std::string budget_name() const override { return "lazy layers"; }
  bool uses_ratio() const override { return false; }
  void observe_step(const LayerStep& step, const KvCache& cache) override { (void)cache, queries_.push(step); }
  void reset() override { queries_.clear(); }

  // Every entry of a layer that is not lazy scores +inf (kept). On a lazy layer the entries kvpress keeps
  // score +inf and the others the layer's laziness (the attention mass on its ends, finite): evicted.
  void score_cache(const KvCache& cache, CacheScores& out) override {
    size_scores(cache, out);
    const float keep = std::numeric_limits<float>::infinity();
    for (auto& layer : out)
      for (auto& s : layer) std::fill(s.begin(), s.end(), keep);
    const int L = cfg_.n_layer;
    bool any_judged = false;
    for (int l = 0; l < L; l++) any_judged |= judged_layer(cache, l);
    if (threshold_ == 1.0 || !any_judged) return;
    const int64_t T = require_full_context(cache, "simlayerkv");
    if (T <= n_initial_ + n_recent_ + n_last_) return;  // kvpress: too short, no compression
    const std::vector<double> mass = end_mass(cache, T);
    const int H = cfg_.n_head_kv;
    for (int l = 0; l < L; l++) {
      if (!judged_layer(cache, l) || !(mass[(size_t)l] > threshold_)) continue;
      const int64_t recent_from = T - (n_recent_ - n_last_);
      for (int h = 0; h < H; h++) {
        std::vector<float>& s = out[(size_t)l][(size_t)h];
        for (int64_t i = n_initial_; i < recent_from; i++) s[(size_t)i] = (float)mass[(size_t)l];
      }
    }
  }

  void mark_evictions(const KvCache& cache, const CacheScores& scores, double ratio, EvictionMask& drop) override {
    (void)ratio;
    const int H = cache.n_head_kv();
    for (int l = 0; l < cache.n_layer(); l++) {
      if (!judged_layer(cache, l)) continue;
      for (int h = 0; h < H; h++) {
        const std::vector<float>& s = scores[(size_t)l][(size_t)h];
        std::vector<uint8_t>& d = drop[(size_t)l * H + h];
        for (size_t i = 0; i < s.size(); i++) d[i] = !(s[i] == std::numeric_limits<float>::infinity());
      }
    }
  }

 private:
  // Per layer: the window's attention on keys [0, n_initial) and [T - n_last - n_recent, T - n_last), averaged
  // over the n_last rows and all query heads (kvpress's mean over heads and window, then the two sums).
  std::vector<double> end_mass(const KvCache& cache, int64_t T) {
    const int L = cfg_.n_layer, Hkv = cfg_.n_head_kv, G = cfg_.n_group(), D = cfg_.head_dim;
    const int64_t W = n_last_, m = T - W;  // keys before the window: slots [0, m)
    const int64_t q_stride = (int64_t)cfg_.n_head * D;
    for (int l = 0; l < L; l++)
      if (judged_layer(cache, l) && (queries_.size(l) != W || queries_.positions(l)[W - 1] != T - 1))
        throw Error("internal: simlayerkv did not observe the last " + std::to_string(W) + " queries of layer " +
                    std::to_string(l));
    const float scale = cfg_.query_scale();
    std::vector<double> part((size_t)L * Hkv, 0.0);  // per (layer, KV head), summed in order below
    parallel_for((int64_t)L * Hkv, [&](int64_t task, int) {
      const int l = (int)(task / Hkv), hk = (int)(task % Hkv);
      if (!judged_layer(cache, l)) return;
      std::vector<float> keys, kt((size_t)(T * D)), probs((size_t)(W * T));
      std::vector<int32_t> kpos;
      stream_keys(cache, l, hk, keys);
      stream_positions(cache, l, hk, kpos);
      transpose_rows(keys.data(), D, T, D, kt.data());
      std::vector<int64_t> visible((size_t)W);  // causal: window row j sees the keys up to its own position
      for (int64_t j = 0; j < W; j++)
        visible[(size_t)j] = std::upper_bound(kpos.begin(), kpos.end(), queries_.positions(l)[j]) - kpos.begin();
      double sum = 0;
      for (int g = 0; g < G; g++) {
        const float* q = queries_.rows(l) + (size_t)(hk * G + g) * D;
        attention_probs(q, q_stride, W, visible.data(), kt.data(), T, D, scale, probs.data());
        for (int64_t j = 0; j < W; j++) {
          const float* row = probs.data() + j * T;
          for (int64_t i = 0; i < n_initial_; i++) sum += row[i];
          for (int64_t i = m - n_recent_; i < m; i++) sum += row[i];
        }
      }
      part[(size_t)task] = sum;
    });
    std::vector<double> mass((size_t)L, 0.0);
    for (int l = 0; l < L; l++) {
      for (int hk = 0; hk < Hkv; hk++) mass[(size_t)l] += part[(size_t)l * Hkv + hk];
      mass[(size_t)l] /= (double)(W * cfg_.n_head);
    }
    return mass;
  }

  ModelConfig cfg_;
  double threshold_;
  int n_last_;
  int64_t n_recent_, n_initial_;
  WindowQueries queries_;
};

}  // namespace

std::unique_ptr<Scorer> make_simlayerkv_scorer(const ModelConfig& c, double lazy_threshold, int n_last, int64_t n_recent,
                                               int64_t n_initial) {
  return std::make_unique<SimLayerKvScorer>(c, lazy_threshold, n_last, n_recent, n_initial);
}

namespace {
RegisterScorer reg({"simlayerkv",
                    "SimLayerKV: a layer whose last queries attend mostly (> lazy_threshold) to its first n_initial "
                    "and last n_recent keys keeps only those ends, the others keep everything (its own budget: no ratio)",
                    false,
                    [](const PressSpec& o, const Model& m) -> std::unique_ptr<Scorer> {
                      return make_simlayerkv_scorer(
                          m.config(), press_param(o, "lazy_threshold"), (int)press_param(o, "n_last"),
                          (int64_t)press_param(o, "n_recent"), (int64_t)press_param(o, "n_initial"));
                    },
                    {.params = {{"lazy_threshold", 1.0, 0, 1, false,
                                 "a layer is lazy when its last queries give its ends more attention than this (1: none is)"},
                                {"n_last", 1, 1, 4096, true, "the last queries that judge laziness"},
                                {"n_recent", 1024, 2, 1 << 20, true, "recent keys a lazy layer keeps (less n_last), > n_last"},
                                {"n_initial", 4, 0, 1 << 20, true, "initial (sink) keys a lazy layer keeps"}},
                     .own_budget = true,
                     .demo_params = {{"lazy_threshold", 0.0}, {"n_recent", 32}},
                     .kvpress_parity = "exact (kvpress SimLayerKVPress, at lazy_threshold 0.29, n_recent 256)"}});

}  // namespace

}  // namespace kvzap
