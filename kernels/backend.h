// The seam between the forward pass and the hardware: every operation the
// forward pass runs, one interface, implemented by CpuBackend (kernels/cpu/) and
// CudaBackend (kernels/cuda/), chosen at start-up by CreateBackend
// (`--device cpu|cuda|auto`). Buffers are row-major [rows, width] in the backend's
// memory. Call from one thread at a time (the engine thread).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/memory_region.h"
#include "kernels/types.h"

namespace ps {

class ThreadPool;

enum class DeviceKind { kCpu, kCuda };

// Biases of the q, k and v projections ([q_dim], [kv_dim], [kv_dim]); all null without.
struct QkvBias {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string_view name() const = 0;
  // Operations this backend cannot run yet; empty when it runs the whole forward pass.
  virtual std::vector<std::string> MissingOps() const { return {}; }

  // Memory for the device KV tier (device memory) or the host tier (host memory
  // the device copies to and from directly: pinned on a GPU).
  virtual absl::StatusOr<MemoryRegion> AllocateTier(bool device_tier, size_t bytes) = 0;

  // y[m, w.rows] = x[m, w.cols] · wᵀ
  virtual void MatMul(const MatrixView& w, const float* x, int64_t m, float* y) = 0;
  // x[r] = row tokens[r] of `table`, as F32 ([tokens.size(), table.cols]).
  virtual void Embed(const MatrixView& table, std::span<const int32_t> tokens, float* x) = 0;
  // out[r] = x[r] / rms(x[r]) * w for `rows` rows of n.
  virtual void RmsNorm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps) = 0;
  // The residual add and the next norm: x[r] += delta[r]; out[r] = RmsNorm(x[r]) * w.
  virtual void AddRmsNorm(const float* delta, float* x, const float* w, float* out, int64_t rows, int64_t n,
                          float eps) = 0;
  // y[r] += x[r] for `rows` rows of n.
  virtual void Add(const float* x, float* y, int64_t rows, int64_t n) = 0;
  // Adds the biases to q [rows, n_heads*head_dim], k and v [rows, n_kv_heads*head_dim]
  // and rotates q and k by the rows' positions.
  virtual void BiasRope(const RopeParams& rope, std::span<const int32_t> positions, const QkvBias& bias, float* q,
                        float* k, float* v, int n_heads, int n_kv_heads, int head_dim) = 0;
  // gate[r] = silu(gate[r]) * up[r] for `rows` rows of n.
  virtual void SiluMul(float* gate, const float* up, int64_t rows, int64_t n) = 0;
  // Causal attention of one sequence's query rows over its selected cached rows.
  virtual void Attention(const AttentionShape& shape, const KvRows& kv, const AttentionArgs& args) = 0;
  // Writes n rows of K and V ([n, kv_dim] F32) into cache rows of `dtype`: row i to
  // k_dst[i] and v_dst[i].
  virtual void StoreKv(DType dtype, int64_t kv_dim, int64_t n, const float* k, const float* v, uint8_t* const* k_dst,
                       uint8_t* const* v_dst) = 0;
  // The first error since the last call (devices that run asynchronously report
  // failures here); always OK on the CPU.
  virtual absl::Status Synchronize() = 0;
};

struct CpuBackendOptions {
  // Quantise activations to int8 blocks for dot products with quantised weights, at
  // every batch size (llama.cpp's numerics). Default: F32 activations, which keeps
  // models with outlier activations (SmolLM2) equal to their F32-dequantised selves.
  bool int8_activations = false;
};

// The backend for `--device`: "cpu", "cuda" (an error when this machine or build has
// no usable CUDA device, or the CUDA backend is incomplete) or "auto" (cuda when
// usable, else cpu). *note says what was chosen and why (for the start-up log).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view device, ThreadPool& pool,
                                                       const CpuBackendOptions& cpu, std::string* note);

}  // namespace ps
