// The CUDA backend is a plug-in, libps_cuda.so next to the program, opened when
// --device asks for a GPU. Linked in, the CUDA libraries' static TLS (cudart 4 KiB,
// cuBLAS 94 KiB) would come out of every thread's stack, and the metrics server's
// threads (civetweb: 100 KiB stacks, of which OpenBLAS's TLS already takes 60 KiB)
// overflow or fail to start; opened at run time, their TLS is allocated apart.
#pragma once

#include "absl/status/statusor.h"

namespace ps {

// The address of an exported function of the CUDA plug-in (opened on first use);
// FailedPrecondition when this build or installation has none.
absl::StatusOr<void*> CudaPluginSymbol(const char* name);

// The plug-in's entry points (extern "C", so that dlsym finds them by name). Each
// returns null and writes a message into `error` on failure.
inline constexpr char kCudaCreateBackend[] = "ps_cuda_create_backend";
inline constexpr char kCudaCreateSwapEngine[] = "ps_cuda_create_swap_engine";

}  // namespace ps
