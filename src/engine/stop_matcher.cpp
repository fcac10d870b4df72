#include "engine/stop_matcher.h"

#include <algorithm>

namespace kvzap {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (s.empty()) continue;
    max_stop_ = std::max(max_stop_, s.size());
    stops_.push_back(std::move(s));
  }
}

StopMatcher::Piece StopMatcher::push(const std::string& token_bytes) {
  Piece out;
  if (stopped_) return out;
  pending_ += utf8_.push(token_bytes);
  // The earliest match of any stop string wins.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    // What follows the match (an incomplete UTF-8 tail included) is never released.
    pending_.resize(first);
    out.text = std::move(pending_);
    pending_.clear();
    utf8_ = Utf8Stream();
    out.stopped = stopped_ = true;
    return out;
  }
  // Hold back the last max_stop_ - 1 bytes (they may begin a stop string), never splitting a code point:
  // released text ends before a continuation byte's lead.
  const size_t hold = std::min(pending_.size(), max_stop_ > 0 ? max_stop_ - 1 : 0);
  size_t n = pending_.size() - hold;
  while (n > 0 && n < pending_.size() && ((unsigned char)pending_[n] & 0xC0) == 0x80) n--;
  out.text = pending_.substr(0, n);
  pending_.erase(0, n);
  return out;
}

std::string StopMatcher::flush() {
  std::string out = std::move(pending_);
  pending_.clear();
  out += utf8_.flush();
  return out;
}

}  // namespace kvzap
