// Streamed generated text against stop strings: token bytes go in, releasable text comes out. Text that
// could still be the start of a stop string, and an incomplete UTF-8 sequence, are held back until the
// next token decides them; a match ends the stream with the text before it (the stop string itself is
// never released). One per generating sequence, reset at each generation.
#pragma once
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kvzap {

class StopMatcher {
 public:
  StopMatcher() = default;
  explicit StopMatcher(std::vector<std::string> stops);

  struct Piece {
    std::string text;      // releasable now (complete code points, never the start of a stop string)
    bool stopped = false;  // a stop string matched: `text` is all that precedes it; the stream is over
  };
  // Appends one token's bytes. After a stop, further pushes return nothing.
  Piece push(const std::string& token_bytes);
  // The stream ends for another reason (end of generation, a limit): everything held back, with an
  // incomplete UTF-8 tail replaced by U+FFFD.
  std::string flush();

 private:
  std::vector<std::string> stops_;  // empty strings dropped
  size_t max_stop_ = 0;             // longest stop string, bytes
  Utf8Stream utf8_;
  std::string pending_;             // decoded, not yet released
  bool stopped_ = false;
};

}  // namespace kvzap
