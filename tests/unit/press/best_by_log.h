// What a decoding press's compression must keep, computed from its logged scores (the decoding_<press> and
// prefill_decoding_<a>+<b> tests).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "press/press.h"
#include "test_support.h"

namespace kvzap::test {

// Per stream (layer-major): the `target` best positions among `before` by the logged scores, ties evicting
// the earlier position first (the ratio policy's order).
inline KeptSet best_by_log(const KeptSet& before, const ScoreLog& log, int64_t target) {
  KeptSet out;
  for (size_t i = 0; i < before.size(); i++) {
    const float* row = log.data() + i * (size_t)log.capacity();
    std::vector<int32_t> order = before[i];
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] < row[b]; });
    const int64_t n_drop = std::max<int64_t>(0, (int64_t)order.size() - target);
    std::vector<int32_t> keep(order.begin() + n_drop, order.end());
    std::sort(keep.begin(), keep.end());
    out.push_back(keep);
  }
  return out;
}

}  // namespace kvzap::test
