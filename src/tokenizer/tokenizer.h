// Tokenizers built from GGUF metadata: byte-level BPE (tokenizer.ggml.model "gpt2": SmolLM2, Llama 3,
// Qwen2/3) and SentencePiece-style BPE by score ("llama": Gemma, Llama 2, Mistral; spm.h).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "format/gguf.h"

namespace kvzap {

enum class PreTokenizer { Smollm, Llama3, Qwen2, Gpt2 };
enum class TokenizerKind { ByteLevelBpe, SentencePiece };

struct TokenizerVocab {
  TokenizerKind kind = TokenizerKind::ByteLevelBpe;
  // As stored in tokenizer.ggml.tokens: byte-level unicode form (ByteLevelBpe), or SentencePiece form
  // (spaces as U+2581, bytes as <0xXX> tokens of type 6).
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;    // 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
  // "left right", index = rank (ByteLevelBpe; SentencePiece from tokenizer.json: merges by rank over
  // characters with <0xXX> byte fallback, as HF's BPE model, instead of by score)
  std::vector<std::string> merges;
  std::vector<float> scores;           // [n_vocab] merge priority (SentencePiece from GGUF)
  // Set by tokenizer.json (tokenizer_json.h); GGUF vocabularies derive both from `pre` (Llama 3 ignores
  // merges for a piece that is a whole vocab entry; Qwen2 normalises to NFC).
  std::optional<bool> ignore_merges, nfc;
  PreTokenizer pre = PreTokenizer::Smollm;
  int32_t bos_id = -1, eos_id = -1, eot_id = -1, unk_id = -1, pad_id = -1;
  bool add_bos = false;
  bool add_eos = false;                // SentencePiece: encode(add_bos = true) also appends EOS
  bool add_space_prefix = false;       // SentencePiece: a space before text that follows BOS/a special token
  std::string chat_template;           // raw Jinja text from the file (used to pick a built-in formatter)
};

class Tokenizer {
 public:
  explicit Tokenizer(TokenizerVocab vocab);
  // Reads tokenizer.ggml.* from the file; throws kvzap::Error for a model other than "gpt2" / "llama",
  // or an unknown pre-tokenizer.
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::File& f);

  // Text must be valid UTF-8 (throws kvzap::Error "invalid UTF-8 at byte N" otherwise).
  // parse_special: literal special/control token strings in the text become their ids (user-defined
  // tokens always do, as in llama.cpp).
  std::vector<int32_t> encode(const std::string& text, bool add_bos, bool parse_special = true) const;
  // As above, but no special token is matched across a byte offset in `no_special_inside` (sorted):
  // a match [s, e) with s < q < e for some q stays plain text. How chat content stays text (chat_prompt.h).
  std::vector<int32_t> encode(const std::string& text, bool add_bos, bool parse_special,
                              const std::vector<size_t>& no_special_inside) const;
  // Texts of the tokens that only parse_special turns into tokens (control and unknown tokens).
  std::vector<std::string> control_texts() const;
  // Raw bytes of one token (control tokens render as their text unless skip_special).
  std::string token_bytes(int32_t id, bool skip_special = false) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  int32_t n_vocab() const { return (int32_t)vocab_.tokens.size(); }
  const TokenizerVocab& vocab() const { return vocab_; }
  bool is_eog(int32_t id) const;  // end of generation: eos, eot, <|im_end|>, <|endoftext|>, <|eot_id|>, <|eom_id|>
  int32_t token_id(const std::string& text) const;  // exact vocab entry (byte-level form of text), -1 if none

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
  TokenizerVocab vocab_;
};

// Streaming detokenizer: holds back an incomplete UTF-8 sequence until it is complete.
class Utf8Stream {
 public:
  std::string push(const std::string& bytes);  // returns the complete-code-point prefix
  std::string flush();                         // whatever is left (invalid tails replaced by U+FFFD)
 private:
  std::string pending_;
};

bool is_valid_utf8(const std::string& s, size_t* bad_offset = nullptr);

}  // namespace kvzap
