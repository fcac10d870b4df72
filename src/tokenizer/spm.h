// SentencePiece-style BPE (GGUF tokenizer.ggml.model = "llama"; Llama 2, Gemma, Mistral...):
// the text's spaces become U+2581 "▁", it is split into UTF-8 characters, then the adjacent pair whose
// concatenation is the vocabulary entry with the highest score is merged, again and again; a piece
// that is no vocabulary entry falls back to its bytes as <0xXX> tokens.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvzap::tok {

// Every ' ' replaced by "▁" (U+2581, bytes E2 96 81).
std::string spm_escape_whitespace(std::string_view text);
// The inverse, for the normal tokens' text.
std::string spm_unescape_whitespace(std::string_view text);

struct SpmVocab {
  const std::unordered_map<std::string, int32_t>* text_to_id = nullptr;  // every token's stored text
  const std::vector<float>* scores = nullptr;                            // [n_vocab]
  std::array<int32_t, 256> byte_token{};  // <0xXX> token of each byte (else its one-byte text), -1 if none
  int32_t unk_id = -1;                    // for a byte without any token
};

// Appends the ids of `escaped` (already through spm_escape_whitespace). The merge order follows
// llama.cpp's llm_tokenizer_spm: highest score first, ties to the leftmost pair.
void spm_tokenize(std::string_view escaped, const SpmVocab& v, std::vector<int32_t>& out);

}  // namespace kvzap::tok
