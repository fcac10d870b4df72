// Read bandwidth of this machine, STREAM-style: every thread of the pool sums its slice of a buffer much
// larger than the last-level cache, best of several passes. The roofline decode is compared against
// (`kvzap bench --read-bandwidth`): a decoded token must read every weight and the whole KV prefix once.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kvzap {

class ThreadPool;

struct ReadBandwidth {
  double gb_per_s = 0;   // bytes read / best pass time, 1e9 bytes per GB
  double checksum = 0;   // sum of the buffer (so the reads cannot be optimised away; tests check it)
};

// Sums a buffer of `bytes` (floats, filled once) on every thread of `pool`, `passes` times; best pass.
ReadBandwidth measure_read_bandwidth(ThreadPool& pool, size_t bytes, int passes);
// The scalar reference of one pass's sum (tests).
double sum_reference(const float* x, size_t n);

}  // namespace kvzap
