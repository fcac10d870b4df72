// ThreadPool: every index exactly once, valid thread ids, contiguous ranges, wake-up after sleeping,
// exceptions propagate and leave the pool usable.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/read_bandwidth.h"
#include "kernels/thread_pool.h"

using kvzap::ThreadPool;
using kvzap::ReadBandwidth;
using kvzap::measure_read_bandwidth;
using kvzap::sum_reference;

TEST(ThreadPool, EveryIndexRunsExactlyOnce) {
  for (int nth : {1, 2, 3, 4}) {
    ThreadPool pool(nth);
    EXPECT_EQ(pool.size(), nth);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1000}) {
      std::vector<std::atomic<int>> hits((size_t)n);
      std::atomic<int> bad_tid{0};
      pool.parallel_for(n, [&](int64_t i, int tid) {
        hits[(size_t)i].fetch_add(1);
        if (tid < 0 || tid >= nth) bad_tid.fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[(size_t)i].load(), 1) << "nth=" << nth << " n=" << n << " i=" << i;
      EXPECT_EQ(bad_tid.load(), 0);
    }
  }
}

TEST(ThreadPool, ManySmallJobsInARow) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  for (int job = 0; job < 5000; ++job) pool.parallel_for(4, [&](int64_t i, int) { total.fetch_add(i + 1); });
  EXPECT_EQ(total.load(), 5000 * 10);
}

TEST(ThreadPool, BackToBackJobsNeverMixIndices) {
  // Jobs of different sizes and functions in quick succession: a worker that is late for one job must
  // not run indices (or the function) of another.
  ThreadPool pool(3);
  std::atomic<int> worker_indices{0};
  for (int job = 0; job < 20000; ++job) {
    const int n = 1 + job % 9;
    std::atomic<int> hits[16] = {};
    std::atomic<int> bad{0};
    pool.parallel_for(n, [&](int64_t i, int tid) {
      if (tid != 0) worker_indices.fetch_add(1);
      if (i < 0 || i >= n) bad.fetch_add(1);
      hits[i].fetch_add(1);
      std::atomic<int> work{0};  // a little work so that workers join in
      for (int k = 0; k < 300; ++k) work.fetch_add(1, std::memory_order_relaxed);
    });
    ASSERT_EQ(bad.load(), 0);
    for (int i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "job " << job << " index " << i;
    for (int i = n; i < 16; ++i) ASSERT_EQ(hits[i].load(), 0) << "job " << job << " index " << i;
  }
  EXPECT_GT(worker_indices.load(), 0);  // the workers did take part
}

TEST(ThreadPool, WorkersWakeAfterSleeping) {
  ThreadPool pool(2);
  std::atomic<int> seen_worker{0};
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // longer than the spin budget
    std::atomic<int> count{0};
    pool.parallel_for(64, [&](int64_t, int tid) {
      if (tid == 1) seen_worker.store(1);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      count.fetch_add(1);
    });
    EXPECT_EQ(count.load(), 64);
  }
  // 64 indices of 200 us each: the worker must have taken some of them at least once.
  EXPECT_EQ(seen_worker.load(), 1);
}

TEST(ThreadPool, RangesAreContiguousAndCoverEverything) {
  for (int nth : {1, 2, 3}) {
    ThreadPool pool(nth);
    for (int64_t n : {1, 2, 5, 100}) {
      std::vector<std::atomic<int>> hits((size_t)n);
      std::atomic<int> ranges{0};
      pool.parallel_ranges(n, [&](int64_t b, int64_t e, int) {
        EXPECT_LT(b, e);
        ranges.fetch_add(1);
        for (int64_t i = b; i < e; ++i) hits[(size_t)i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[(size_t)i].load(), 1);
      EXPECT_EQ(ranges.load(), std::min<int64_t>(n, nth));
    }
  }
}

TEST(ThreadPool, ExceptionPropagatesAndPoolStaysUsable) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(100, [&](int64_t i, int) {
    if (i == 37) throw std::runtime_error("boom");
  }), std::runtime_error);
  std::atomic<int> count{0};
  pool.parallel_for(10, [&](int64_t, int) { count.fetch_add(1); });
  EXPECT_EQ(count.load(), 10);
}

TEST(ThreadPool, DefaultThreadsIsPositiveAndBounded) {
  const int n = ThreadPool::default_threads();
  EXPECT_GE(n, 1);
  const unsigned hc = std::thread::hardware_concurrency();
  if (hc > 0) {
    EXPECT_LE(n, (int)hc);
  }
}

// kernels/read_bandwidth: the timed sum reads the whole buffer (its checksum equals the scalar
// reference's) and the figure is a finite positive rate.
TEST(ReadBandwidth, SumsTheWholeBufferAndGivesARate) {
  ThreadPool pool(2);
  const size_t bytes = (size_t)3 << 20;  // not a multiple of 16 floats per thread slice after the split
  const ReadBandwidth r = measure_read_bandwidth(pool, bytes + 12, 2);
  const size_t n = (bytes + 12) / sizeof(float);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; i++) x[i] = (float)(i & 7);
  EXPECT_DOUBLE_EQ(r.checksum, sum_reference(x.data(), n));
  EXPECT_GT(r.gb_per_s, 0.01);
  EXPECT_LT(r.gb_per_s, 1e5);
}
