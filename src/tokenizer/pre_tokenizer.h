// Pre-tokenizers: split text into the pieces BPE runs on, reproducing the regexes of each model family
// (the pre_tokenizer regexes of their tokenizer.json) with hand-written scanners over code points (no regex
// engine).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_text.h"

namespace kvzap::tok {

struct Span {
  uint32_t begin, end;  // byte offsets into the text, [begin, end)
};

// Appends the pieces of t (already decoded) to out, in order; together they cover all of t.
void pre_tokenize(PreTokenizer pre, const CodepointText& t, std::vector<Span>& out);

// Convenience for tests and tools: the pieces as strings. Throws kvzap::Error on invalid UTF-8.
// (No NFC here: normalisation is a separate step of Tokenizer::encode for Qwen2.)
std::vector<std::string> pre_tokenize(PreTokenizer pre, std::string_view text);

// Name in tokenizer.ggml.pre -> PreTokenizer; throws kvzap::Error naming an unknown value.
PreTokenizer pre_tokenizer_from_name(const std::string& name);

}  // namespace kvzap::tok
