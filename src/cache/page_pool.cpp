#include "cache/page_pool.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

namespace kvzap {

namespace {
int32_t& refcount_of(uint8_t* page) { return *reinterpret_cast<int32_t*>(page - 64); }
}  // namespace

PagePool::PagePool(int64_t page_bytes, int64_t budget_bytes) : page_bytes_(page_bytes), budget_bytes_(budget_bytes) {
  if (page_bytes <= 0) throw Error("internal: page size must be positive");
}

PagePool::~PagePool() {
  // Pages still referenced belong to caches being destroyed after the pool: a caller bug, but the
  // memory is released with them by the OS; only the free list is ours to free here.
  trim();
}

uint8_t* PagePool::allocate() {
  const size_t bytes = kHeader + (size_t)((page_bytes_ + 63) / 64 * 64);
  uint8_t* raw = (uint8_t*)std::aligned_alloc(64, bytes);
  if (!raw) throw std::bad_alloc();
  return raw + kHeader;
}

int64_t PagePool::pages_available() const {
  if (budget_bytes_ <= 0) return std::numeric_limits<int64_t>::max();
  const int64_t cap = budget_bytes_ / page_bytes_;
  return cap > pages_in_use_ ? cap - pages_in_use_ : 0;
}

uint8_t* PagePool::take() {
  if (pages_available() <= 0) return nullptr;
  return take_forced();
}

uint8_t* PagePool::take_forced() {
  uint8_t* p;
  if (!free_.empty()) {
    p = free_.back();
    free_.pop_back();
  } else {
    p = allocate();
  }
  refcount_of(p) = 1;
  pages_in_use_++;
  if (pages_in_use_ > peak_pages_) peak_pages_ = pages_in_use_;
  return p;
}

void PagePool::ref(uint8_t* page) { refcount_of(page)++; }

void PagePool::unref(uint8_t* page) {
  if (--refcount_of(page) > 0) return;
  free_.push_back(page);
  pages_in_use_--;
}

int32_t PagePool::refcount(const uint8_t* page) const { return refcount_of(const_cast<uint8_t*>(page)); }

void PagePool::trim() {
  for (uint8_t* p : free_) std::free(p - kHeader);
  free_.clear();
  free_.shrink_to_fit();
}

}  // namespace kvzap
