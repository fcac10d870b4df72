// GPT-2's byte <-> "printable unicode" map: byte-level BPE vocabularies store every token as the
// concatenation of these stand-in characters (space is U+0120 'Ġ', newline U+010A 'Ċ').
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace kvzap::tok {

// The stand-in code point for a byte: printable Latin-1 bytes keep their value, the other 68 bytes
// (0x00-0x20, 0x7F-0xA0, 0xAD) map in increasing order to U+0100, U+0101, ...
uint32_t byte_to_codepoint(uint8_t b);
// The inverse; returns -1 for a code point that is not a stand-in.
int codepoint_to_byte(uint32_t cp);

// Raw bytes -> byte-level form (each byte becomes the UTF-8 of its stand-in).
std::string bytes_to_byte_level(std::string_view raw);
void append_byte_level(std::string& out, uint8_t b);
// Byte-level form -> raw bytes. Characters that are not stand-ins are copied through unchanged.
std::string byte_level_to_bytes(std::string_view byte_level);

}  // namespace kvzap::tok
