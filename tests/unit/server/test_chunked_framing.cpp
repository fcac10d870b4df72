// ChunkedFraming: where a chunked body ends, fed whole, byte by byte, or with a pipelined request behind
// it; refusals for bodies over the limit and for malformed framing.
#include <gtest/gtest.h>

#include <string>

#include "server/chunked_framing.h"

using kvzap::server::ChunkedFraming;
using Verdict = ChunkedFraming::Verdict;

namespace {

// Feeds `body` in pieces of `step` bytes; returns the verdict and how many bytes belonged to the body.
Verdict feed_in_pieces(const std::string& body, size_t step, size_t& consumed, uint64_t max_payload = 1 << 20) {
  ChunkedFraming f(max_payload);
  consumed = 0;
  Verdict v = Verdict::kMore;
  for (size_t at = 0; at < body.size() && v == Verdict::kMore; at += step) {
    size_t used = 0;
    v = f.feed(body.data() + at, std::min(step, body.size() - at), used);
    consumed += used;
  }
  return v;
}

}  // namespace

TEST(ChunkedFraming, FindsTheEndWhateverThePieces) {
  const std::string body = "5\r\nhello\r\n1a;name=value\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n\r\n";
  for (size_t step : {body.size(), (size_t)1, (size_t)2, (size_t)7}) {
    size_t consumed = 0;
    EXPECT_EQ(feed_in_pieces(body, step, consumed), Verdict::kComplete) << step;
    EXPECT_EQ(consumed, body.size()) << step;
  }
  ChunkedFraming f(1 << 20);
  size_t used = 0;
  ASSERT_EQ(f.feed(body.data(), body.size(), used), Verdict::kComplete);
  EXPECT_EQ(f.payload(), 5u + 26u);
}

TEST(ChunkedFraming, StopsAtTheEndOfTheBodyBeforeAPipelinedRequest) {
  const std::string body = "3\r\nabc\r\n0\r\n\r\n";
  const std::string next = "GET /health HTTP/1.1\r\n\r\n";
  ChunkedFraming f(1 << 20);
  size_t used = 0;
  const std::string both = body + next;
  ASSERT_EQ(f.feed(both.data(), both.size(), used), Verdict::kComplete);
  EXPECT_EQ(used, body.size());
}

TEST(ChunkedFraming, ReadsThroughTrailerFields) {
  const std::string body = "2\r\nhi\r\n0\r\nX-Checksum: 12\r\nX-Other: a\r\n\r\n";
  size_t consumed = 0;
  EXPECT_EQ(feed_in_pieces(body, 3, consumed), Verdict::kComplete);
  EXPECT_EQ(consumed, body.size());
}

TEST(ChunkedFraming, AnIncompleteBodyWantsMore) {
  size_t consumed = 0;
  EXPECT_EQ(feed_in_pieces("10\r\nonly part", 4, consumed), Verdict::kMore);
  EXPECT_EQ(feed_in_pieces("3\r\nabc\r\n0\r\n", 1, consumed), Verdict::kMore);  // the final empty line is missing
}

TEST(ChunkedFraming, RefusesAPayloadOverTheLimitFromItsDeclaredSize) {
  ChunkedFraming f(100);
  size_t used = 0;
  const std::string declared = "65\r\n";  // 101 bytes declared: refused before any of them arrive
  EXPECT_EQ(f.feed(declared.data(), declared.size(), used), Verdict::kTooLarge);
  // The limit counts all chunks together.
  size_t consumed = 0;
  const std::string two = "32\r\n" + std::string(50, 'a') + "\r\n33\r\n";
  EXPECT_EQ(feed_in_pieces(two, 5, consumed, 100), Verdict::kTooLarge);
  const std::string exact = "32\r\n" + std::string(50, 'a') + "\r\n32\r\n" + std::string(50, 'b') + "\r\n0\r\n\r\n";
  EXPECT_EQ(feed_in_pieces(exact, 5, consumed, 100), Verdict::kComplete);
  // A size that overflows any counter.
  const std::string huge = "fffffffffffffffffff\r\n";
  EXPECT_EQ(feed_in_pieces(huge, 1, consumed), Verdict::kTooLarge);
}

TEST(ChunkedFraming, RefusesFramingThatCostsMoreThanItsAllowance) {
  // One payload byte per chunk with a long extension: framing overhead grows ~1000x the payload.
  std::string body;
  while (body.size() <= ChunkedFraming::kMaxOverhead + 2048) body += "1;" + std::string(900, 'e') + "\r\nx\r\n";
  size_t consumed = 0;
  EXPECT_EQ(feed_in_pieces(body, 4096, consumed), Verdict::kTooLarge);
}

TEST(ChunkedFraming, RefusesMalformedFraming) {
  const char* bad[] = {
      "zz\r\nab\r\n0\r\n\r\n",             // not hex
      "\r\n",                               // no size
      "2\r\nabX\r\n0\r\n\r\n",              // data longer than declared
      "2\nab\r\n0\r\n\r\n",                 // bare LF after the size
      "2\r\nab\r\n0\r\n\n",                 // bare LF ends the body
      "2\r\nab\r\n0\r\nBad\nTrailer\r\n\r\n",  // bare LF in a trailer
  };
  for (const char* b : bad) {
    size_t consumed = 0;
    EXPECT_EQ(feed_in_pieces(b, 1, consumed), Verdict::kMalformed) << b;
  }
  const std::string long_extension = "5;" + std::string(ChunkedFraming::kMaxLine + 10, 'e') + "\r\nhello\r\n0\r\n\r\n";
  size_t consumed = 0;
  EXPECT_EQ(feed_in_pieces(long_extension, 64, consumed), Verdict::kMalformed);
}

TEST(ChunkedFraming, AFailureIsFinal) {
  ChunkedFraming f(1 << 20);
  size_t used = 0;
  ASSERT_EQ(f.feed("q", 1, used), Verdict::kMalformed);
  EXPECT_EQ(f.feed("0\r\n\r\n", 5, used), Verdict::kMalformed);
  EXPECT_EQ(used, 0u);
}
