// The AVX-512 VNNI build of the packed-matrix group kernel (kernels/cpu/packed_x86.h):
// vpdpbusd on 256-bit vectors (one group) or 512-bit ones (two at once, with g.second) in
// place of AVX2's vpmaddubsw/vpmaddwd pairs; bit for bit the same sums. Compiled with AVX-512 flags;
// called only at CpuIsa::kAvx512Bf16 (which has VNNI) or above. The activations' blocks
// are AVX2's.
// GCC 12 warns inside its own AVX-512 headers (a known false positive).
#if defined(__GNUC__) && !defined(__clang__)  // GCC only: clang knows neither the warnings nor the false positives
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "kernels/cpu/packed_x86.h"

namespace ps::packed_internal::avx512_vnni {

void GroupDot(const GroupArgs& g, const ActBlock* const* x, const uint8_t* const* xb, int rows, float* y,
              int64_t y_stride) {
  if (g.second != nullptr) return GroupDotX86<Zmm>(g, x, xb, rows, y, y_stride);
  GroupDotX86<Ymm>(g, x, xb, rows, y, y_stride);
}

}  // namespace ps::packed_internal::avx512_vnni
