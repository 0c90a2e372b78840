// F32 matrix products for the CPU kernels (attention's score and value products,
// dequantised weight panels): oneDNN's sgemm, JIT-compiled for the CPU it finds (AVX2,
// AVX-512, ...), capped at ActiveCpuIsa()'s level when first used. Runs on the calling
// thread only: parallelism comes from our thread pool.
#pragma once

#include <cstdint>

namespace ps {

// C[m, n] = alpha * A[m, k] · op(B) + beta * C, row-major; op(B) = B [k, n], or Bᵀ
// with B [n, k] when b_transposed. lda, ldb, ldc: row strides in elements.
void Sgemm(bool b_transposed, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc);

// C[m, n] = A[m, k] · Bᵀ, A and B BF16 (B [n, k]), C F32: oneDNN's matmul primitive on the
// CPU's BF16 dot products (one primitive per weight shape and thread, made on first use). Only
// at CpuIsa::kAvx512Bf16. lda, ldb, ldc: row strides in elements. False (C untouched)
// for a shape oneDNN has no BF16 kernel for (it has none for a single row and column).
[[nodiscard]] bool GemmBf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
                            int64_t ldb, float* c, int64_t ldc);

}  // namespace ps
