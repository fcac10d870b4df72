// Byte-level BPE: special-token partition, pre-tokenization, then rank-ordered merges per piece
// (GPT-2 style: byte-to-unicode map, lowest-rank pair first). Symbols are ids, so a merge is one hash
// lookup on a pair of ids.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <string_view>

#include "kvzap/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/spm.h"
#include "tokenizer/unicode_text.h"

namespace kvzap {
namespace {

enum TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// Token texts that end a turn in some family; llama.cpp also treats them as control tokens.
constexpr std::array<std::string_view, 8> kEndOfGenerationTexts = {
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|end|>",
    "<end_of_turn>", "<|return|>"};

bool is_eog_text(std::string_view text) {
  return std::find(kEndOfGenerationTexts.begin(), kEndOfGenerationTexts.end(), text) !=
         kEndOfGenerationTexts.end();
}

uint64_t pair_key(int32_t left, int32_t right) { return ((uint64_t)(uint32_t)left << 32) | (uint32_t)right; }

struct Merge {
  int32_t rank;
  int32_t result;  // symbol id of the merged text
};

struct Symbol {
  int32_t id;  // symbol id; kDead once merged into its left neighbour
  int32_t prev, next;
};
constexpr int32_t kDead = -1;

struct Bigram {
  int32_t rank, left, right;
  int32_t left_id, right_id;  // ids when pushed: a changed id means the entry is stale
  int32_t result;
};
// Heap order: lowest rank first, then leftmost.
bool bigram_after(const Bigram& a, const Bigram& b) {
  return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
}

// A piece of the input: either raw text to pre-tokenize, or one special token.
struct Fragment {
  int32_t token;  // -1 for raw text
  size_t offset, length;
};

}  // namespace

struct Tokenizer::Impl {
  int32_t n_vocab = 0;
  bool spm = false;            // SentencePiece vocabulary (spm.h)
  bool spm_ranked = false;     // ... merged by rank (tokenizer.json), not by score
  tok::SpmVocab spm_vocab;
  PreTokenizer pre = PreTokenizer::Smollm;
  bool ignore_merges = false;  // Llama 3: a piece that is a whole vocab entry is not merged
  bool nfc = false;            // Qwen2: HF normalises to NFC first

  std::unordered_map<std::string, int32_t> text_to_id;  // stored text -> id (last one wins, as llama.cpp)
  // Merge parts/results that are not vocab entries get symbol ids >= n_vocab.
  std::vector<std::string> extra_symbols;
  std::unordered_map<std::string, int32_t> extra_ids;
  std::unordered_map<uint64_t, Merge> merges;  // (left symbol, right symbol) -> rank, result
  std::array<int32_t, 256> byte_symbol{};      // symbol id of each single byte

  std::vector<std::string> bytes;          // [n_vocab] raw bytes each token stands for
  std::vector<uint8_t> is_special;         // [n_vocab] skipped by decode(skip_special)
  std::vector<int32_t> partition_tokens;   // literal-match tokens, longest text first
  std::vector<uint8_t> needs_parse_special;  // [n_vocab] control/unknown: matched only with parse_special
  std::vector<int32_t> eog_ids;

  int32_t symbol_id(const std::string& text) {
    if (auto it = text_to_id.find(text); it != text_to_id.end()) return it->second;
    if (auto it = extra_ids.find(text); it != extra_ids.end()) return it->second;
    const int32_t id = n_vocab + (int32_t)extra_symbols.size();
    extra_symbols.push_back(text);
    extra_ids.emplace(text, id);
    return id;
  }
  const std::string& symbol_text(int32_t id, const TokenizerVocab& v) const {
    return id < n_vocab ? v.tokens[id] : extra_symbols[id - n_vocab];
  }

  void partition(std::string_view text, bool parse_special, std::vector<Fragment>& frags,
                 const std::vector<size_t>* no_special_inside = nullptr) const;
  void encode_raw(std::string_view text, const TokenizerVocab& v, std::vector<int32_t>& out) const;
  std::vector<int32_t> encode_spm(std::string_view text, const std::vector<Fragment>& frags, const TokenizerVocab& v,
                                  bool add_bos) const;
  void bpe_piece(std::string_view piece, const TokenizerVocab& v, std::vector<Symbol>& syms,
                 std::vector<Bigram>& heap, std::vector<int32_t>& out) const;
  void apply_merges(std::vector<Symbol>& syms, std::vector<Bigram>& heap) const;
  void spm_ranked_piece(std::string_view escaped, std::vector<int32_t>& out) const;
};

Tokenizer::Tokenizer(TokenizerVocab vocab) : impl_(std::make_shared<Impl>()), vocab_(std::move(vocab)) {
  Impl& m = *impl_;
  const TokenizerVocab& v = vocab_;
  m.n_vocab = (int32_t)v.tokens.size();
  if (m.n_vocab == 0) throw Error("tokenizer vocabulary is empty");
  if (!v.token_types.empty() && v.token_types.size() != v.tokens.size())
    throw Error("tokenizer has " + std::to_string(v.tokens.size()) + " tokens but " +
                std::to_string(v.token_types.size()) + " token types");
  for (int32_t id : {v.bos_id, v.eos_id, v.eot_id, v.unk_id, v.pad_id})
    if (id >= m.n_vocab) throw Error("special token id " + std::to_string(id) + " is outside the vocabulary");
  m.spm = v.kind == TokenizerKind::SentencePiece;
  m.spm_ranked = m.spm && !v.merges.empty();
  if (m.spm && !m.spm_ranked && v.scores.size() != v.tokens.size())
    throw Error("tokenizer has " + std::to_string(v.tokens.size()) + " tokens but " + std::to_string(v.scores.size()) +
                " scores");
  m.pre = v.pre;
  m.ignore_merges = v.ignore_merges.value_or(v.pre == PreTokenizer::Llama3);
  m.nfc = v.nfc.value_or(v.pre == PreTokenizer::Qwen2);

  m.text_to_id.reserve(v.tokens.size());
  for (int32_t id = 0; id < m.n_vocab; ++id) m.text_to_id[v.tokens[id]] = id;

  // Per-token bytes and roles.
  m.bytes.resize(m.n_vocab);
  m.is_special.assign(m.n_vocab, 0);
  m.needs_parse_special.assign(m.n_vocab, 0);
  for (int32_t id = 0; id < m.n_vocab; ++id) {
    const std::string& text = v.tokens[id];
    int32_t type = v.token_types.empty() ? kNormal : v.token_types[id];
    if (type != kControl && is_eog_text(text)) type = kControl;  // as llama.cpp forces for these
    switch (type) {
      case kControl:
      case kUnknown:
        m.bytes[id] = text;  // stored as plain text, not byte-level
        m.is_special[id] = 1;
        m.needs_parse_special[id] = 1;
        if (!text.empty()) m.partition_tokens.push_back(id);
        break;
      case kUserDefined:
        m.bytes[id] = text;
        if (!text.empty()) m.partition_tokens.push_back(id);
        break;
      case kUnused:
        break;
      case kByte:
        if (m.spm) {  // "<0xXX>"
          unsigned v = 0;
          if (text.size() != 6 || std::sscanf(text.c_str(), "<0x%2X>", &v) != 1)
            throw Error("byte token #" + std::to_string(id) + " '" + text + "' is not of the form <0xXX>");
          m.bytes[id] = std::string(1, (char)v);
          break;
        }
        m.bytes[id] = tok::byte_level_to_bytes(text);
        break;
      default:
        m.bytes[id] = m.spm ? tok::spm_unescape_whitespace(text) : tok::byte_level_to_bytes(text);
    }
    if (id == v.eos_id || id == v.eot_id || is_eog_text(text)) m.eog_ids.push_back(id);
  }
  std::stable_sort(m.partition_tokens.begin(), m.partition_tokens.end(), [&](int32_t a, int32_t b) {
    return v.tokens[a].size() > v.tokens[b].size();
  });

  if (m.spm) {
    // Byte fallback: the <0xXX> token of each byte, else a token whose text is that one byte.
    m.spm_vocab.text_to_id = &m.text_to_id;
    m.spm_vocab.scores = &v.scores;
    m.spm_vocab.unk_id = v.unk_id;
    for (int b = 0; b < 256; ++b) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "<0x%02X>", b);
      auto it = m.text_to_id.find(hex);
      if (it == m.text_to_id.end()) it = m.text_to_id.find(std::string(1, (char)b));
      m.spm_vocab.byte_token[b] = it == m.text_to_id.end() ? -1 : it->second;
    }
    if (!m.spm_ranked) return;
  }

  if (!m.spm)
    for (int b = 0; b < 256; ++b) {
      std::string s;
      tok::append_byte_level(s, (uint8_t)b);
      m.byte_symbol[b] = m.symbol_id(s);
    }

  m.merges.reserve(v.merges.size());
  for (size_t rank = 0; rank < v.merges.size(); ++rank) {
    const std::string& line = v.merges[rank];
    const size_t sp = line.find(' ', 1);  // a part may itself be a lone space-like character
    if (sp == std::string::npos) throw Error("malformed BPE merge #" + std::to_string(rank) + ": '" + line + "'");
    const std::string left = line.substr(0, sp), right = line.substr(sp + 1);
    const int32_t l = m.symbol_id(left), r = m.symbol_id(right);
    const int32_t result = m.symbol_id(left + right);
    if (m.spm_ranked && (l >= m.n_vocab || r >= m.n_vocab || result >= m.n_vocab))
      throw Error("BPE merge #" + std::to_string(rank) + " '" + line + "' names a token that is not in the vocabulary");
    m.merges.emplace(pair_key(l, r), Merge{(int32_t)rank, result});  // first (lowest) rank wins
  }
}

namespace {

// tokenizer.ggml.model = "llama": tokens, scores and token types, with llama.cpp's defaults for what
// the file leaves out (BOS 1, EOS 2, unknown 0; BOS added, a space prefix added).
std::unique_ptr<Tokenizer> sentencepiece_from_gguf(const gguf::File& f) {
  TokenizerVocab v;
  v.kind = TokenizerKind::SentencePiece;
  v.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (!f.has("tokenizer.ggml.scores"))
    throw Error(f.path() + ": missing metadata key 'tokenizer.ggml.scores' (a SentencePiece vocabulary needs it)");
  for (double s : f.get_float_array("tokenizer.ggml.scores")) v.scores.push_back((float)s);
  if (f.has("tokenizer.ggml.token_type"))
    for (int64_t t : f.get_int_array("tokenizer.ggml.token_type")) v.token_types.push_back((int32_t)t);
  const int64_t n = (int64_t)v.tokens.size();
  auto id = [&](const char* key, int32_t dflt) {
    const auto x = f.get_int_opt(key);
    if (!x) return dflt < n ? dflt : -1;
    if (*x < 0 || *x >= n) throw Error(f.path() + ": " + key + " = " + std::to_string(*x) + " is outside the vocabulary");
    return (int32_t)*x;
  };
  v.bos_id = id("tokenizer.ggml.bos_token_id", 1);
  v.eos_id = id("tokenizer.ggml.eos_token_id", 2);
  v.unk_id = id("tokenizer.ggml.unknown_token_id", 0);
  v.eot_id = id("tokenizer.ggml.eot_token_id", -1);
  v.pad_id = id("tokenizer.ggml.padding_token_id", -1);
  v.add_bos = f.get_bool_opt("tokenizer.ggml.add_bos_token", true);
  v.add_eos = f.get_bool_opt("tokenizer.ggml.add_eos_token", false);
  v.add_space_prefix = f.get_bool_opt("tokenizer.ggml.add_space_prefix", true);
  v.chat_template = f.get_string_opt("tokenizer.chat_template").value_or("");
  try {
    return std::make_unique<Tokenizer>(std::move(v));
  } catch (const Error& e) {
    throw Error(f.path() + ": " + e.what());
  }
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::File& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model == "llama") return sentencepiece_from_gguf(f);
  if (model != "gpt2")
    throw Error(f.path() + ": unsupported tokenizer model '" + model +
                "' (tokenizer.ggml.model; supported: byte-level BPE 'gpt2', SentencePiece 'llama')");
  TokenizerVocab v;
  try {
    v.pre = tok::pre_tokenizer_from_name(f.get_string_opt("tokenizer.ggml.pre").value_or("default"));
  } catch (const Error& e) {
    throw Error(f.path() + ": " + e.what());
  }
  v.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (f.has("tokenizer.ggml.token_type")) {
    for (int64_t t : f.get_int_array("tokenizer.ggml.token_type")) v.token_types.push_back((int32_t)t);
  }
  v.merges = f.get_string_array("tokenizer.ggml.merges");
  auto id = [&](const char* key) { return (int32_t)f.get_int_opt(key).value_or(-1); };
  v.bos_id = id("tokenizer.ggml.bos_token_id");
  v.eos_id = id("tokenizer.ggml.eos_token_id");
  v.eot_id = id("tokenizer.ggml.eot_token_id");
  v.unk_id = id("tokenizer.ggml.unknown_token_id");
  v.pad_id = id("tokenizer.ggml.padding_token_id");
  // llama.cpp's default: Llama 3 adds BOS, the other byte-level families do not; the key overrides.
  v.add_bos = f.get_bool_opt("tokenizer.ggml.add_bos_token", v.pre == PreTokenizer::Llama3);
  v.chat_template = f.get_string_opt("tokenizer.chat_template").value_or("");
  try {
    return std::make_unique<Tokenizer>(std::move(v));
  } catch (const Error& e) {
    throw Error(f.path() + ": " + e.what());
  }
}

// Splits on literal special-token texts, longest token first, as llama.cpp's tokenizer_st_partition.
void Tokenizer::Impl::partition(std::string_view text, bool parse_special, std::vector<Fragment>& frags,
                                const std::vector<size_t>* no_special_inside) const {
  auto blocked = [no_special_inside](size_t s, size_t e) {
    if (!no_special_inside) return false;
    auto it = std::upper_bound(no_special_inside->begin(), no_special_inside->end(), s);
    return it != no_special_inside->end() && *it < e;
  };
  frags.assign(1, Fragment{-1, 0, text.size()});
  std::vector<Fragment> next;
  for (int32_t id : partition_tokens) {
    if (!parse_special && needs_parse_special[id]) continue;
    const std::string& st = bytes[id];
    if (text.find(st) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      const std::string_view raw = text.substr(f.offset, f.length);
      size_t pos = 0, from = 0;
      for (size_t hit; (hit = raw.find(st, from)) != std::string_view::npos;) {
        if (blocked(f.offset + hit, f.offset + hit + st.size())) {
          from = hit + 1;
          continue;
        }
        if (hit > pos) next.push_back({-1, f.offset + pos, hit - pos});
        next.push_back({id, 0, 0});
        pos = from = hit + st.size();
      }
      if (pos < raw.size()) next.push_back({-1, f.offset + pos, raw.size() - pos});
    }
    frags.swap(next);
  }
}

void Tokenizer::Impl::encode_raw(std::string_view text, const TokenizerVocab& v, std::vector<int32_t>& out) const {
  std::string normalized;
  if (nfc) {
    normalized = tok::nfc_normalize(text);
    text = normalized;
  }
  tok::CodepointText cps;
  cps.assign(text);
  std::vector<tok::Span> spans;
  tok::pre_tokenize(pre, cps, spans);
  std::vector<Symbol> syms;
  std::vector<Bigram> heap;
  for (const tok::Span& s : spans) bpe_piece(text.substr(s.begin, s.end - s.begin), v, syms, heap, out);
}

void Tokenizer::Impl::bpe_piece(std::string_view piece, const TokenizerVocab& v, std::vector<Symbol>& syms,
                                std::vector<Bigram>& heap, std::vector<int32_t>& out) const {
  if (piece.size() == 1 && byte_symbol[(uint8_t)piece[0]] < n_vocab) {
    out.push_back(byte_symbol[(uint8_t)piece[0]]);
    return;
  }
  if (ignore_merges) {
    if (auto it = text_to_id.find(tok::bytes_to_byte_level(piece)); it != text_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // [n_bytes] one symbol per byte, linked in order
  const int32_t n = (int32_t)piece.size();
  syms.resize(n);
  for (int32_t i = 0; i < n; ++i) syms[i] = {byte_symbol[(uint8_t)piece[i]], i - 1, i + 1 < n ? i + 1 : -1};
  apply_merges(syms, heap);
  for (int32_t i = 0; i >= 0; i = syms[i].next) {
    const int32_t id = syms[i].id;
    if (id < n_vocab) {
      out.push_back(id);
      continue;
    }
    // Not a vocab entry (only in an inconsistent vocab): emit whatever single characters exist,
    // as llama.cpp does.
    for (char c : symbol_text(id, v)) {
      if (auto it = text_to_id.find(std::string(1, c)); it != text_to_id.end()) out.push_back(it->second);
    }
  }
}

// Rank-ordered merges over a linked run of symbols: the lowest-ranked adjacent pair first, ties to the
// leftmost (HF's BPE word merge).
void Tokenizer::Impl::apply_merges(std::vector<Symbol>& syms, std::vector<Bigram>& heap) const {
  heap.clear();
  auto add_bigram = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    auto it = merges.find(pair_key(syms[left].id, syms[right].id));
    if (it == merges.end()) return;
    heap.push_back({it->second.rank, left, right, syms[left].id, syms[right].id, it->second.result});
    std::push_heap(heap.begin(), heap.end(), bigram_after);
  };
  for (int32_t i = 1; i < (int32_t)syms.size(); ++i) add_bigram(i - 1, i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), bigram_after);
    const Bigram b = heap.back();
    heap.pop_back();
    Symbol& l = syms[b.left];
    Symbol& r = syms[b.right];
    if (l.id != b.left_id || r.id != b.right_id) continue;  // a side was merged since
    l.id = b.result;
    r.id = kDead;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = b.left;
    add_bigram(l.prev, b.left);
    add_bigram(b.left, l.next);
  }
}

// tokenizer.json's SentencePiece-style BPE: characters (a character without a vocab entry becomes its
// <0xXX> byte tokens, or one unknown token for a run of them), then merges by rank.
void Tokenizer::Impl::spm_ranked_piece(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::vector<Symbol> syms;
  syms.reserve(text.size());
  auto push = [&](int32_t id) {
    const int32_t i = (int32_t)syms.size();
    syms.push_back({id, i - 1, -1});
    if (i > 0) syms[i - 1].next = i;
  };
  bool prev_unk = false;
  for (size_t off = 0; off < text.size();) {
    const size_t n = std::min(tok::utf8_sequence_length(text, off), text.size() - off);
    const size_t len = n == 0 ? 1 : n;
    if (auto it = text_to_id.find(std::string(text.substr(off, len))); it != text_to_id.end()) {
      push(it->second);
      prev_unk = false;
    } else {
      bool all_bytes = true;
      for (size_t i = 0; i < len; i++) all_bytes = all_bytes && spm_vocab.byte_token[(uint8_t)text[off + i]] >= 0;
      if (all_bytes) {
        for (size_t i = 0; i < len; i++) push(spm_vocab.byte_token[(uint8_t)text[off + i]]);
        prev_unk = false;
      } else if (spm_vocab.unk_id >= 0 && !prev_unk) {  // fuse_unk: one unknown token for a run
        push(spm_vocab.unk_id);
        prev_unk = true;
      }
    }
    off += len;
  }
  if (syms.empty()) return;
  std::vector<Bigram> heap;
  apply_merges(syms, heap);
  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

// SentencePiece: raw fragments are escaped and merged by score; a fragment that follows BOS or a special
// token gets a leading space when the vocabulary asks for it (llama.cpp's is_prev_special rule).
std::vector<int32_t> Tokenizer::Impl::encode_spm(std::string_view text, const std::vector<Fragment>& frags,
                                                 const TokenizerVocab& v, bool add_bos) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && v.bos_id >= 0) out.push_back(v.bos_id);
  bool prev_special = true;
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    std::string raw = v.add_space_prefix && prev_special ? " " : "";
    raw += text.substr(f.offset, f.length);
    if (spm_ranked) spm_ranked_piece(tok::spm_escape_whitespace(raw), out);
    else tok::spm_tokenize(tok::spm_escape_whitespace(raw), spm_vocab, out);
    prev_special = false;
  }
  if (add_bos && v.add_eos && v.eos_id >= 0) out.push_back(v.eos_id);
  return out;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool add_bos, bool parse_special) const {
  return encode(text, add_bos, parse_special, {});
}

std::vector<std::string> Tokenizer::control_texts() const {
  std::vector<std::string> out;
  for (int32_t id : impl_->partition_tokens)
    if (impl_->needs_parse_special[id]) out.push_back(impl_->bytes[id]);
  return out;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool add_bos, bool parse_special,
                                       const std::vector<size_t>& no_special_inside) const {
  size_t bad = 0;
  if (!is_valid_utf8(text, &bad)) throw Error("invalid UTF-8 at byte " + std::to_string(bad));
  const std::vector<size_t>* guard = no_special_inside.empty() ? nullptr : &no_special_inside;
  if (impl_->spm) {
    std::vector<Fragment> frags;
    if (!text.empty()) impl_->partition(text, parse_special, frags, guard);
    return impl_->encode_spm(text, frags, vocab_, add_bos);
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && vocab_.bos_id >= 0) out.push_back(vocab_.bos_id);
  std::vector<Fragment> frags;
  impl_->partition(text, parse_special, frags, guard);
  for (const Fragment& f : frags) {
    if (f.token >= 0)
      out.push_back(f.token);
    else
      impl_->encode_raw(std::string_view(text).substr(f.offset, f.length), vocab_, out);
  }
  return out;
}

std::string Tokenizer::token_bytes(int32_t id, bool skip_special) const {
  if (id < 0 || id >= impl_->n_vocab)
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                std::to_string(impl_->n_vocab) + ")");
  if (skip_special && impl_->is_special[id]) return {};
  return impl_->bytes[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id, skip_special);
  return out;
}

bool Tokenizer::is_eog(int32_t id) const {
  return std::find(impl_->eog_ids.begin(), impl_->eog_ids.end(), id) != impl_->eog_ids.end();
}

int32_t Tokenizer::token_id(const std::string& text) const {
  const auto& map = impl_->text_to_id;
  if (impl_->spm) {
    if (auto it = map.find(tok::spm_escape_whitespace(text)); it != map.end() && impl_->bytes[it->second] == text)
      return it->second;
    if (auto it = map.find(text); it != map.end() && impl_->bytes[it->second] == text) return it->second;
    return -1;
  }
  if (auto it = map.find(tok::bytes_to_byte_level(text)); it != map.end()) return it->second;
  // Control and user-defined tokens are stored as plain text.
  if (auto it = map.find(text); it != map.end() && impl_->bytes[it->second] == text) return it->second;
  return -1;
}

}  // namespace kvzap
