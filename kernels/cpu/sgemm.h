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

}  // namespace ps
