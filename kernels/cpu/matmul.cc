#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <vector>

#include "base/status.h"
#include "kernels/cpu/bf16_rows.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/cpu/packed.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/sgemm.h"
#include "kernels/cpu/vec.h"

namespace ps {
namespace {

bool IsFloatType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// Per-thread scratch that only grows: after warm-up the hot path does not allocate.
template <typename T>
T* Scratch(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

void Gemv(const MatrixView& w, const float* x, int64_t m, float* y, ThreadPool& pool, bool int8_activations) {
  const int64_t k = w.cols;
  if (IsFloatType(w.type)) {
    pool.ParallelFor(w.rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* row = w.Row(r);
        for (int64_t i = 0; i < m; ++i) {
          const float* xi = x + i * k;
          float v;
          switch (w.type) {
            case DType::kF32: v = DotF32(reinterpret_cast<const float*>(row), xi, k); break;
            default: v = DotHalf(w.type, reinterpret_cast<const uint16_t*>(row), xi, k); break;
          }
          y[i * w.rows + r] = v;
        }
      }
    });
    return;
  }
  if (!int8_activations) {
    static thread_local std::vector<float> sums_storage;
    float* sums = Scratch(sums_storage, static_cast<size_t>(m * (k / kQK)));
    for (int64_t i = 0; i < m; ++i) BlockSums(x + i * k, sums + i * (k / kQK), k);
    pool.ParallelFor(w.rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* row = w.Row(r);
        for (int64_t i = 0; i < m; ++i) y[i * w.rows + r] = DotF32Act(w.type, row, x + i * k, sums + i * (k / kQK), k);
      }
    });
    return;
  }
  static thread_local std::vector<BlockQ8> xq_storage;
  const int64_t blocks = k / kQK;
  BlockQ8* xq = Scratch(xq_storage, static_cast<size_t>(m * blocks));
  for (int64_t i = 0; i < m; ++i) QuantizeRowQ8(x + i * k, xq + i * blocks, k);
  const bool rows_simd = m > 1 && avx2::Available() && avx2::Supports(w.type);
  pool.ParallelFor(w.rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = w.Row(r);
      if (rows_simd) {
        avx2::DotQ8Rows(w.type, row, xq, blocks, m, k, y + r, w.rows);
        continue;
      }
      for (int64_t i = 0; i < m; ++i) y[i * w.rows + r] = DotQ8(w.type, row, xq + i * blocks, k);
    }
  });
}

constexpr int64_t kSmallBatchRows = 64;

// Each thread's rows of a product on packed BF16 weights, from which the rows are split
// between the threads (each multiplies all of the weights; its share of y is then dense, as
// oneDNN's blocked-weight kernels want). Fewer rows split the weights' 64-column blocks, each
// thread's share of y written to scratch first.
constexpr int64_t kPackedBf16RowsPerThread = 32;

void PackedBf16Gemm(const MatrixView& w, const uint16_t* xb, int64_t m, float* y, ThreadPool& pool) {
  const int64_t n = w.rows, k = w.cols;
  const auto* packed = reinterpret_cast<const uint16_t*>(w.packed);
  const int64_t blocks = (n + kPackedBf16Columns - 1) / kPackedBf16Columns;
  if (m <= kSmallGemmBf16Rows) {
    pool.ParallelFor(blocks, 1, [&](int64_t b0, int64_t b1) {
      SmallGemmBf16(m, b0 * kPackedBf16Columns, std::min(n, b1 * kPackedBf16Columns), k, xb, packed,
                    y + b0 * kPackedBf16Columns, n);
    });
    return;
  }
  if (m >= kPackedBf16RowsPerThread * pool.num_threads()) {
    const int64_t share = (m + pool.num_threads() - 1) / pool.num_threads();
    pool.ParallelFor(
        m, share, [&](int64_t i0, int64_t i1) { GemmBf16Packed(i1 - i0, 0, n, k, xb + i0 * k, packed, y + i0 * n); },
        /*chunks_per_thread=*/1);
    return;
  }
  pool.ParallelFor(
      blocks, 1,
      [&](int64_t b0, int64_t b1) {
        const int64_t n0 = b0 * kPackedBf16Columns, n1 = std::min(n, b1 * kPackedBf16Columns), width = n1 - n0;
        static thread_local std::vector<float> c_storage;
        float* c = Scratch(c_storage, static_cast<size_t>(m * width));
        GemmBf16Packed(m, n0, n1, k, xb, packed, c);
        for (int64_t i = 0; i < m; ++i) std::copy(c + i * width, c + (i + 1) * width, y + i * n + n0);
      },
      /*chunks_per_thread=*/1);
}

void Gemm(const MatrixView& w, const float* x, int64_t m, float* y, ThreadPool& pool) {
  const int64_t k = w.cols;
  if (w.type == DType::kF32) {
    pool.ParallelFor(w.rows, 64, [&](int64_t r0, int64_t r1) {
      Sgemm(true, m, r1 - r0, k, 1.0f, x, k, reinterpret_cast<const float*>(w.Row(r0)), k, 0.0f, y + r0, w.rows);
    });
    return;
  }
  // BF16 weights as they are, on the CPU's BF16 dot products: the activations rounded to
  // BF16 once, then each thread's share of the weight rows in one oneDNN matmul.
  const bool bf16_products = w.type == DType::kBF16 && ActiveCpuIsa() >= CpuIsa::kAvx512Bf16;
  static thread_local std::vector<uint16_t> xb_storage;
  uint16_t* xb = bf16_products ? Scratch(xb_storage, static_cast<size_t>(m * k)) : nullptr;
  if (bf16_products) {
    pool.ParallelFor(m, 4,
                     [&](int64_t i0, int64_t i1) { F32ToHalf(DType::kBF16, x + i0 * k, xb + i0 * k, (i1 - i0) * k); });
  }
  // Otherwise each thread dequantises its share of the weight rows into F32 panels of at
  // most kPanelFloats and multiplies each panel with all m rows in one sgemm, so that
  // sgemm packs the activations once per panel (not once per small tile: slicing
  // spent ~40% of a 0.5B model's prefill in sgemm's packing routines).
  // Few rows (batched decode): panels of 256 KiB that stay in L2 between being written
  // and read, where packing the few activation rows again per panel costs little.
  const int64_t panel_floats = m <= kSmallBatchRows ? int64_t{64} << 10 : int64_t{4} << 20;
  const int64_t panel = std::max<int64_t>(16, panel_floats / k / 16 * 16);
  const int64_t share = (w.rows + pool.num_threads() - 1) / pool.num_threads();
  // BF16 products take each thread's share in one call (no panels to keep in L2).
  const int64_t grain = bf16_products ? (share + 15) / 16 * 16 : std::min(panel, (share + 15) / 16 * 16);
  if (bf16_products && w.packed != nullptr) {
    PackedBf16Gemm(w, xb, m, y, pool);
    return;
  }
  pool.ParallelFor(w.rows, grain, [&](int64_t r0, int64_t r1) {
    if (bf16_products &&
        GemmBf16(m, r1 - r0, k, xb, k, reinterpret_cast<const uint16_t*>(w.Row(r0)), k, y + r0, w.rows)) {
      return;
    }
    static thread_local std::vector<float> wf_storage;
    float* wf = Scratch(wf_storage, static_cast<size_t>(std::min(panel, r1 - r0) * k));
    for (int64_t t0 = r0; t0 < r1; t0 += panel) {
      const int64_t t1 = std::min(r1, t0 + panel);
      for (int64_t r = t0; r < t1; ++r) DequantizeRow(w.type, w.Row(r), wf + (r - t0) * k, k);
      Sgemm(true, m, t1 - t0, k, 1.0f, x, k, wf, k, 0.0f, y + t0, w.rows);
    }
  });
}

}  // namespace

int64_t GemvMaxRows(DType type) {
  return type == DType::kF32 || (avx512::Available() && avx512::Supports(type)) ? 1 : kGemvMaxRows;
}

void MatMulWithPath(const MatrixView& w, const float* x, int64_t m, float* y, ThreadPool& pool, MatMulPath path,
                    bool int8_activations) {
  PS_CHECK(w.data != nullptr && w.rows > 0 && w.cols > 0) << "empty matrix";
  if (m <= 0) return;
  if (path == MatMulPath::kAuto) {
    path = m <= GemvMaxRows(w.type) && !PacksBf16(w) ? MatMulPath::kGemv : MatMulPath::kGemm;
  }
  if (path == MatMulPath::kGemv) {
    Gemv(w, x, m, y, pool, int8_activations);
  } else {
    Gemm(w, x, m, y, pool);
  }
}

bool PacksBf16(const MatrixView& w) { return w.type == DType::kBF16 && ActiveCpuIsa() >= CpuIsa::kAvx512Bf16; }

void PackBf16Weights(const MatrixView& w, uint8_t* dst, ThreadPool& pool) {
  PS_CHECK(PacksBf16(w)) << "only BF16 weights on AVX-512 BF16 are packed for BF16 products";
  // Each block of rows is packed on its own, at its place in the layout.
  const int64_t block_bytes = static_cast<int64_t>(PackedBf16Bytes(kPackedBf16Columns, w.cols));
  pool.ParallelFor((w.rows + kPackedBf16Columns - 1) / kPackedBf16Columns, 1, [&](int64_t b0, int64_t b1) {
    const int64_t n0 = b0 * kPackedBf16Columns, n1 = std::min(w.rows, b1 * kPackedBf16Columns);
    PackBf16(reinterpret_cast<const uint16_t*>(w.Row(n0)), n1 - n0, w.cols, w.cols,
             reinterpret_cast<uint16_t*>(dst + b0 * block_bytes));
  });
}

namespace {
// int8 products on the packed layout: always when the weights were packed at start-up;
// otherwise packed on the fly, which pays from a few rows up.
bool TakesPackedKernels(const MatrixView& w, int64_t m, bool int8_activations) {
  return int8_activations && Packable(w.type) && (w.packed != nullptr || m > GemvMaxRows(w.type));
}
}  // namespace

void MatMul(const MatrixView& w, const float* x, int64_t m, float* y, ThreadPool& pool, bool int8_activations) {
  const MatMulOutput out{.w = &w, .y = y};
  MatMuls({&out, 1}, x, m, pool, int8_activations);
}

void MatMuls(std::span<const MatMulOutput> outs, const float* x, int64_t m, ThreadPool& pool, bool int8_activations) {
  static thread_local std::vector<PackedProduct> packed;  // the caller's; grows once
  packed.clear();
  for (const MatMulOutput& o : outs) {
    if (TakesPackedKernels(*o.w, m, int8_activations)) {
      packed.push_back({.w = *o.w, .packed = o.w->packed, .y = o.y});
    } else {
      // Quantized weights the packed kernels do not take keep int8 dot products at any m;
      // float weights ignore int8_activations (F32 products, GEMM from a few rows up).
      const bool int8_dots = int8_activations && !IsFloatType(o.w->type);
      MatMulWithPath(*o.w, x, m, o.y, pool, int8_dots ? MatMulPath::kGemv : MatMulPath::kAuto, int8_activations);
    }
  }
  PackedMatMuls(packed, x, m, pool);
}

}  // namespace ps
