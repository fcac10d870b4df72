// Code-point level helpers for the tokenizer: strict UTF-8 decoding, the three character classes the
// pre-tokenizer regexes use (\p{L}, \p{N}, \s) and NFC normalisation. Categories come from utf8proc.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvzap::tok {

enum CharClass : uint8_t {
  kOther = 0,
  kLetter = 1,      // \p{L}: Lu Ll Lt Lm Lo
  kNumber = 2,      // \p{N}: Nd Nl No
  kWhitespace = 4,  // \s: the Unicode White_Space property (what Rust/Python regex \s matches)
};

// Length of the well-formed UTF-8 sequence starting at s[i] (1..4), or 0 if it is not well formed
// (bad lead byte, bad continuation, overlong form, surrogate, > U+10FFFF, or cut off by the end).
size_t utf8_sequence_length(std::string_view s, size_t i);
// The sequence length if complete, 0 if ill-formed, or -k when s ends k bytes into a sequence that is
// valid so far (e.g. -2 for "\xE2\x82" at the end of s): what a streaming decoder must hold back.
int utf8_prefix_state(std::string_view s, size_t i);

// Decodes a sequence already known to be well formed.
uint32_t utf8_decode_at(std::string_view s, size_t i, size_t len);
void utf8_append(std::string& out, uint32_t cp);

uint8_t char_class(uint32_t cp);

// Decoded text: code points, their classes, and the byte offset where each starts (plus the end).
struct CodepointText {
  std::vector<uint32_t> cps;
  std::vector<uint8_t> classes;
  std::vector<uint32_t> byte_at;  // size cps.size() + 1
  void assign(std::string_view valid_utf8);
};

// NFC normalisation of valid UTF-8.
std::string nfc_normalize(std::string_view valid_utf8);

}  // namespace kvzap::tok
