#include "tokenizer/unicode_text.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <memory>

#include "kvzap/error.h"

namespace kvzap::tok {

int utf8_prefix_state(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return (uint8_t)s[k]; };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (RFC 3629 table)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= s.size()) return -(int)k;
    const uint8_t b = byte(i + k);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return 0;
  }
  return (int)need;
}

size_t utf8_sequence_length(std::string_view s, size_t i) {
  const int st = utf8_prefix_state(s, i);
  return st > 0 ? (size_t)st : 0;
}

uint32_t utf8_decode_at(std::string_view s, size_t i, size_t len) {
  const auto b = [&](size_t k) { return (uint32_t)(uint8_t)s[i + k]; };
  switch (len) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += (char)cp;
  } else if (cp < 0x800) {
    out += (char)(0xC0 | (cp >> 6));
    out += (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += (char)(0xE0 | (cp >> 12));
    out += (char)(0x80 | ((cp >> 6) & 0x3F));
    out += (char)(0x80 | (cp & 0x3F));
  } else {
    out += (char)(0xF0 | (cp >> 18));
    out += (char)(0x80 | ((cp >> 12) & 0x3F));
    out += (char)(0x80 | ((cp >> 6) & 0x3F));
    out += (char)(0x80 | (cp & 0x3F));
  }
}

static bool is_white_space(uint32_t cp) {
  // The Unicode White_Space property (PropList.txt); utf8proc exposes categories only.
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

static uint8_t compute_class(uint32_t cp) {
  if (is_white_space(cp)) return kWhitespace;
  switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
      return kLetter;
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return kNumber;
    default:
      return kOther;
  }
}

uint8_t char_class(uint32_t cp) {
  // ASCII dominates real text: answer it from a table built once.
  static const std::array<uint8_t, 128> ascii = [] {
    std::array<uint8_t, 128> t{};
    for (uint32_t c = 0; c < 128; ++c) t[c] = compute_class(c);
    return t;
  }();
  return cp < 128 ? ascii[cp] : compute_class(cp);
}

void CodepointText::assign(std::string_view s) {
  cps.clear();
  classes.clear();
  byte_at.clear();
  for (size_t i = 0; i < s.size();) {
    size_t len = utf8_sequence_length(s, i);
    if (len == 0) throw Error("invalid UTF-8 at byte " + std::to_string(i));
    const uint32_t cp = utf8_decode_at(s, i, len);
    cps.push_back(cp);
    classes.push_back(char_class(cp));
    byte_at.push_back((uint32_t)i);
    i += len;
  }
  byte_at.push_back((uint32_t)s.size());
}

std::string nfc_normalize(std::string_view s) {
  // utf8proc wants a NUL-terminated string; a NUL inside the text would end it early, so normalise
  // the NUL-free stretches one by one and keep the NULs as they are (NFC never touches U+0000).
  std::string out;
  out.reserve(s.size());
  size_t start = 0;
  while (start <= s.size()) {
    size_t nul = s.find('\0', start);
    if (nul == std::string_view::npos) nul = s.size();
    if (nul > start) {
      std::string part(s.substr(start, nul - start));
      std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> norm(
          utf8proc_NFC((const utf8proc_uint8_t*)part.c_str()), &std::free);
      if (!norm) throw Error("NFC normalisation failed");
      out += (const char*)norm.get();
    }
    if (nul < s.size()) out += '\0';
    start = nul + 1;
  }
  return out;
}

}  // namespace kvzap::tok
