// StopMatcher: stop strings across token boundaries, held-back text, UTF-8 sequences split over tokens.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/stop_matcher.h"

namespace {

using kvzap::StopMatcher;

// Feeds the pieces in order; returns everything released, and whether (and after which piece) it stopped.
struct Released {
  std::string text;
  int stopped_at = -1;
};
Released feed(StopMatcher& m, const std::vector<std::string>& pieces, bool flush_at_end = true) {
  Released r;
  for (size_t i = 0; i < pieces.size(); i++) {
    StopMatcher::Piece p = m.push(pieces[i]);
    r.text += p.text;
    if (p.stopped && r.stopped_at < 0) r.stopped_at = (int)i;
  }
  if (flush_at_end) r.text += m.flush();
  return r;
}

TEST(StopMatcher, WithoutStopStringsEveryCompleteCodePointIsReleasedAtOnce) {
  StopMatcher m;
  EXPECT_EQ(m.push("Hello").text, "Hello");
  EXPECT_EQ(m.push(" world").text, " world");
  // "é" is C3 A9: the lead byte alone is held back, the pair comes out whole.
  EXPECT_EQ(m.push("\xC3").text, "");
  EXPECT_EQ(m.push("\xA9!").text, "\xC3\xA9!");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, AStopStringSplitOverTokensEndsTheStreamBeforeIt) {
  StopMatcher m({"###"});
  const Released r = feed(m, {"The answer", " is 4", "#", "#", "# and more"});
  EXPECT_EQ(r.text, "The answer is 4");
  EXPECT_EQ(r.stopped_at, 4);
  // Nothing after a stop.
  EXPECT_EQ(m.push("later").text, "");
  EXPECT_FALSE(m.push("later").stopped);
}

TEST(StopMatcher, HoldsBackOnlyWhatCouldStillBeAStopString) {
  StopMatcher m({"END"});
  // "abcdE" : the last two bytes may begin "END"; the rest is released.
  StopMatcher::Piece p = m.push("abcdE");
  EXPECT_EQ(p.text, "abc");
  EXPECT_FALSE(p.stopped);
  // Not a stop after all: the held bytes come out with the next token's.
  p = m.push("Nx yz");
  EXPECT_FALSE(p.stopped);
  EXPECT_EQ(m.flush(), std::string("dENx yz").substr(p.text.size()));
}

TEST(StopMatcher, TheEarliestOfSeveralStopStringsWins) {
  StopMatcher m({"world", "lo w"});
  const Released r = feed(m, {"hello world"});
  EXPECT_EQ(r.text, "hel");
  EXPECT_EQ(r.stopped_at, 0);
}

TEST(StopMatcher, EmptyStopStringsAreIgnored) {
  StopMatcher m({"", "zz"});
  const Released r = feed(m, {"abc", "def"});
  EXPECT_EQ(r.text, "abcdef");
  EXPECT_EQ(r.stopped_at, -1);
}

TEST(StopMatcher, NeverReleasesHalfACodePoint) {
  // A two-byte hold could cut "日" (E6 97 A5) after its lead byte: the cut moves back to the lead.
  StopMatcher m({"xyz"});
  StopMatcher::Piece p = m.push("a\xE6\x97\xA5");
  EXPECT_EQ(p.text, "a");
  EXPECT_EQ(p.text + m.flush(), "a\xE6\x97\xA5");
}

TEST(StopMatcher, AStopStringMadeOfMultibyteTextMatches) {
  StopMatcher m({"\xE3\x80\x82"});  // "。"
  const Released r = feed(m, {"\xE7\xAD\x94", "\xE3\x80", "\x82", "more"});
  EXPECT_EQ(r.text, "\xE7\xAD\x94");
  EXPECT_EQ(r.stopped_at, 2);
}

TEST(StopMatcher, AnIncompleteTailAfterTheStopIsDropped) {
  StopMatcher m({"STOP"});
  // The token carries the stop string and the first byte of a two-byte code point.
  StopMatcher::Piece p = m.push("okSTOP\xC3");
  EXPECT_TRUE(p.stopped);
  EXPECT_EQ(p.text, "ok");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, FlushReplacesAnIncompleteTailAtTheEnd) {
  StopMatcher m;
  EXPECT_EQ(m.push("a\xC3").text, "a");
  EXPECT_EQ(m.flush(), "\xEF\xBF\xBD");  // U+FFFD
}

}  // namespace
