// Persistent worker pool: workers are created once and spin briefly, then sleep, between jobs.
// parallel_for(n, fn) runs fn(i, thread_id) for i in [0, n) across the caller plus the workers
// and returns when every index is done. No allocation per call. One job at a time: call it from one
// thread (the owner), never from inside fn. An exception thrown by fn is rethrown in the caller.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvzap {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads counts the calling thread; 1 = run inline
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // fn(index, thread_id); thread_id in [0, size()). Indices are handed out dynamically (atomic counter).
  void parallel_for(int64_t n, const std::function<void(int64_t, int)>& fn);
  // Convenience: split [0, n) into size() contiguous ranges: fn(begin, end, thread_id).
  void parallel_ranges(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn);

  static int default_threads();  // physical cores (falls back to hardware_concurrency)

 private:
  void worker_main(int tid);
  void run_indices(int tid);
  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> next_{0};
  std::atomic<int> remaining_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> sleepers_{0};  // workers blocked on cv_ (the caller only notifies when > 0)
  std::exception_ptr error_;      // first exception thrown by fn in this job (guarded by mu_)
  int64_t n_ = 0;
  const std::function<void(int64_t, int)>* fn_ = nullptr;
};

}  // namespace kvzap
