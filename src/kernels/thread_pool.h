// Persistent worker pool: workers are created once and spin briefly, then sleep, between jobs.
// parallel_for(n, fn) runs fn(i, thread_id) for i in [0, n) across the caller plus the workers
// and returns when every index is done. No allocation per call: fn is taken by reference (FnRef), never
// copied into a std::function. One job at a time: call it from one
// thread (the owner), never from inside fn. An exception thrown by fn is rethrown in the caller.
// The caller never waits for a worker that has not claimed an index: a worker that wakes late (or is
// descheduled on a busy machine) finds the job gone and does nothing.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <algorithm>
#include <exception>
#include <type_traits>
#include <mutex>
#include <thread>
#include <vector>

namespace kvzap {

// A non-owning reference to a callable void(int64_t, int): what parallel_for runs. Valid while the
// callable lives (parallel_for returns before the temporary it was built from dies).
class FnRef {
 public:
  template <class F>
  FnRef(F&& f)  // NOLINT: implicit, so lambdas pass straight in
      : obj_((void*)&f), call_([](void* o, int64_t i, int t) { (*static_cast<std::remove_reference_t<F>*>(o))(i, t); }) {}
  void operator()(int64_t i, int tid) const { call_(obj_, i, tid); }

 private:
  void* obj_;
  void (*call_)(void*, int64_t, int);
};

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads counts the calling thread; 1 = run inline
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // fn(index, thread_id); thread_id in [0, size()). Indices are handed out dynamically (atomic counter).
  void parallel_for(int64_t n, FnRef fn);
  // Convenience: split [0, n) into size() contiguous ranges: fn(begin, end, thread_id).
  template <class F>
  void parallel_ranges(int64_t n, F&& fn) {
    if (n <= 0) return;
    const int64_t parts = std::min<int64_t>(n_threads_, n);
    parallel_for(parts, [&](int64_t p, int tid) { fn(n * p / parts, n * (p + 1) / parts, tid); });
  }

  static int default_threads();  // physical cores (falls back to hardware_concurrency)

 private:
  using Fn = FnRef;
  void worker_main(int tid);
  void run_job(uint64_t generation, int tid);
  void run_chunk(int64_t n, const Fn& fn);  // one job of at most kMaxJob indices
  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};  // id of the latest published job
  std::atomic<int64_t> next_{0};         // (job id & 0xffffffff) << 32 | next unclaimed index
  std::atomic<int64_t> remaining_{0};    // indices of the current job not finished yet
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};      // fn threw: skip the remaining indices
  std::atomic<int> sleepers_{0};         // workers blocked on cv_ (the caller only notifies when > 0)
  std::exception_ptr error_;             // first exception thrown by fn in this job (guarded by mu_)
  // Job descriptors by job id parity: a late worker reading job g's slot can never see job g+1's.
  std::atomic<int64_t> job_n_[2] = {0, 0};
  std::atomic<const Fn*> job_fn_[2] = {nullptr, nullptr};
};

}  // namespace kvzap
