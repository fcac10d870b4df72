// Compressed contexts kept for reuse: after a request's prompt is prefilled (and compressed by its press),
// a copy-on-write fork of its sequence is kept under (press settings, tenant) with the prompt's tokens.
// A later request whose prompt starts with those tokens forks the entry instead of prefilling again.
// LRU within a byte budget; the pages count against the engine's KV budget like any sequence's, and the
// scheduler drops entries first when the pool is short. An entry may be charged to a quota (the scheduler
// charges entries of press settings a request brought to its tenant): a quota holds at most a share of
// the budget and drops its own oldest entries past it, so one client's settings cannot fill the cache.
// Scheduler thread only.
#pragma once
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace kvzap::server {

class PrefixCache {
 public:
  struct Entry {
    std::string key;              // press settings + tenant
    std::string quota;            // who is charged for it; empty = no quota (the server's own press)
    std::vector<int32_t> tokens;  // the compressed context's token ids
    std::unique_ptr<Sequence> seq;
    int64_t bytes = 0;            // the entry's resident bytes when stored
  };

  explicit PrefixCache(int64_t budget_bytes) : budget_(budget_bytes) {}
  // Bytes each entry holds besides its KV pages and tokens (its sequence's logits), counted against the
  // budget. Set before the scheduler runs.
  void set_entry_overhead(int64_t bytes) { entry_overhead_ = bytes; }
  int64_t budget_bytes() const { return budget_; }
  int64_t bytes() const { return bytes_; }
  size_t size() const { return entries_.size(); }

  // The entry under `key` whose tokens are the longest prefix of `prompt` (marked most recently used),
  // or null.
  Entry* lookup(const std::string& key, const std::vector<int32_t>& prompt);
  Entry* find_exact(const std::string& key, const std::vector<int32_t>& tokens);
  // Stores a sequence (replacing an entry with the same key and tokens), then drops the quota's least
  // recently used entries past its share, then any least recently used entries past the budget. An entry
  // larger than the whole budget (or its quota's share) is not kept. Returns false when it was not kept.
  bool insert(std::string key, std::vector<int32_t> tokens, std::unique_ptr<Sequence> seq, std::string quota = {});
  // The share of the budget one quota may hold (default kQuotaShare).
  void set_quota_share(double share) { quota_share_ = share; }
  int64_t quota_bytes(const std::string& quota) const;
  static constexpr double kQuotaShare = 0.25;
  // Drops the least recently used entry; false when empty.
  bool evict_lru();
  void clear() { entries_.clear(), quota_bytes_.clear(), bytes_ = 0; }

 private:
  std::list<Entry>::iterator erase(std::list<Entry>::iterator it);  // the entry after it
  int64_t budget_, bytes_ = 0, entry_overhead_ = 0;
  double quota_share_ = kQuotaShare;
  std::list<Entry> entries_;  // front = most recently used
  std::map<std::string, int64_t> quota_bytes_;  // bytes held per non-empty quota
};

}  // namespace kvzap::server
