// Byte-level BPE tokenizer: encode and decode arbitrary bytes against each vocabulary kind (the four
// pre-tokenizers SmolLM2, Llama 3, Qwen2 and GPT-2 on a synthetic vocabulary with merges, control,
// user-defined, unknown and unused tokens; plus the real SmolLM2 vocabulary when the default model
// is present, $KVZAP_MODEL or the `kvzap pull` cache).
// Input: byte 0 picks the vocabulary and the flags, the rest is the text (encode) and, read as
// little-endian u16s, token ids (decode, streaming decode).
// Checked: ids are in range; decode(encode(text)) == text for valid UTF-8 when nothing normalises it
// (no NFC: not Qwen2), special tokens are not parsed and every byte has a token of its own.
#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../tests/unit/test_support.h"
#include "format/gguf.h"
#include "fuzz_common.h"
#include "kvzap/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace kvzap;

std::unique_ptr<Tokenizer> synthetic(PreTokenizer pre) {
  TokenizerVocab v;
  v.pre = pre;
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(tok::bytes_to_byte_level(std::string(1, (char)b)));
    v.token_types.push_back(1);
  }
  // Every prefix of these words becomes a token, merged left to right.
  const char* words[] = {" the", "the", " and", "ing", " in", "er", "on", " a", "\n\n", "    ", "  ", "123", "12",
                         " 2024", "'s", "'t", "é", " café", "日本", "語", "😀", "\xc2\xa0", ".\n", " (", "))"};
  for (const char* w : words) {
    const std::string bl = tok::bytes_to_byte_level(w);
    // Split the byte-level text into UTF-8 characters (each one byte's stand-in).
    std::vector<std::string> chars;
    for (size_t i = 0; i < bl.size();) {
      size_t n = 1;
      while (i + n < bl.size() && ((unsigned char)bl[i + n] & 0xC0) == 0x80) ++n;
      chars.push_back(bl.substr(i, n));
      i += n;
    }
    std::string prefix = chars[0];
    for (size_t i = 1; i < chars.size(); ++i) {
      const std::string merged = prefix + chars[i];
      bool have = false;
      for (const std::string& t : v.tokens) have |= t == merged;
      if (!have) {
        v.merges.push_back(prefix + " " + chars[i]);
        v.tokens.push_back(merged);
        v.token_types.push_back(1);
      }
      prefix = merged;
    }
  }
  auto add = [&](const std::string& text, int32_t type) {
    v.tokens.push_back(text);
    v.token_types.push_back(type);
    return (int32_t)v.tokens.size() - 1;
  };
  v.eos_id = add("<|endoftext|>", 3);
  add("<|im_start|>", 3);
  add("<|im_end|>", 3);
  v.bos_id = add("<|begin_of_text|>", 3);
  v.eot_id = add("<|eot_id|>", 3);
  add("<think>", 4);
  add("</think>", 4);
  v.unk_id = add("<unk>", 2);
  add("<unused0>", 5);
  add("", 4);  // an empty user-defined token must be ignored
  v.add_bos = pre == PreTokenizer::Llama3;
  return std::make_unique<Tokenizer>(std::move(v));
}

struct Vocabs {
  std::vector<std::unique_ptr<Tokenizer>> toks;
  std::vector<bool> normalises;
  std::vector<std::array<bool, 256>> has_byte;  // a single-byte token exists (SmolLM2 lacks 21 of them)
  Vocabs() {
    for (PreTokenizer p : {PreTokenizer::Smollm, PreTokenizer::Llama3, PreTokenizer::Qwen2, PreTokenizer::Gpt2}) {
      toks.push_back(synthetic(p));
      normalises.push_back(p == PreTokenizer::Qwen2);
    }
    const std::string real = test::default_model_path();
    if (std::filesystem::exists(real)) {
      toks.push_back(Tokenizer::from_gguf(*gguf::File::open(real)));
      normalises.push_back(toks.back()->vocab().pre == PreTokenizer::Qwen2);
    }
    for (const auto& t : toks) {
      std::array<bool, 256> h{};
      for (int b = 0; b < 256; ++b) h[b] = t->token_id(std::string(1, (char)b)) >= 0;
      has_byte.push_back(h);
    }
  }
};

const Vocabs& vocabs() {
  static const Vocabs v;
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)vocabs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Vocabs& vs = vocabs();
  const uint8_t sel = data[0];
  const size_t which = (sel & 7) % vs.toks.size();
  const bool add_bos = sel & 8, parse_special = sel & 16, skip_special = sel & 32;
  const Tokenizer& tok = *vs.toks[which];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);

  try {
    const std::vector<int32_t> ids = tok.encode(text, add_bos, parse_special);
    for (int32_t id : ids)
      if (id < 0 || id >= tok.n_vocab()) __builtin_trap();
    const std::string back = tok.decode(ids, skip_special);
    // A byte without a token of its own is dropped (as llama.cpp does), so only texts made of covered
    // bytes must round-trip.
    bool covered = true;
    for (unsigned char c : text) covered &= vs.has_byte[which][c];
    if (covered && !vs.normalises[which] && !parse_special && !add_bos && !skip_special && back != text)
      __builtin_trap();
  } catch (const Error&) {
    if (is_valid_utf8(text)) __builtin_trap();  // only invalid UTF-8 may be refused
  }

  std::vector<int32_t> ids;
  for (size_t i = 1; i + 1 < size; i += 2) {
    uint16_t u;
    std::memcpy(&u, data + i, 2);
    ids.push_back((int32_t)(u % (uint32_t)tok.n_vocab()));
  }
  const std::string all = tok.decode(ids, skip_special);
  Utf8Stream stream;
  std::string streamed;
  for (int32_t id : ids) streamed += stream.push(tok.token_bytes(id, skip_special));
  streamed += stream.flush();
  if (is_valid_utf8(all) && streamed != all) __builtin_trap();
  if (!is_valid_utf8(streamed)) __builtin_trap();
  for (int32_t id : ids) (void)tok.is_eog(id);
  (void)tok.token_id(text);
  return 0;
}
