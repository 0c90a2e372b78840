// Products of BF16 weights with a few activation rows (batched decode) on AVX-512 BF16
// dot products (vdpbf16ps), the weights read in place, row-major: 4 weight rows
// against 4 activation rows a tile, 16 sums in registers, reduced together at the end.
// oneDNN's matmul (sgemm.h) takes the larger batches.
#pragma once

#include <cstdint>

namespace ps {

// The most activation rows SmallGemmBf16 is for.
constexpr int64_t kSmallGemmBf16Rows = 16;

// C[m, n] = A[m, k] · Bᵀ, A and B BF16 (B [n, k], ldb apart), C F32 (ldc apart), A's
// rows k apart. Only at CpuIsa::kAvx512Bf16.
void SmallGemmBf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b, int64_t ldb, float* c,
                   int64_t ldc);

}  // namespace ps
