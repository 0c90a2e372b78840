#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"

#include "kernels/cpu/attention.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/sgemm.h"
#include "kernels/cpu/vec.h"
#include "kernels/shared_math.h"

namespace ps {
namespace {

constexpr int kMaxRopeDims = 1024;  // ValidateConfig bounds head_dim by this

absl::StatusOr<MemoryRegion> HostMemory(size_t bytes, const char* what) {
  auto* base = static_cast<uint8_t*>(::operator new[](bytes + 1, std::align_val_t(64), std::nothrow));
  if (base == nullptr)
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes for ", what));
  return MemoryRegion{.base = base, .release = [](uint8_t* p) { ::operator delete[](p, std::align_val_t(64)); }};
}

}  // namespace

absl::StatusOr<MemoryRegion> CpuBackend::AllocateTier(bool device_tier, size_t bytes) {
  (void)device_tier;  // both tiers are ordinary host memory (pages committed as they are touched)
  return HostMemory(bytes, "a KV tier");
}

absl::StatusOr<MemoryRegion> CpuBackend::AllocateActivations(size_t bytes) { return HostMemory(bytes, "activations"); }

void CpuBackend::CopyToHost(const void* src, void* dst, size_t bytes) {
  if (src != dst && bytes > 0) std::memcpy(dst, src, bytes);
}

void CpuBackend::CopyFromHost(const void* src, void* dst, size_t bytes) {
  if (src != dst && bytes > 0) std::memcpy(dst, src, bytes);
}

void CpuBackend::GatherRows(const float* src, std::span<const int32_t> rows, int64_t width, float* dst) {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= 0) std::memcpy(dst + i * width, src + rows[i] * width, width * sizeof(float));
  }
}

void CpuBackend::ReduceRowRuns(const float* x, int64_t width, std::span<const int32_t> bounds, RowReduction op,
                               float* out) {
  const auto runs = static_cast<int64_t>(bounds.size()) - 1;
  pool_.ParallelFor(runs, 4, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float* first = x + bounds[i] * width;
      if (op == RowReduction::kSum) {
        float* sum = out + i * width;
        std::copy(first, first + width, sum);
        for (int64_t r = bounds[i] + 1; r < bounds[i + 1]; ++r) AddInPlace(x + r * width, sum, width);
        continue;
      }
      float* max = out + 2 * i * width;
      float* min = max + width;
      std::copy(first, first + width, max);
      std::copy(first, first + width, min);
      for (int64_t r = bounds[i] + 1; r < bounds[i + 1]; ++r) {
        const float* row = x + r * width;
        for (int64_t c = 0; c < width; ++c) {
          max[c] = std::max(max[c], row[c]);
          min[c] = std::min(min[c], row[c]);
        }
      }
    }
  });
}

// Both layouts keep rows in groups that a part of kPackedRowGroup rows is whole groups of:
// int8's of 8 (packed.h), BF16's of kPackedBf16Columns.
static_assert(Backend::kPackedRowGroup % 8 == 0 && Backend::kPackedRowGroup % kPackedBf16Columns == 0);

size_t CpuBackend::PackedWeightBytes(const MatrixView& w) const {
  if (PacksBf16(w)) return PackedBf16Bytes(w.rows, w.cols);
  return options_.int8_activations && Packable(w.type) ? PackedBytes(w.type, w.rows, w.cols) : 0;
}

void CpuBackend::PackWeights(const MatrixView& w, uint8_t* dst) {
  if (PacksBf16(w)) {
    PackBf16Weights(w, dst, pool_);
  } else {
    PackMatrix(w, dst, pool_);
  }
}

void CpuBackend::MatMul(const MatrixView& w, const float* x, int64_t m, float* y) {
  ps::MatMul(w, x, m, y, pool_, options_.int8_activations);
}

void CpuBackend::MatMuls(std::span<const MatMulOutput> outs, const float* x, int64_t m) {
  ps::MatMuls(outs, x, m, pool_, options_.int8_activations);
}

void CpuBackend::Embed(const MatrixView& table, std::span<const int32_t> tokens, float* x) {
  const int64_t d = table.cols;
  pool_.ParallelFor(static_cast<int64_t>(tokens.size()), 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) DequantizeRow(table.type, table.Row(tokens[r]), x + r * d, d);
  });
}

void CpuBackend::RmsNorm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps) {
  pool_.ParallelFor(rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) ps::RmsNorm(x + r * n, w, out + r * n, n, eps);
  });
}

void CpuBackend::AddRmsNorm(const float* delta, float* x, const float* w, float* out, int64_t rows, int64_t n,
                            float eps) {
  pool_.ParallelFor(rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      AddInPlace(delta + r * n, x + r * n, n);
      ps::RmsNorm(x + r * n, w, out + r * n, n, eps);
    }
  });
}

void CpuBackend::Add(const float* x, float* y, int64_t rows, int64_t n) {
  pool_.ParallelFor(rows, 8, [&](int64_t r0, int64_t r1) { AddInPlace(x + r0 * n, y + r0 * n, (r1 - r0) * n); });
}

void CpuBackend::BiasRope(const RopeParams& rope, std::span<const int32_t> positions, const QkvBias& bias, float* q,
                          float* k, float* v, int n_heads, int n_kv_heads, int head_dim) {
  const int64_t qd = static_cast<int64_t>(n_heads) * head_dim, kvd = static_cast<int64_t>(n_kv_heads) * head_dim;
  pool_.ParallelFor(static_cast<int64_t>(positions.size()), 4, [&](int64_t r0, int64_t r1) {
    float cs[kMaxRopeDims];
    for (int64_t r = r0; r < r1; ++r) {
      if (bias.q != nullptr) {
        AddInPlace(bias.q, q + r * qd, qd);
        AddInPlace(bias.k, k + r * kvd, kvd);
        AddInPlace(bias.v, v + r * kvd, kvd);
      }
      RopeCache(rope, positions[r], cs);
      RopeApply(rope, cs, q + r * qd, n_heads, head_dim);
      RopeApply(rope, cs, k + r * kvd, n_kv_heads, head_dim);
      if (bias.k_shift != nullptr) AddInPlace(bias.k_shift, k + r * kvd, kvd);
    }
  });
}

void CpuBackend::SiluMul(float* gate, const float* up, int64_t rows, int64_t n) {
  pool_.ParallelFor(rows, 4, [&](int64_t r0, int64_t r1) { ps::SiluMul(gate + r0 * n, up + r0 * n, (r1 - r0) * n); });
}

void CpuBackend::Attention(const AttentionShape& shape, const KvRows& kv, const AttentionArgs& args) {
  ps::Attention(shape, kv, args, pool_);
}

void CpuBackend::Attentions(const AttentionShape& shape, std::span<const AttentionCall> calls) {
  ps::Attentions(shape, calls, pool_);
}

void CpuBackend::MergeByGate(int64_t n, int heads, int hd, float* o_p, int64_t p_stride, const float* o_d,
                             int64_t d_stride, const float* lse_p, const float* lse_d, int64_t lse_stride) {
  for (int64_t i = 0; i < n; ++i) {
    for (int h = 0; h < heads; ++h) {
      const float g = ProximalGate(lse_p[i * lse_stride + h], lse_d[i * lse_stride + h]);
      float* p = o_p + i * p_stride + static_cast<int64_t>(h) * hd;
      const float* d = o_d + i * d_stride + static_cast<int64_t>(h) * hd;
      for (int c = 0; c < hd; ++c) p[c] = g * p[c] + (1.0f - g) * d[c];
    }
  }
}

void CpuBackend::StoreKv(DType dtype, int64_t kv_dim, int64_t n, const float* k, const float* v, uint8_t* const* k_dst,
                         uint8_t* const* v_dst) {
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(k_dst[i], k + i * kv_dim, kv_dim * sizeof(float));
      std::memcpy(v_dst[i], v + i * kv_dim, kv_dim * sizeof(float));
    } else if (dtype == DType::kQ8_0) {
      QuantizeRowQ8_0(k + i * kv_dim, reinterpret_cast<BlockQ8_0*>(k_dst[i]), kv_dim);
      QuantizeRowQ8_0(v + i * kv_dim, reinterpret_cast<BlockQ8_0*>(v_dst[i]), kv_dim);
    } else {
      F32ToHalf(dtype, k + i * kv_dim, reinterpret_cast<uint16_t*>(k_dst[i]), kv_dim);
      F32ToHalf(dtype, v + i * kv_dim, reinterpret_cast<uint16_t*>(v_dst[i]), kv_dim);
    }
  }
}

}  // namespace ps
