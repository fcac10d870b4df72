// A small least-recently-used map: get() refreshes an entry, put() evicts the oldest beyond the capacity.
// Not thread-safe (callers hold their own lock).
#pragma once
#include <cstddef>
#include <list>
#include <unordered_map>
#include <utility>

namespace kvzap::server {

template <class K, class V>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity) {}

  // The value, now the most recently used; null when absent.
  V* get(const K& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }
  // Inserts or replaces; drops the least recently used entries beyond the capacity (0: keeps nothing).
  void put(const K& key, V value) {
    if (auto it = index_.find(key); it != index_.end()) {
      it->second->second = std::move(value);
      order_.splice(order_.begin(), order_, it->second);
    } else {
      order_.emplace_front(key, std::move(value));
      index_.emplace(key, order_.begin());
    }
    while (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }
  size_t size() const { return order_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_;
  std::list<std::pair<K, V>> order_;  // most recent first
  std::unordered_map<K, typename std::list<std::pair<K, V>>::iterator> index_;
};

}  // namespace kvzap::server
