// Matrix products against (possibly quantised) weight matrices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "base/thread_pool.h"
#include "kernels/types.h"

namespace ps {

// Batches of at most GemvMaxRows(type) rows use dot products that decode the weights
// in registers (memory-bound GEMV); larger ones dequantise weight panels and call
// sgemm. On AVX2 (an EPYC, 2 threads) GEMM wins from 4 rows, with AVX-512
// dequantisation from 2 (ps_bench_matmul compares the paths).
inline constexpr int64_t kGemvMaxRows = 3;
int64_t GemvMaxRows(DType type);

// y[m, w.rows] = x[m, w.cols] * w^T. x and y are dense row-major. Runs on `pool`.
// int8_activations: quantise activations to int8 blocks for dot products with quantised
// weights, at every batch size (llama.cpp's numerics): the packed kernels
// (kernels/cpu/packed.h) for the formats they know, else per-row dot products.
void MatMul(const MatrixView& w, const float* x, int64_t m, float* y, ThreadPool& pool, bool int8_activations = false);

// Several products of the same x (as Backend::MatMuls): the packed int8 ones in one
// parallel region (PackedMatMuls), the others one after another.
void MatMuls(std::span<const MatMulOutput> outs, const float* x, int64_t m, ThreadPool& pool, bool int8_activations);

// BF16 weights on a CPU with BF16 dot products are packed once for oneDNN's kernels
// (sgemm.h's PackBf16): PackedBf16Bytes(w.rows, w.cols) bytes at dst, which MatMul then reads
// through w.packed at every row count (w.data stays valid).
bool PacksBf16(const MatrixView& w);
void PackBf16Weights(const MatrixView& w, uint8_t* dst, ThreadPool& pool);

// The same with an explicit choice of path (tests and benchmarks compare them).
enum class MatMulPath { kAuto, kGemv, kGemm };
void MatMulWithPath(const MatrixView& w, const float* x, int64_t m, float* y, ThreadPool& pool, MatMulPath path,
                    bool int8_activations = false);

}  // namespace ps
