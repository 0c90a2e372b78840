// The grammar readers' shared character decoding (grammar.cc's GBNF, regex.cc's
// patterns): internal to grammar/.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace ps::grammar {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// The UTF-8 character of `s` at *i, *i moved past it; nullopt (and *i unmoved) when the
// bytes there are not one (a code point beyond U+10FFFF included).
inline std::optional<uint32_t> DecodeUtf8(std::string_view s, size_t* i) {
  const auto c = static_cast<uint8_t>(s[*i]);
  const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || *i + n > s.size()) return std::nullopt;
  uint32_t cp = n == 1 ? c : c & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    const auto b = static_cast<uint8_t>(s[*i + k]);
    if ((b & 0xC0) != 0x80) return std::nullopt;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp > kMaxCodePoint) return std::nullopt;
  *i += n;
  return cp;
}

// `digits` hexadecimal digits of `s` at *i, *i moved past them; nullopt (*i at the
// first that is not one) otherwise.
inline std::optional<uint32_t> DecodeHex(std::string_view s, size_t* i, int digits) {
  uint32_t v = 0;
  for (int k = 0; k < digits; ++k) {
    const char h = *i < s.size() ? s[*i] : '\0';
    const int d = h >= '0' && h <= '9'   ? h - '0'
                  : h >= 'a' && h <= 'f' ? h - 'a' + 10
                  : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                         : -1;
    if (d < 0) return std::nullopt;
    v = v * 16 + static_cast<uint32_t>(d);
    ++*i;
  }
  return v;
}

}  // namespace ps::grammar
