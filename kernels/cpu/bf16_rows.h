// Products of a few activation rows (batched decode) with BF16 weights packed for oneDNN
// (sgemm.h's PackBf16), on AVX-512 BF16 dot products (vdpbf16ps): each pair of a row's
// values broadcast against a 64-column block's pair of weights, the sums of up to 6 rows by
// 64 columns in registers, and the weights ahead fetched meanwhile. oneDNN's kernels
// (GemmBf16Packed) leave the fetching to the hardware: on weights streamed from memory, 16
// rows took ~20% longer a pass over the 0.5B model's weights (Zen 5, two threads).
#pragma once

#include <cstdint>

namespace ps {

// The most activation rows SmallGemmBf16 is for.
constexpr int64_t kSmallGemmBf16Rows = 16;

// C[m, n1 - n0] = A[m, k] · W[n0, n1)ᵀ, W packed by PackBf16, n0 a multiple of 64, A BF16
// (rows k apart), C F32 (rows ldc apart). Only at CpuIsa::kAvx512Bf16.
void SmallGemmBf16(int64_t m, int64_t n0, int64_t n1, int64_t k, const uint16_t* a, const uint16_t* packed, float* c,
                   int64_t ldc);

}  // namespace ps
