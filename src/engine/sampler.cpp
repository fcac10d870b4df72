#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace kvzap {

Sampler::Sampler(const SamplerOptions& opt, int n_vocab) : opt_(opt), n_vocab_(n_vocab) {
  rng_ = SplitMix64(opt.seed ^ 0x9e3779b97f4a7c15ull);
  cand_.reserve(n_vocab);
  prob_.reserve(n_vocab);
}

double Sampler::uniform() { return rng_.uniform01(); }  // common/rng.h: the same draws on every platform

int32_t Sampler::argmax(const float* logits, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; i++)
    if (logits[i] > logits[best]) best = i;
  return best;
}

int32_t Sampler::sample(const float* logits) {
  if (opt_.temperature <= 0) return argmax(logits, n_vocab_);
  cand_.clear();
  for (int i = 0; i < n_vocab_; i++) cand_.emplace_back(logits[i], i);
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t keep = cand_.size();
  if (opt_.top_k > 0 && (size_t)opt_.top_k < keep) {
    keep = (size_t)opt_.top_k;
    std::partial_sort(cand_.begin(), cand_.begin() + keep, cand_.end(), by_logit);
    cand_.resize(keep);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Probabilities at temperature 1 for the top-p / min-p filters.
  const float mx = cand_[0].first;
  std::vector<double>& p = prob_;
  p.resize(cand_.size());
  double sum = 0;
  for (size_t i = 0; i < cand_.size(); i++) sum += (p[i] = std::exp((double)cand_[i].first - mx));
  if (opt_.top_p < 1.0f) {
    double cum = 0;
    size_t n = 0;
    while (n < cand_.size()) {
      cum += p[n++] / sum;
      if (cum >= opt_.top_p) break;
    }
    cand_.resize(std::max<size_t>(n, 1));
  }
  if (opt_.min_p > 0) {
    size_t n = 0;
    while (n < cand_.size() && p[n] >= opt_.min_p * p[0]) n++;
    cand_.resize(std::max<size_t>(n, 1));
  }
  sum = 0;
  for (size_t i = 0; i < cand_.size(); i++) sum += (p[i] = std::exp(((double)cand_[i].first - mx) / opt_.temperature));
  double r = uniform() * sum;
  for (size_t i = 0; i < cand_.size(); i++) {
    r -= p[i];
    if (r < 0) return cand_[i].second;
  }
  return cand_.back().second;
}

}  // namespace kvzap
