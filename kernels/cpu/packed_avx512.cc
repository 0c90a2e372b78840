// The AVX-512 VNNI build of the packed-matrix group kernel (kernels/cpu/packed_x86.h):
// vpdpbusd on 256-bit vectors (AVX512_VL) in place of AVX2's vpmaddubsw/vpmaddwd pairs,
// bit for bit the same sums. Compiled with AVX-512 flags; called only at
// CpuIsa::kAvx512Bf16 (which has VNNI) or above. The activations' blocks and broadcast
// copies are AVX2's.
#include "kernels/cpu/packed_x86.h"

namespace ps::packed_internal::avx512_vnni {

void GroupDot(const GroupArgs& g, const ActBlock* const* x, const uint8_t* const* xb, int rows, float* y,
              int64_t y_stride) {
  GroupDotX86(g, x, xb, rows, y, y_stride);
}

}  // namespace ps::packed_internal::avx512_vnni
