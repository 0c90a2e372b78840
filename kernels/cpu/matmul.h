// Matrix products against (possibly quantised) weight matrices.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/thread_pool.h"
#include "kernels/dtype.h"

namespace ps {

// A row-major weight matrix [rows, cols] whose rows are stored in `type` blocks.
// Does not own its data.
struct MatrixView {
  DType type = DType::kF32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes() const { return RowBytes(type, cols); }
  const uint8_t* Row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes(); }
};

// Batches of at most GemvMaxRows(type) rows use dot products that decode the weights
// in registers (memory-bound GEMV); larger ones dequantise weight tiles and call
// sgemm. Where the dequantisation is vectorised (F32, and the AVX-512 formats) the
// GEMM path wins from two rows on (ps_bench_matmul compares the paths).
inline constexpr int64_t kGemvMaxRows = 8;
int64_t GemvMaxRows(DType type);

struct MatMulOptions {
  // Quantise activations to int8 blocks for dot products with quantised weights, at
  // every batch size (llama.cpp's numerics). Default: F32 activations, which keeps
  // models with outlier activations (SmolLM2) equal to their F32-dequantised selves.
  bool int8_activations = false;
};

// y[m, w.rows] = x[m, w.cols] * w^T. x and y are dense row-major. Runs on `pool`.
void MatMul(const MatrixView& w, const float* x, int64_t m, float* y, ThreadPool& pool,
            const MatMulOptions& options = {});

// The same with an explicit choice of path (tests and benchmarks compare them).
enum class MatMulPath { kAuto, kGemv, kGemm };
void MatMulWithPath(const MatrixView& w, const float* x, int64_t m, float* y, ThreadPool& pool,
                    MatMulPath path, bool int8_activations = false);

// Disables OpenBLAS's own threading: parallelism comes from our pool.
void InitBlas();

}  // namespace ps
