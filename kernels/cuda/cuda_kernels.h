// CUDA pieces behind CudaBackend: device discovery, tier memory, copies, cuBLAS
// GEMM and the elementwise kernels of the forward pass. Compiled whenever nvcc is
// present; every call checks its CUDA/cuBLAS return code. Everything runs on the
// legacy default stream, in call order.
//
// Two faces: the kernels over device memory (the backend's activations and tiers;
// launch errors are returned, errors while running show at the next synchronising
// call), and host-side wrappers (Gemm, RmsNorm, SiluMul) that take host or device
// pointers alike and return when done, so tests compare with the CPU kernels directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "kernels/memory_region.h"
#include "kernels/ring_space.h"

namespace ps::cuda {

// Number of usable CUDA devices (0 when there is no driver or no GPU).
int DeviceCount();
// OK when a CUDA device is usable, else why not (the runtime's message).
absl::Status DeviceAvailable();

// The device's streaming multiprocessors (at least 1).
int MultiprocessorCount();
// Bytes of device memory free now (cudaMemGetInfo).
absl::StatusOr<int64_t> FreeDeviceBytes();
// Device memory (the device KV tier, activations) and pinned host memory (the host tier).
absl::StatusOr<MemoryRegion> AllocateDevice(size_t bytes);
absl::StatusOr<MemoryRegion> AllocatePinned(size_t bytes);

// Copies bytes between any two of host memory, pinned memory and device memory
// (unified addressing picks the direction); returns when done.
absl::Status Copy(void* dst, const void* src, size_t bytes);
// Waits for every operation issued so far; the first error among them.
absl::Status Synchronize();

// Host data for the kernels that follow (index arrays: positions, block tables,
// selections): copied into a ring of pinned memory (kernels/ring_space.h) and from there
// to the device in stream order, so the host does not wait for the device's earlier
// work; the ring grows when a request is over a quarter of it.
class StagingRing {
 public:
  StagingRing() = default;
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;
  ~StagingRing();
  // Copies `bytes` at host address src to device memory dst after the work issued so
  // far; returns before the copy runs (src may change at once).
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes);

 private:
  // Waits for the oldest n copies (copies finish in order) and recycles their events.
  absl::Status Retire(size_t n);

  MemoryRegion pinned_;
  RingSpace space_{0};
  std::deque<void*> events_;  // cudaEvent_t recorded after each copy in space_.live(), oldest first
  std::vector<void*> spare_events_;
};

// ---- Kernels over device memory ----

// y[m, n] = x[m, k] * w[n, k]^T (cuBLAS SGEMM, F32).
absl::Status GemmDevice(const float* x, const float* w, float* y, int m, int n, int k);
// y[m, n] = x[m, k] * w[n, k]^T for BF16 x and w (raw 16-bit words), with F32
// accumulation and output (cublasGemmEx).
absl::Status GemmBf16Device(const uint16_t* x, const uint16_t* w, float* y, int m, int n, int k);
// out = x rounded to BF16 (nearest even) over n floats.
absl::Status ToBf16Device(const float* x, uint16_t* out, int64_t n);
// x[r] = row tokens[r] of `table` ([vocab, cols], F32 or BF16 words) as F32; tokens
// on the device.
absl::Status EmbedDevice(const void* table, bool bf16, const int32_t* tokens, int64_t n, int64_t cols, float* x);
// out[r] = x[r] / rms(x[r]) * w for `rows` rows of n.
absl::Status RmsNormDevice(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps);
// x[r] += delta[r]; out[r] = x[r] / rms(x[r]) * w.
absl::Status AddRmsNormDevice(const float* delta, float* x, const float* w, float* out, int64_t rows, int64_t n,
                              float eps);
// y += x over n floats.
absl::Status AddDevice(const float* x, float* y, int64_t n);
// gate = silu(gate) * up over n floats.
absl::Status SiluMulDevice(float* gate, const float* up, int64_t n);
// dst row i = src row rows[i] (rows: device, n_rows of them; negative: dst row i kept).
absl::Status GatherRowsDevice(const float* src, const int32_t* rows, int64_t n_rows, int64_t width, float* dst);
// Backend::ReduceRowRuns with bounds (runs + 1 of them) in device memory: kMaxMin when
// max_min, else kSum.
absl::Status ReduceRowRunsDevice(const float* x, int64_t width, const int32_t* bounds, int64_t runs, bool max_min,
                                 float* out);
// The two-part attention's merge (Backend::MergeByGate).
absl::Status MergeByGateDevice(int64_t n, int heads, int hd, float* o_p, int64_t p_stride, const float* o_d,
                               int64_t d_stride, const float* lse_p, const float* lse_d, int64_t lse_stride);

// RoPE of one model, in device terms: theta_scale = freq_base^(-2 / n_dims) computed
// on the host as the CPU does; freq_factors null or [n_dims / 2] on the device.
struct RopeDevice {
  int n_dims = 0;
  float theta_scale = 1.0f;
  float freq_scale = 1.0f;
  bool neox = false;
  const float* freq_factors = nullptr;
};
// Adds the biases (null: none; else all three, on the device) to q [rows, n_heads *
// head_dim], k and v [rows, n_kv_heads * head_dim] and rotates q and k by positions
// (device, [rows]), then adds bk_shift (null: none; [kv_dim]) to k.
absl::Status BiasRopeDevice(const RopeDevice& rope, const int32_t* positions, int64_t rows, const float* bq,
                            const float* bk, const float* bv, const float* bk_shift, float* q, float* k, float* v,
                            int n_heads, int n_kv_heads, int head_dim);
// Writes n rows of K and V ([n, kv_dim] F32) to rows of `dtype` (F32, F16, BF16) at
// k_dst[i] and v_dst[i] (arrays of device pointers, on the device).
absl::Status StoreKvDevice(DType dtype, int64_t kv_dim, int64_t n, const float* k, const float* v,
                           uint8_t* const* k_dst, uint8_t* const* v_dst);

// ---- Host-side wrappers (host or device pointers; return when done) ----

// y[m, n] = x[m, k] * w[n, k]^T.
absl::Status Gemm(const float* x, const float* w, float* y, int m, int n, int k);
// out[r] = x[r] / rms(x[r]) * w for each of `rows` rows of n floats.
absl::Status RmsNorm(const float* x, const float* w, float* out, int rows, int n, float eps);
// gate = silu(gate) * up over n floats.
absl::Status SiluMul(float* gate, const float* up, int64_t n);

}  // namespace ps::cuda
