// UTF-8 coding and the character classes the pre-tokenizers need.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ps::unicode {

// Decodes UTF-8. A byte that is not part of a valid sequence becomes the code point
// kRawByteBase + byte, so encoding back restores the input exactly.
std::vector<uint32_t> DecodeUtf8(std::string_view s);
void AppendUtf8(uint32_t cp, std::string* out);
std::string EncodeUtf8(const uint32_t* cps, size_t n);
// Length of the UTF-8 sequence starting with byte c (1 for invalid lead bytes).
int Utf8SequenceLength(uint8_t c);

bool IsLetter(uint32_t cp);
bool IsNumber(uint32_t cp);
bool IsWhitespace(uint32_t cp);  // the Unicode White_Space property, as regex \s

// Raw bytes that were not valid UTF-8 are carried as these code points.
inline constexpr uint32_t kRawByteBase = 0x110000;

}  // namespace ps::unicode
