#include "server/chunked_framing.h"

#include <algorithm>

namespace kvzap::server {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

ChunkedFraming::Verdict ChunkedFraming::feed(const char* data, size_t n, size_t& used) {
  used = 0;
  if (failed_ != Verdict::kMore) return failed_;
  if (state_ == State::kDone) return Verdict::kComplete;
  while (used < n) {
    if (state_ == State::kData) {  // payload: taken in one step, not byte by byte
      const uint64_t take = std::min<uint64_t>(chunk_, n - used);
      chunk_ -= take;
      used += (size_t)take;
      if (chunk_ == 0) state_ = State::kDataCr;
      continue;
    }
    const char c = data[used++];
    if (++overhead_ > kMaxOverhead) return fail(Verdict::kTooLarge);
    switch (state_) {
      case State::kSize:
        if (++line_ > kMaxLine) return fail(Verdict::kMalformed);
        if (const int v = hex_value(c); v >= 0) {
          if (++digits_ > 15) return fail(Verdict::kTooLarge);  // 2^60 bytes: over any limit
          chunk_ = chunk_ * 16 + (uint64_t)v;
          break;
        }
        if (digits_ == 0) return fail(Verdict::kMalformed);
        if (c == ';' || c == ' ' || c == '\t') state_ = State::kExtension;
        else if (c == '\r') state_ = State::kSizeLf;
        else return fail(Verdict::kMalformed);
        break;
      case State::kExtension:  // chunk-ext: skipped, bounded by the line limit
        if (++line_ > kMaxLine) return fail(Verdict::kMalformed);
        if (c == '\r') state_ = State::kSizeLf;
        else if (c == '\n') return fail(Verdict::kMalformed);
        break;
      case State::kSizeLf:
        if (c != '\n') return fail(Verdict::kMalformed);
        line_ = 0;
        digits_ = 0;
        if (chunk_ == 0) {
          state_ = State::kTrailerStart;
          break;
        }
        payload_ += chunk_;
        if (payload_ > max_payload_) return fail(Verdict::kTooLarge);
        state_ = State::kData;
        break;
      case State::kDataCr:
        if (c != '\r') return fail(Verdict::kMalformed);
        state_ = State::kDataLf;
        break;
      case State::kDataLf:
        if (c != '\n') return fail(Verdict::kMalformed);
        state_ = State::kSize;
        break;
      case State::kTrailerStart:  // an empty line ends the body; anything else starts a trailer field
        if (c == '\r') {
          state_ = State::kEndLf;
          break;
        }
        if (c == '\n') return fail(Verdict::kMalformed);
        line_ = 1;
        state_ = State::kTrailerLine;
        break;
      case State::kTrailerLine:
        if (++line_ > kMaxLine) return fail(Verdict::kMalformed);
        if (c == '\r') state_ = State::kTrailerLf;
        else if (c == '\n') return fail(Verdict::kMalformed);
        break;
      case State::kTrailerLf:
        if (c != '\n') return fail(Verdict::kMalformed);
        state_ = State::kTrailerStart;
        break;
      case State::kEndLf:
        if (c != '\n') return fail(Verdict::kMalformed);
        state_ = State::kDone;
        return Verdict::kComplete;
      case State::kData:
      case State::kDone:
        break;
    }
  }
  return Verdict::kMore;
}

}  // namespace kvzap::server
