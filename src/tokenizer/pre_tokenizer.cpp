#include "tokenizer/pre_tokenizer.h"

#include "kvzap/error.h"

namespace kvzap::tok {
namespace {

constexpr int kOutOfRange = -1;  // class reported past the end of the range being split

// A scanner over the code points [begin, end) of a text; emits pieces as byte spans.
struct Scanner {
  const CodepointText& t;
  size_t begin, end;
  std::vector<Span>& out;
  size_t prev;

  Scanner(const CodepointText& text, size_t b, size_t e, std::vector<Span>& o)
      : t(text), begin(b), end(e), out(o), prev(b) {}

  int cls(size_t p) const { return p < end ? t.classes[p] : kOutOfRange; }
  uint32_t cp(size_t p) const { return p < end ? t.cps[p] : 0xFFFFFFFFu; }
  void emit(size_t to) {
    if (to > prev) out.push_back({t.byte_at[prev], t.byte_at[to]});
    prev = to;
  }
  // Length of an English contraction starting at pos ('s 't 're 've 'm 'll 'd), 0 if none.
  size_t contraction(size_t pos, bool ignore_case) const {
    if (cp(pos) != '\'' || pos + 1 >= end) return 0;
    auto low = [&](uint32_t c) { return ignore_case && c >= 'A' && c <= 'Z' ? c + 32 : c; };
    const uint32_t a = low(cp(pos + 1));
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (pos + 2 >= end) return 0;
    const uint32_t b = low(cp(pos + 2));
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
  }
  // Whitespace run at pos: its length, and where the last \r or \n in it ends (0 if none).
  size_t whitespace_run(size_t pos, size_t* last_newline_end) const {
    size_t n = 0;
    *last_newline_end = 0;
    while (cls(pos + n) == kWhitespace) {
      if (cp(pos + n) == '\r' || cp(pos + n) == '\n') *last_newline_end = pos + n + 1;
      ++n;
    }
    return n;
  }
};

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void split_gpt2(const CodepointText& t, size_t b, size_t e, std::vector<Span>& out) {
  Scanner s(t, b, e, out);
  for (size_t pos = b; pos < e;) {
    if (size_t n = s.contraction(pos, false)) {
      s.emit(pos += n);
      continue;
    }
    const bool space = s.cp(pos) == ' ';
    const int c = space ? s.cls(pos + 1) : s.cls(pos);  // class after an optional leading space
    if (c == kLetter || c == kNumber || c == kOther) {
      pos += space;
      while (s.cls(pos) == c) ++pos;
      s.emit(pos);
      continue;
    }
    size_t last_nl;
    const size_t n = s.whitespace_run(pos, &last_nl);
    if (n > 1 && pos + n < e) {  // \s+(?!\S): leave the last blank to prefix the next word
      s.emit(pos += n - 1);
    } else if (n > 0) {
      s.emit(pos += n);
    } else {
      s.emit(++pos);  // unreachable for valid classes; keeps the loop total
    }
  }
}

// Llama 3 (max_digits 3) and Qwen2 (max_digits 1):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
void split_llama3(const CodepointText& t, size_t b, size_t e, size_t max_digits, std::vector<Span>& out) {
  Scanner s(t, b, e, out);
  for (size_t pos = b; pos < e;) {
    if (size_t n = s.contraction(pos, true)) {
      s.emit(pos += n);
      continue;
    }
    const uint32_t c = s.cp(pos);
    const int cl = s.cls(pos);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (c != '\r' && c != '\n' && cl != kNumber && (cl == kLetter || s.cls(pos + 1) == kLetter)) {
      ++pos;
      while (s.cls(pos) == kLetter) ++pos;
      s.emit(pos);
      continue;
    }
    // \p{N}{1,max}
    if (cl == kNumber) {
      size_t run_start = pos;
      while (s.cls(pos) == kNumber) {
        if (++pos - run_start >= max_digits) {
          s.emit(pos);
          run_start = pos;
        }
      }
      s.emit(pos);
      continue;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    const bool space = c == ' ';
    if ((space ? s.cls(pos + 1) : cl) == kOther) {
      pos += space;
      while (s.cls(pos) == kOther) ++pos;
      while (s.cp(pos) == '\r' || s.cp(pos) == '\n') ++pos;
      s.emit(pos);
      continue;
    }
    size_t last_nl;
    const size_t n = s.whitespace_run(pos, &last_nl);
    if (last_nl > 0) {  // \s*[\r\n]+ ends at the last line break of the run
      s.emit(pos = last_nl);
    } else if (n > 1 && pos + n < e) {  // \s+(?!\S)
      s.emit(pos += n - 1);
    } else if (n > 0) {
      s.emit(pos += n);
    } else {
      s.emit(++pos);
    }
  }
}

// SmolLM: every \p{N} is isolated first (HF Digits{individual_digits}), then GPT-2 on the rest.
void split_smollm(const CodepointText& t, std::vector<Span>& out) {
  const size_t n = t.cps.size();
  size_t run = 0;
  for (size_t i = 0; i < n; ++i) {
    if (t.classes[i] != kNumber) continue;
    if (i > run) split_gpt2(t, run, i, out);
    out.push_back({t.byte_at[i], t.byte_at[i + 1]});
    run = i + 1;
  }
  if (n > run) split_gpt2(t, run, n, out);
}

}  // namespace

void pre_tokenize(PreTokenizer pre, const CodepointText& t, std::vector<Span>& out) {
  switch (pre) {
    case PreTokenizer::Smollm: split_smollm(t, out); break;
    case PreTokenizer::Llama3: split_llama3(t, 0, t.cps.size(), 3, out); break;
    case PreTokenizer::Qwen2: split_llama3(t, 0, t.cps.size(), 1, out); break;
    case PreTokenizer::Gpt2: split_gpt2(t, 0, t.cps.size(), out); break;
  }
}

std::vector<std::string> pre_tokenize(PreTokenizer pre, std::string_view text) {
  CodepointText t;
  t.assign(text);
  std::vector<Span> spans;
  pre_tokenize(pre, t, spans);
  std::vector<std::string> pieces;
  for (const Span& s : spans) pieces.emplace_back(text.substr(s.begin, s.end - s.begin));
  return pieces;
}

PreTokenizer pre_tokenizer_from_name(const std::string& name) {
  if (name == "smollm") return PreTokenizer::Smollm;
  if (name == "llama-bpe" || name == "llama3") return PreTokenizer::Llama3;
  if (name == "qwen2") return PreTokenizer::Qwen2;
  if (name == "gpt-2" || name == "default") return PreTokenizer::Gpt2;
  throw Error("unsupported pre-tokenizer '" + name +
              "' (tokenizer.ggml.pre; supported: smollm, llama-bpe, llama3, qwen2, gpt-2, default)");
}

}  // namespace kvzap::tok
