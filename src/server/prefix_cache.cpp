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

bool PrefixCache::insert(std::string key, std::vector<int32_t> tokens, std::unique_ptr<Sequence> seq, std::string quota) {
  const int64_t bytes = seq->cache().bytes_resident() + entry_overhead_ + (int64_t)(tokens.size() * sizeof(int32_t));
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->key == key && it->tokens == tokens) {
      erase(it);
      break;
    }
  const int64_t quota_limit = (int64_t)((double)budget_ * quota_share_);
  if (bytes > budget_ || (!quota.empty() && bytes > quota_limit)) return false;
  entries_.push_front({std::move(key), quota, std::move(tokens), std::move(seq), bytes});
  bytes_ += bytes;
  if (!quota.empty()) {
    quota_bytes_[quota] += bytes;
    // The quota's own oldest entries go first (never the one just stored: it alone fits the share).
    for (auto it = entries_.end(); quota_bytes(quota) > quota_limit;) {
      if (--it == entries_.begin()) break;
      if (it->quota == quota) it = erase(it);
    }
  }
  while (bytes_ > budget_ && entries_.size() > 1) evict_lru();
  return true;
}

int64_t PrefixCache::quota_bytes(const std::string& quota) const {
  auto it = quota_bytes_.find(quota);
  return it == quota_bytes_.end() ? 0 : it->second;
}

std::list<PrefixCache::Entry>::iterator PrefixCache::erase(std::list<Entry>::iterator it) {
  bytes_ -= it->bytes;
  if (!it->quota.empty()) {
    auto q = quota_bytes_.find(it->quota);
    if ((q->second -= it->bytes) <= 0) quota_bytes_.erase(q);
  }
  return entries_.erase(it);
}

bool PrefixCache::evict_lru() {
  if (entries_.empty()) return false;
  erase(std::prev(entries_.end()));
  return true;
}

}  // namespace kvzap::server
