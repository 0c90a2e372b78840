// CudaBackend: the Backend of a GPU. Activations and the device KV tier are device
// memory, the host tier pinned memory; weights are mirrored on first use (F32
// matrices and vectors as they are, quantised and half matrices as BF16 through the
// caller's decoder: the mirror costs 2 bytes per weight). It runs the GEMMs (cuBLAS:
// SGEMM for F32 weights, BF16 x BF16 with F32 accumulation for the others), the
// embedding gather, RMSNorm, the residual adds, bias + RoPE, SwiGLU, the KV stores,
// the row gather, the two-part merge and attention (kernels/cuda/attention.h). Everything
// runs in order on the legacy default stream; errors are kept until Synchronize().
#pragma once

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/plugin.h"

namespace ps::cuda {

// An error when no CUDA device is usable.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(WeightRowDecoder decode);

}  // namespace ps::cuda

// The plug-in's entry point (kernels/plugin.h): a new CudaBackend, or null with the reason in `error`.
extern "C" ps::Backend* ps_cuda_create_backend(char* error, size_t error_size, ps::WeightRowDecoder decode);
