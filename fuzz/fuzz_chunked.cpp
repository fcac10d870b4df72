// The gate's chunked-body framing (server/chunked_framing.h): fed whole and fed in pieces whose sizes come
// from the input, it must reach the same verdict and consume the same bytes, never more than it was given.
#include <cstdint>
#include <cstdlib>

#include "server/chunked_framing.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kvzap::server::ChunkedFraming;
  if (size < 2) return 0;
  const uint64_t limit = 1ull << (data[0] % 24);  // --max-body from 1 byte to 8 MiB
  const size_t step = 1 + data[1] % 17;
  const char* body = reinterpret_cast<const char*>(data + 2);
  const size_t n = size - 2;

  ChunkedFraming whole(limit);
  size_t whole_used = 0;
  const ChunkedFraming::Verdict v = whole.feed(body, n, whole_used);
  if (whole_used > n) std::abort();
  if (v == ChunkedFraming::Verdict::kComplete && whole.payload() > limit) std::abort();

  ChunkedFraming pieces(limit);
  size_t used_total = 0;
  ChunkedFraming::Verdict pv = ChunkedFraming::Verdict::kMore;
  for (size_t at = 0; at < n && pv == ChunkedFraming::Verdict::kMore; at += step) {
    const size_t len = step < n - at ? step : n - at;
    size_t used = 0;
    pv = pieces.feed(body + at, len, used);
    if (used > len) std::abort();
    used_total += used;
  }
  if (pv != v) std::abort();
  if (v == ChunkedFraming::Verdict::kComplete && used_total != whole_used) std::abort();
  return 0;
}
