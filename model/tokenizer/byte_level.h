// GPT-2's reversible byte <-> printable code point mapping used by byte-level BPE
// vocabularies (e.g. a space is stored as 'Ġ', U+0120).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ps {

uint32_t ByteToUnicode(uint8_t b);
// Each byte of `bytes` mapped and UTF-8 encoded.
std::string BytesToUnicodeString(std::string_view bytes);
// Inverse of BytesToUnicodeString; code points outside the mapping are kept as UTF-8.
std::string UnicodeStringToBytes(std::string_view text);

}  // namespace ps
