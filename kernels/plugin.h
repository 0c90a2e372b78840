// The CUDA backend is a plug-in, libps_cuda.so next to the program (or where
// $PS_CUDA_PLUGIN says: the tests, whose programs live elsewhere), opened when
// --device asks for a GPU. Linked in, the CUDA libraries' static TLS (cudart 4 KiB,
// cuBLAS 94 KiB) would come out of every thread's stack, and the metrics server's
// threads (civetweb: 100 KiB stacks, of which OpenBLAS's TLS already takes 60 KiB)
// overflow or fail to start; opened at run time, their TLS is allocated apart.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/types.h"

namespace ps {

// The address of an exported function of the CUDA plug-in (opened on first use);
// FailedPrecondition when this build or installation has none.
absl::StatusOr<void*> CudaPluginSymbol(const char* name);

// Decodes row `row` of a weight matrix to F32 (the CPU's dequantisation, which the
// plug-in does not link): how the CUDA backend makes its BF16 copies of the weights.
using WeightRowDecoder = void (*)(const MatrixView& w, int64_t row, float* out);

// The plug-in's entry points (extern "C", so that dlsym finds them by name). Each
// returns null and writes a message into `error` on failure.
// Backend* (char* error, size_t error_size, WeightRowDecoder decode)
inline constexpr char kCudaCreateBackend[] = "ps_cuda_create_backend";
inline constexpr char kCudaCreateSwapEngine[] = "ps_cuda_create_swap_engine";

}  // namespace ps
