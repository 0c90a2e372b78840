// CUDA pieces behind CudaBackend: device discovery, tier memory, cuBLAS GEMM and
// the elementwise kernels of the forward pass. Compiled whenever nvcc is present;
// every call checks its CUDA/cuBLAS return code. The kernels' host-side API takes
// host pointers so tests can compare with the CPU kernels directly.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/memory_region.h"

namespace ps::cuda {

// Number of usable CUDA devices (0 when there is no driver or no GPU).
int DeviceCount();
// OK when a CUDA device is usable, else why not (the runtime's message).
absl::Status DeviceAvailable();

// Device memory (the device KV tier) and pinned host memory (the host tier).
absl::StatusOr<MemoryRegion> AllocateDevice(size_t bytes);
absl::StatusOr<MemoryRegion> AllocatePinned(size_t bytes);

// y[m, n] = x[m, k] * w[n, k]^T on the GPU (cuBLAS SGEMM); host pointers.
absl::Status Gemm(const float* x, const float* w, float* y, int m, int n, int k);

// out[r] = x[r] / rms(x[r]) * w for each of `rows` rows of n floats; host pointers.
absl::Status RmsNorm(const float* x, const float* w, float* out, int rows, int n, float eps);

// gate = silu(gate) * up over n floats; host pointers.
absl::Status SiluMul(float* gate, const float* up, int64_t n);

}  // namespace ps::cuda
