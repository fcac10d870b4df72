#include "tokenizer/spm.h"

#include <algorithm>
#include <cstdio>

#include "kvzap/error.h"

namespace kvzap::tok {

namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581

// Length of the UTF-8 sequence a lead byte starts (a stray continuation byte counts as one).
size_t utf8_len(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// A run of the text: one character at first, then whatever was merged into it (len 0 once merged away).
struct Piece {
  size_t offset, len;
  int32_t prev, next;
};

struct Candidate {
  float score;
  int32_t left, right;
  size_t len;  // bytes of the merged text when proposed: a changed sum means a side merged since
};

// Heap order: the highest score on top; equal scores: the leftmost pair first.
bool lower_priority(const Candidate& a, const Candidate& b) {
  return a.score < b.score || (a.score == b.score && a.left > b.left);
}

}  // namespace

std::string spm_escape_whitespace(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  for (char c : text) {
    if (c == ' ') out += kSpace;
    else out += c;
  }
  return out;
}

std::string spm_unescape_whitespace(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, kSpace.size(), kSpace) == 0) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += text[i++];
    }
  }
  return out;
}

void spm_tokenize(std::string_view text, const SpmVocab& v, std::vector<int32_t>& out) {
  if (text.empty()) return;
  std::vector<Piece> pieces;
  pieces.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    const size_t n = std::min(utf8_len((unsigned char)text[off]), text.size() - off);
    const int32_t i = (int32_t)pieces.size();
    pieces.push_back({off, n, i - 1, off + n < text.size() ? i + 1 : -1});
    off += n;
  }
  const auto& ids = *v.text_to_id;
  const auto& scores = *v.scores;
  std::vector<Candidate> heap;
  std::string key;
  auto propose = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const size_t len = pieces[left].len + pieces[right].len;
    key.assign(text.substr(pieces[left].offset, len));
    const auto it = ids.find(key);
    if (it == ids.end() || it->second < 0 || (size_t)it->second >= scores.size()) return;
    heap.push_back({scores[(size_t)it->second], left, right, len});
    std::push_heap(heap.begin(), heap.end(), lower_priority);
  };
  for (int32_t i = 1; i < (int32_t)pieces.size(); i++) propose(i - 1, i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), lower_priority);
    const Candidate c = heap.back();
    heap.pop_back();
    Piece& l = pieces[(size_t)c.left];
    Piece& r = pieces[(size_t)c.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != c.len) continue;  // stale
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) pieces[(size_t)r.next].prev = c.left;
    propose(l.prev, c.left);
    propose(c.left, l.next);
  }
  for (int32_t i = 0; i >= 0; i = pieces[(size_t)i].next) {
    const Piece& p = pieces[(size_t)i];
    key.assign(text.substr(p.offset, p.len));
    if (const auto it = ids.find(key); it != ids.end()) {
      out.push_back(it->second);
      continue;
    }
    // Not in the vocabulary (only ever a single character): its bytes.
    for (size_t b = 0; b < p.len; b++) {
      const unsigned char byte = (unsigned char)text[p.offset + b];
      const int32_t id = v.byte_token[byte] >= 0 ? v.byte_token[byte] : v.unk_id;
      if (id < 0) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", byte);
        throw Error(std::string("tokenizer: byte ") + hex + " has no token (no <" + hex + ">) and there is no unknown token");
      }
      out.push_back(id);
    }
  }
}

}  // namespace kvzap::tok
