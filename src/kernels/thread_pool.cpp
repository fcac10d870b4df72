// Persistent pool: a job is published by bumping generation_; workers spin on it for a short while
// (decode issues a few hundred jobs per token, microseconds apart) and only then sleep on cv_.
#include "kernels/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvzap {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// How long an idle worker keeps spinning before it blocks on the condition variable.
constexpr auto kSpinBudget = std::chrono::microseconds(500);

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  workers_.reserve((size_t)n_threads_ - 1);
  for (int t = 1; t < n_threads_; ++t) workers_.emplace_back([this, t] { worker_main(t); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lk(mu_);
    cv_.notify_all();
  }
  for (auto& w : workers_) w.join();
}

// Claims indices of job `generation` one at a time. A claim is a CAS on next_, which also carries the
// job id, so a worker still holding an old job id can never claim (or run) an index of a newer job.
void ThreadPool::run_job(uint64_t generation, int tid) {
  const uint32_t id = (uint32_t)generation;
  const int slot = (int)(generation & 1);
  const Fn* fn = job_fn_[slot].load(std::memory_order_acquire);
  const int64_t n = job_n_[slot].load(std::memory_order_acquire);
  int64_t cur = next_.load(std::memory_order_acquire);
  for (;;) {
    if ((uint32_t)((uint64_t)cur >> 32) != id) return;  // the job is over (a newer one may be running)
    const int64_t i = cur & 0xffffffff;
    if (i >= n) return;
    if (!next_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    // Claimed: the caller now waits for this index, so fn and n are the live job's.
    if (!failed_.load(std::memory_order_relaxed)) {
      try {
        (*fn)(i, tid);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!error_) error_ = std::current_exception();
        failed_.store(true, std::memory_order_relaxed);
      }
    }
    remaining_.fetch_sub(1, std::memory_order_acq_rel);
    cur = next_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_main(int tid) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g;
    auto spin_start = std::chrono::steady_clock::now();
    int iter = 0;
    while ((g = generation_.load(std::memory_order_acquire)) == seen) {
      cpu_relax();
      if ((++iter & 127) != 0) continue;
      std::this_thread::yield();  // cheap when the core is ours; lets a descheduled peer run otherwise
      if (std::chrono::steady_clock::now() - spin_start < kSpinBudget) continue;
      // Sleep. sleepers_ is raised before the predicate is checked under the lock; the publisher
      // bumps generation_ before reading sleepers_ (both seq_cst), so a wake-up cannot be missed.
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1);
      cv_.wait(lk, [&] { return generation_.load() != seen; });
      sleepers_.fetch_sub(1);
      spin_start = std::chrono::steady_clock::now();
    }
    if (stop_.load()) return;
    seen = g;
    run_job(g, tid);
  }
}

void ThreadPool::run_chunk(int64_t n, const Fn& fn) {
  const uint64_t g = generation_.load(std::memory_order_relaxed) + 1;  // only this thread publishes
  const int slot = (int)(g & 1);
  job_fn_[slot].store(&fn, std::memory_order_relaxed);
  job_n_[slot].store(n, std::memory_order_relaxed);
  failed_.store(false, std::memory_order_relaxed);
  remaining_.store(n, std::memory_order_relaxed);
  next_.store((int64_t)((uint64_t)(uint32_t)g << 32), std::memory_order_release);
  generation_.store(g);  // seq_cst: publishes the job and orders against sleepers_ below
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lk(mu_);
    cv_.notify_all();
  }
  run_job(g, 0);
  int spins = 0;
  while (remaining_.load(std::memory_order_acquire) != 0) {  // indices other threads claimed
    cpu_relax();
    if ((++spins & 127) == 0) std::this_thread::yield();  // oversubscribed machine: let them run
  }
  if (error_) {
    std::exception_ptr e;
    std::swap(e, error_);
    std::rethrow_exception(e);
  }
}

void ThreadPool::parallel_for(int64_t n, FnRef fn) {
  if (n <= 0) return;
  if (n_threads_ == 1 || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  constexpr int64_t kMaxJob = (int64_t)1 << 30;  // indices must fit the low half of next_
  if (n <= kMaxJob) {
    run_chunk(n, fn);
    return;
  }
  for (int64_t base = 0; base < n; base += kMaxJob) {
    const int64_t count = std::min(kMaxJob, n - base);
    auto shifted = [&fn, base](int64_t i, int tid) { fn(base + i, tid); };
    run_chunk(count, FnRef(shifted));
  }
}

int ThreadPool::default_threads() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  const bool have_mask = sched_getaffinity(0, sizeof(mask), &mask) == 0;
  std::set<std::string> cores;  // one entry per physical core (its SMT sibling list)
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (have_mask && !CPU_ISSET(cpu, &mask)) continue;
    std::ifstream f("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/thread_siblings_list");
    if (!f) continue;
    std::string siblings;
    std::getline(f, siblings);
    if (!siblings.empty()) cores.insert(siblings);
  }
  if (!cores.empty()) return (int)cores.size();
  const unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? (int)hc : 1;
}

}  // namespace kvzap
