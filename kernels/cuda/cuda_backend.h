// CudaBackend: the Backend of a GPU. Today it owns the tier memory (device memory
// and pinned host memory) and runs the cuBLAS GEMM of F32 weights, RMSNorm and
// SwiGLU; the other operations (MissingOps) follow with the CUDA issue, and the
// engine refuses to start on a backend that lacks any. Errors of the operations it
// runs are kept until Synchronize().
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace ps::cuda {

// An error when no CUDA device is usable.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend();

}  // namespace ps::cuda

// The plug-in's entry point (kernels/plugin.h): a new CudaBackend, or null with the reason in `error`.
extern "C" ps::Backend* ps_cuda_create_backend(char* error, size_t error_size);
