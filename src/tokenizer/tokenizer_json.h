// Tokenizers from a Hugging Face folder: tokenizer.json (the `tokenizers` library's format) plus
// tokenizer_config.json (BOS/EOS names, add_bos_token, chat_template; or chat_template.jinja).
// Two kinds of BPE model load, each only with the normalizers and pre-tokenizers its families use:
//   - byte-level BPE (Llama 3, Qwen2/3, SmolLM2, GPT-2): ByteLevel pre-tokenizer alone (GPT-2 regex),
//     or after a Split on the Llama 3 / Qwen2 regex, or after Digits(individual_digits) (SmolLM);
//     normalizer none or NFC;
//   - SentencePiece-style BPE with byte_fallback (Gemma 3): normalizer Replace(" " -> "▁"), no
//     pre-tokenizer (or Gemma's Split on " ", a no-op after that normalizer), merges by rank.
// Anything else is refused with one line naming tokenizer.json and the part it cannot reproduce.
#pragma once
#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"

namespace kvzap {

// n_vocab > 0: the model's embedding rows; the vocabulary is padded with unused entries up to it
// (Qwen's embeddings are larger than the tokenizer) and a larger tokenizer is an error.
std::unique_ptr<Tokenizer> tokenizer_from_hf_dir(const std::string& dir, int32_t n_vocab = 0);

}  // namespace kvzap
