// The KV page pool shared by every sequence of an engine: fixed-size pages with reference counts (so
// forks share pages copy-on-write) and a byte budget. A page is counted once however many sequences
// hold it. Freed pages go to a free list and are reused at once by any sequence; trim() returns the
// free list to the system.
//
// Budget: take() never exceeds the budget — it returns null instead, and the caller decides (wait,
// preempt, refuse). take_forced() may exceed it: only for copy-on-write copies made while evicting,
// where failing would leave a stream half-compacted; the overshoot shows in over_budget() and the
// scheduler preempts. Not thread-safe: one owner thread (see engine/engine.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvzap/error.h"

namespace kvzap {

// Thrown by KvCache appends made outside the engine's admission check when the budget is exhausted.
class KvBudgetExceeded : public Error {
 public:
  using Error::Error;
};

class PagePool {
 public:
  // page_bytes: bytes of one page's payload. budget_bytes <= 0: unlimited.
  PagePool(int64_t page_bytes, int64_t budget_bytes);
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  int64_t page_bytes() const { return page_bytes_; }
  int64_t budget_bytes() const { return budget_bytes_; }  // <= 0: unlimited
  void set_budget_bytes(int64_t b) { budget_bytes_ = b; }

  // A page with reference count 1, or null if it would exceed the budget.
  uint8_t* take();
  // A page with reference count 1 even past the budget (copy-on-write during eviction only).
  uint8_t* take_forced();
  void ref(uint8_t* page);
  // Drops one reference; the page returns to the free list at 0.
  void unref(uint8_t* page);
  int32_t refcount(const uint8_t* page) const;

  // Pages in use (each counted once), and what the budget still allows.
  int64_t pages_in_use() const { return pages_in_use_; }
  int64_t bytes_in_use() const { return pages_in_use_ * page_bytes_; }
  int64_t pages_available() const;  // INT64_MAX when unlimited
  bool over_budget() const { return budget_bytes_ > 0 && bytes_in_use() > budget_bytes_; }
  int64_t pages_free_listed() const { return (int64_t)free_.size(); }
  // Peak of bytes_in_use since construction.
  int64_t peak_bytes() const { return peak_pages_ * page_bytes_; }
  // Total entries evicted by presses from sequences of this pool (metrics).
  int64_t entries_evicted_total() const { return evicted_total_; }
  void count_evicted(int64_t n) { evicted_total_ += n; }

  // Returns free-listed pages to the system.
  void trim();

 private:
  uint8_t* allocate();
  static constexpr size_t kHeader = 64;  // refcount lives in a 64-byte header before the payload
  int64_t page_bytes_, budget_bytes_;
  int64_t pages_in_use_ = 0, peak_pages_ = 0, evicted_total_ = 0;
  std::vector<uint8_t*> free_;
};

}  // namespace kvzap
