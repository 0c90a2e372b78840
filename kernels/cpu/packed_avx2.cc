// AVX2 kernels for packed matrices (kernels/cpu/packed.h): the group kernel
// (kernels/cpu/packed_x86.h), the activations' int8 blocks and their broadcast copies.
// The activations arrive broadcast in memory: on Zen 1, where vpmaddubsw issues at half
// the FMA rate, a broadcast per step costs a quarter of the throughput, a plain load
// nothing. Compiled with -mavx2 -mfma -mf16c; called only at CpuIsa::kAvx2 or above.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/packed.h"
#include "kernels/cpu/packed_x86.h"
#include "kernels/cpu/quant_block_avx2.h"

namespace ps::packed_internal::avx2 {

void GroupDot(const GroupArgs& g, const ActBlock* const* x, const uint8_t* const* xb, int rows, float* y,
              int64_t y_stride) {
  GroupDotX86<Ymm>(g, x, xb, rows, y, y_stride);
}

void Broadcast(const ActBlock* x, int64_t blocks, uint8_t* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    for (int j = 0; j < 8; ++j, out += 32) {
      int32_t four;
      std::memcpy(&four, x[b].qs + 4 * j, 4);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_set1_epi32(four));
    }
  }
}

void Quantize(const float* x, int64_t n, ActBlock* out) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    __m256 v[4];
    const float max = ps::avx2::LoadAbsMax32(x, v);
    __m256i q[4];
    const __m256i bytes = ps::avx2::QuantizeBytes32(v, max != 0 ? 127.0f / max : 0.0f, q);
    FinishActBlock(_mm256_xor_si256(bytes, flip), bytes, max, out[b]);
  }
}

}  // namespace ps::packed_internal::avx2
