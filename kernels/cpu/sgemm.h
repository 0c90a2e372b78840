// F32 matrix products for the CPU kernels (attention's score and value products,
// dequantised weight panels): oneDNN's sgemm, JIT-compiled for the CPU it finds (AVX2,
// AVX-512, ...), capped at ActiveCpuIsa()'s level when first used. Runs on the calling
// thread only: parallelism comes from our thread pool.
#pragma once

#include <cstddef>
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

// BF16 weights W [n, k] (rows ldw apart) packed once for oneDNN's BF16 kernels: its blocked
// layout of B = Wᵀ for AVX-512 BF16 (BA16a64b2a: 64 columns of W at a time, 16 pairs of k per
// block, the pairs' values side by side; n padded to 64, k to 32, with zeros), which its
// kernels read without repacking the weights at every call. Only at CpuIsa::kAvx512Bf16.
inline constexpr int64_t kPackedBf16Columns = 64;  // the layout's blocks of W's rows
size_t PackedBf16Bytes(int64_t n, int64_t k);
void PackBf16(const uint16_t* w, int64_t n, int64_t k, int64_t ldw, uint16_t* dst);

// C[m, n1 - n0] = A[m, k] · W[n0, n1)ᵀ, W packed by PackBf16, n0 a multiple of 64, A and C
// dense (row strides k and n1 - n0: oneDNN's blocked-weight kernels take no other). One
// primitive per shape and thread, made on first use (a fraction of a millisecond).
void GemmBf16Packed(int64_t m, int64_t n0, int64_t n1, int64_t k, const uint16_t* a, const uint16_t* packed, float* c);

}  // namespace ps
