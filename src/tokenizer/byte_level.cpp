#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/unicode_text.h"

namespace kvzap::tok {
namespace {

struct ByteMap {
  std::array<uint32_t, 256> to_cp{};
  std::array<std::string, 256> to_utf8;
  ByteMap() {
    uint32_t next_extra = 0x100;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? b : next_extra++;
      utf8_append(to_utf8[b], to_cp[b]);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

}  // namespace

uint32_t byte_to_codepoint(uint8_t b) { return byte_map().to_cp[b]; }

int codepoint_to_byte(uint32_t cp) {
  // Stand-ins are either the byte's own value or U+0100..U+0143.
  if (cp < 256) return byte_map().to_cp[cp] == cp ? (int)cp : -1;
  if (cp >= 0x100 && cp < 0x100 + 68) {
    static const std::array<int, 68> extra = [] {
      std::array<int, 68> t{};
      for (int b = 0; b < 256; ++b)
        if (byte_map().to_cp[b] >= 0x100) t[byte_map().to_cp[b] - 0x100] = b;
      return t;
    }();
    return extra[cp - 0x100];
  }
  return -1;
}

void append_byte_level(std::string& out, uint8_t b) { out += byte_map().to_utf8[b]; }

std::string bytes_to_byte_level(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw) append_byte_level(out, (uint8_t)c);
  return out;
}

std::string byte_level_to_bytes(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t len = utf8_sequence_length(s, i);
    if (len == 0) {  // not UTF-8: keep the byte as it is
      out += s[i++];
      continue;
    }
    const int b = codepoint_to_byte(utf8_decode_at(s, i, len));
    if (b >= 0)
      out += (char)b;
    else
      out.append(s.substr(i, len));
    i += len;
  }
  return out;
}

}  // namespace kvzap::tok
