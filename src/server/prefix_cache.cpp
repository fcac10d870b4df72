#include "server/prefix_cache.h"

#include <algorithm>

namespace kvzap::server {

PrefixCache::Entry* PrefixCache::lookup(const std::string& key, const std::vector<int32_t>& prompt) {
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->key != key || it->tokens.size() > prompt.size()) continue;
    if (best != entries_.end() && it->tokens.size() <= best->tokens.size()) continue;
    if (std::equal(it->tokens.begin(), it->tokens.end(), prompt.begin())) best = it;
  }
  if (best == entries_.end()) return nullptr;
  entries_.splice(entries_.begin(), entries_, best);
  return &entries_.front();
}

PrefixCache::Entry* PrefixCache::find_exact(const std::string& key, const std::vector<int32_t>& tokens) {
  for (auto& e : entries_)
    if (e.key == key && e.tokens == tokens) return &e;
  return nullptr;
}

bool PrefixCache::insert(std::string key, std::vector<int32_t> tokens, std::unique_ptr<Sequence> seq) {
  const int64_t bytes = seq->cache().bytes_resident() + entry_overhead_ + (int64_t)(tokens.size() * sizeof(int32_t));
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->key == key && it->tokens == tokens) {
      bytes_ -= it->bytes;
      entries_.erase(it);
      break;
    }
  if (bytes > budget_) return false;
  entries_.push_front({std::move(key), std::move(tokens), std::move(seq), bytes});
  bytes_ += bytes;
  while (bytes_ > budget_ && entries_.size() > 1) evict_lru();
  return true;
}

bool PrefixCache::evict_lru() {
  if (entries_.empty()) return false;
  bytes_ -= entries_.back().bytes;
  entries_.pop_back();
  return true;
}

}  // namespace kvzap::server
