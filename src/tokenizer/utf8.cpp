// UTF-8 validation and the streaming detokenizer's hold-back of incomplete characters.
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_text.h"

namespace kvzap {
namespace {

constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Bytes covered by one U+FFFD at an ill-formed position: the lead byte plus the continuation bytes
// that were still acceptable (Unicode's "maximal subpart" practice, as Python and browsers do).
size_t ill_formed_span(std::string_view s, size_t i) {
  size_t n = 1;
  while (i + n < s.size()) {
    const int st = tok::utf8_prefix_state(s.substr(0, i + n + 1), i);
    if (st >= 0) break;  // the prefix s[i..i+n] no longer extends to a valid sequence
    ++n;
  }
  return n;
}

// Appends s[begin, end) with ill-formed parts replaced; stops before a truncated tail when
// hold_tail, returning where it stopped.
size_t sanitize(std::string_view s, bool hold_tail, std::string& out) {
  size_t i = 0;
  while (i < s.size()) {
    const int st = tok::utf8_prefix_state(s, i);
    if (st > 0) {
      out.append(s.substr(i, (size_t)st));
      i += (size_t)st;
    } else if (st < 0 && hold_tail) {
      break;  // a character still arriving
    } else if (st < 0) {
      out += kReplacement;
      i += (size_t)-st;
    } else {
      out += kReplacement;
      i += ill_formed_span(s, i);
    }
  }
  return i;
}

}  // namespace

bool is_valid_utf8(const std::string& s, size_t* bad_offset) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = tok::utf8_sequence_length(s, i);
    if (len == 0) {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    i += len;
  }
  return true;
}

std::string Utf8Stream::push(const std::string& bytes) {
  pending_ += bytes;
  std::string out;
  const size_t used = sanitize(pending_, true, out);
  pending_.erase(0, used);
  return out;
}

std::string Utf8Stream::flush() {
  std::string out;
  sanitize(pending_, false, out);
  pending_.clear();
  return out;
}

}  // namespace kvzap
