#include "model/tokenizer/unicode.h"

#include <algorithm>

namespace ps::unicode {
namespace {
struct CodepointRange {
  uint32_t first, last;
};
#include "model/tokenizer/unicode_tables.inc"

template <size_t N>
bool InRanges(const CodepointRange (&r)[N], uint32_t cp) {
  auto it =
      std::upper_bound(std::begin(r), std::end(r), cp, [](uint32_t v, const CodepointRange& x) { return v < x.first; });
  return it != std::begin(r) && cp <= (it - 1)->last;
}
}  // namespace

int Utf8SequenceLength(uint8_t c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;
}

std::vector<uint32_t> DecodeUtf8(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    const int len = Utf8SequenceLength(c);
    bool ok = len > 1 && i + len <= s.size();
    uint32_t cp = 0;
    if (ok) {
      cp = c & (0xFF >> (len + 1));
      for (int k = 1; k < len; ++k) {
        const uint8_t cc = static_cast<uint8_t>(s[i + k]);
        if ((cc & 0xC0) != 0x80) {
          ok = false;
          break;
        }
        cp = (cp << 6) | (cc & 0x3F);
      }
    }
    if (len == 1 && c < 0x80) {
      out.push_back(c);
      ++i;
    } else if (ok) {
      out.push_back(cp);
      i += len;
    } else {
      out.push_back(kRawByteBase + c);
      ++i;
    }
  }
  return out;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp >= kRawByteBase) {
    out->push_back(static_cast<char>(cp - kRawByteBase));
  } else if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string EncodeUtf8(const uint32_t* cps, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) AppendUtf8(cps[i], &out);
  return out;
}

bool IsLetter(uint32_t cp) { return cp < kRawByteBase && InRanges(kLetterRanges, cp); }
bool IsNumber(uint32_t cp) { return cp < kRawByteBase && InRanges(kNumberRanges, cp); }

bool IsWhitespace(uint32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000: return true;
    default: return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace ps::unicode
