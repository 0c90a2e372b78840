// CreateBackend: `--device cpu|cuda|auto` to a Backend.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/plugin.h"

namespace ps {
namespace {

// A CUDA backend that can run the whole forward pass, or why there is none.
absl::StatusOr<std::unique_ptr<Backend>> CompleteCudaBackend() {
  absl::StatusOr<void*> create = CudaPluginSymbol(kCudaCreateBackend);
  if (!create.ok()) return create.status();
  char error[512] = "";
  std::unique_ptr<Backend> b(reinterpret_cast<Backend* (*)(char*, size_t)>(*create)(error, sizeof(error)));
  if (b == nullptr) return absl::UnavailableError(error);
  if (const std::vector<std::string> missing = b->MissingOps(); !missing.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA backend cannot run the forward pass yet (missing: ", absl::StrJoin(missing, ", "), ")"));
  }
  return b;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view device, ThreadPool& pool,
                                                       const CpuBackendOptions& cpu, std::string* note) {
  if (device == "cpu") {
    *note = "cpu (--device cpu)";
    return std::unique_ptr<Backend>(new CpuBackend(pool, cpu));
  }
  if (device == "cuda" || device == "auto") {
    absl::StatusOr<std::unique_ptr<Backend>> gpu = CompleteCudaBackend();
    if (gpu.ok()) {
      *note = absl::StrCat("cuda (--device ", std::string(device), ")");
      return gpu;
    }
    if (device == "cuda")
      return absl::Status(gpu.status().code(), absl::StrCat("--device cuda: ", gpu.status().message()));
    *note = absl::StrCat("cpu (--device auto: ", gpu.status().message(), ")");
    return std::unique_ptr<Backend>(new CpuBackend(pool, cpu));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device must be cpu, cuda or auto, not '", std::string(device), "'"));
}

}  // namespace ps
