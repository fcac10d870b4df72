// ScoreLog: the scores a press gave, by (layer, KV head, position), for research access (press.h).
#include <algorithm>
#include <limits>

#include "press/press.h"

namespace kvzap {

namespace {
constexpr float kNotScored = std::numeric_limits<float>::quiet_NaN();
}

void ScoreLog::clear() {
  std::fill(values_.begin(), values_.end(), kNotScored);
  n_pos_ = 0;
}

void ScoreLog::set_shape(int n_layer, int n_head_kv) {
  if (n_layer == n_layer_ && n_head_kv == n_head_kv_) return;
  n_layer_ = n_layer, n_head_kv_ = n_head_kv;
  n_pos_ = capacity_ = 0;
  values_.clear();
}

// Re-lays the rows out with a capacity of at least min_capacity (doubling, so a long decode regrows
// O(log n) times); the new tail is NaN.
void ScoreLog::grow(int64_t min_capacity) {
  const int64_t cap = std::max<int64_t>({min_capacity, 2 * capacity_, 256});
  std::vector<float> grown((size_t)n_layer_ * n_head_kv_ * cap, kNotScored);
  for (int64_t row = 0; row < (int64_t)n_layer_ * n_head_kv_; row++)
    std::copy_n(values_.begin() + row * capacity_, capacity_, grown.begin() + row * cap);
  values_.swap(grown);
  capacity_ = cap;
}

void ScoreLog::put(int layer, int head, int32_t pos, float score) {
  if (pos < 0 || layer < 0 || layer >= n_layer_ || head < 0 || head >= n_head_kv_) return;
  if (pos >= capacity_) grow((int64_t)pos + 1);
  values_[((size_t)layer * n_head_kv_ + head) * capacity_ + pos] = score;
  n_pos_ = std::max(n_pos_, (int64_t)pos + 1);
}

}  // namespace kvzap
