// Where a chunked request body ends (RFC 9112 §7.1), found from its bytes as they arrive, without keeping
// them: the gate uses it to read a chunked body itself (so a slow one costs a socket, not a worker) and to
// refuse one that is too large or malformed before any worker sees it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvzap::server {

class ChunkedFraming {
 public:
  enum class Verdict { kMore, kComplete, kTooLarge, kMalformed };

  // max_payload: the most payload bytes the body may declare (the server's --max-body).
  explicit ChunkedFraming(uint64_t max_payload) : max_payload_(max_payload) {}

  // Consumes bytes of the body (after the header block) up to its end; `used` says how many were part of
  // it (the rest belong to a pipelined request). kMore: the body goes on past these bytes.
  Verdict feed(const char* data, size_t n, size_t& used);

  uint64_t payload() const { return payload_; }  // payload bytes declared so far
  // Framing may cost at most this many bytes beyond the payload (chunk-size lines, extensions, trailers).
  static constexpr uint64_t kMaxOverhead = 64 * 1024;
  static constexpr size_t kMaxLine = 1024;  // a chunk-size line with its extensions, or one trailer line

 private:
  enum class State { kSize, kExtension, kSizeLf, kData, kDataCr, kDataLf, kTrailerStart, kTrailerLine, kTrailerLf, kEndLf, kDone };
  Verdict fail(Verdict v) {
    failed_ = v;
    return v;
  }
  uint64_t max_payload_;
  State state_ = State::kSize;
  uint64_t chunk_ = 0;       // size of the chunk being read; its data left in kData
  int digits_ = 0;           // hex digits of the current chunk-size
  size_t line_ = 0;          // bytes of the current size or trailer line
  uint64_t payload_ = 0;
  uint64_t overhead_ = 0;    // bytes that were not payload
  Verdict failed_ = Verdict::kMore;
};

}  // namespace kvzap::server
