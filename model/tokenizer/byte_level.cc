#include "model/tokenizer/byte_level.h"

#include <array>

#include "model/tokenizer/unicode.h"

namespace ps {
namespace {
struct Tables {
  std::array<uint32_t, 256> to_cp{};
  std::array<int, 512> to_byte{};  // code points 0..511 -> byte or -1
  Tables() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_cp[b] = printable ? b : 256 + n++;
      to_byte[to_cp[b]] = b;
    }
  }
};
const Tables& T() {
  static const Tables t;
  return t;
}
}  // namespace

uint32_t ByteToUnicode(uint8_t b) { return T().to_cp[b]; }

std::string BytesToUnicodeString(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) unicode::AppendUtf8(T().to_cp[c], &out);
  return out;
}

std::string UnicodeStringToBytes(std::string_view text) {
  std::string out;
  for (uint32_t cp : unicode::DecodeUtf8(text)) {
    if (cp < 512 && T().to_byte[cp] >= 0) {
      out.push_back(static_cast<char>(T().to_byte[cp]));
    } else {
      unicode::AppendUtf8(cp, &out);
    }
  }
  return out;
}

}  // namespace ps
