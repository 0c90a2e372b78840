// The byte layout of one group (8 rows) of a packed matrix (kernels/cpu/packed.h),
// shared by the packer and the kernels of every level. Internal to kernels/cpu/.
//
// A group is a sequence of super-blocks (one 32-column block for the 32-element
// formats, eight for the K formats), each a header then its blocks. In a block, for
// row r (0..7), step j (0..7: columns 4j..4j+3 of the block) and i (0..3):
//   qs  (128 B, 4-bit formats and the low 4 bits of Q5/Q6): byte 32 (j % 4) + 4r + i
//       holds the quant of column 4j + i in its low nibble (j < 4) or high nibble (j >= 4);
//   qh  (32 B, Q5's fifth bits): bit j of byte 4r + i is bit 4 of that quant;
//   qh6 (64 B, Q6_K's bits 4-5): bits 2s, 2s + 1 of byte 32u + 4r + i are bits 4, 5 of
//       the quant of step j = 4u + s;
//   q8  (256 B, Q8_0): byte 32j + 4r + i is the quant itself (signed).
// Scales are the GGUF ones: fp16 d (and m) per row and block, or for the K formats fp16
// d (and dmin) per row and super-block with the 6-bit sub-block scales as bytes.
// A row's value is dw * q + mw, with per row and block (Q6_K: half block):
//   Q4_0 dw = d, mw = -8 d; Q4_1 dw = d, mw = m; Q5_0 dw = d, mw = -16 d; Q5_1 dw = d,
//   mw = m; Q8_0 dw = d, mw = 0 (q signed); Q4_K, Q5_K dw = d sc, mw = -dmin mn;
//   Q6_K dw = d sc, mw = -32 d sc.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"

namespace ps::packed_internal {

struct Layout {
  int super = 1;   // 32-column blocks per super-block
  int header = 0;  // bytes of a super-block's header
  int block = 0;   // bytes of a block
  // Offsets in the header (K formats: u16 d[8] at 0, dmin[8] at 16) or, for the others,
  // in the block: u16 d[8], u16 m[8]; K formats: u8 sc[8], mn[8] (Q6_K: i8 sc[16], half h
  // of row r at 8h + r); the quant planes.
  int d = 0, m = -1, sc = -1, qh = -1, qs = -1;
  int offset = 0;          // subtracted from every raw quant (the formats with mw = -offset dw)
  bool is_signed = false;  // Q8_0: raw quants are signed bytes
  int bits = 4;            // 4, 5, 6 or 8
};

// The layout of a packable type (kernels/cpu/packed.h's list); block == 0 for the others.
constexpr Layout LayoutFor(DType type) {
  switch (type) {
    case DType::kQ4_0: return {.block = 144, .d = 0, .qs = 16, .offset = 8};
    case DType::kQ4_1: return {.block = 160, .d = 0, .m = 16, .qs = 32};
    case DType::kQ5_0: return {.block = 176, .d = 0, .qh = 16, .qs = 48, .offset = 16, .bits = 5};
    case DType::kQ5_1: return {.block = 192, .d = 0, .m = 16, .qh = 32, .qs = 64, .bits = 5};
    case DType::kQ8_0: return {.block = 272, .d = 0, .qs = 16, .is_signed = true, .bits = 8};
    case DType::kQ4_K: return {.super = 8, .header = 32, .block = 144, .d = 0, .m = 16, .sc = 0, .qs = 16};
    case DType::kQ5_K:
      return {.super = 8, .header = 32, .block = 176, .d = 0, .m = 16, .sc = 0, .qh = 16, .qs = 48, .bits = 5};
    case DType::kQ6_K:
      return {.super = 8, .header = 16, .block = 208, .d = 0, .sc = 0, .qh = 144, .qs = 16, .offset = 32, .bits = 6};
    default: return {};
  }
}

constexpr bool IsKFormat(const Layout& l) { return l.super > 1; }
constexpr size_t SuperBytes(const Layout& l) { return static_cast<size_t>(l.header + l.super * l.block); }
// Start of block b (0-based, 32 columns each) of a group, and of its super-block's header.
constexpr const uint8_t* BlockAt(const Layout& l, const uint8_t* group, int64_t b) {
  return group + (b / l.super) * SuperBytes(l) + l.header + (b % l.super) * l.block;
}
constexpr const uint8_t* HeaderAt(const Layout& l, const uint8_t* group, int64_t b) {
  return group + (b / l.super) * SuperBytes(l);
}

}  // namespace ps::packed_internal
