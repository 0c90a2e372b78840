// CreateBackend: `--device cpu|cuda|auto` to a Backend.
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/quant.h"
#include "kernels/plugin.h"

namespace ps {
namespace {

void DecodeWeightRow(const MatrixView& w, int64_t row, float* out) { DequantizeRow(w.type, w.Row(row), out, w.cols); }

// The CUDA backend, or why there is none.
absl::StatusOr<std::unique_ptr<Backend>> CudaBackend() {
  absl::StatusOr<void*> create = CudaPluginSymbol(kCudaCreateBackend);
  if (!create.ok()) return create.status();
  char error[512] = "";
  std::unique_ptr<Backend> b(
      reinterpret_cast<Backend* (*)(char*, size_t, WeightRowDecoder)>(*create)(error, sizeof(error), &DecodeWeightRow));
  if (b == nullptr) return absl::UnavailableError(error);
  return b;
}

// Whether `--device auto` may pick the CUDA backend: not until its parity suite
// (tests/kernels/cuda_test.cc, tests/engine/cuda_forward_test.cc) has passed on a GPU.
// `--device cuda` always may.
constexpr bool kCudaVerifiedOnAGpu = false;

}  // namespace

absl::StatusOr<bool> ParseActivations(std::string_view name) {
  if (name == "int8") return true;
  if (name == "f32") return false;
  return absl::InvalidArgumentError(absl::StrCat("--activations must be int8 or f32, not '", std::string(name), "'"));
}

absl::Status CapCpuKernels(std::string_view level) {
  PS_ASSIGN_OR_RETURN(const CpuIsa isa, ParseCpuIsa(level));
  return SetCpuIsa(isa);
}

std::string CpuKernelLevel() { return std::string(CpuIsaName(ActiveCpuIsa())); }
std::string DescribeCpuKernels() { return DescribeCpuIsa(); }

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view device, ThreadPool& pool,
                                                       const CpuBackendOptions& cpu, std::string* note) {
  if (device == "cpu") {
    *note = "cpu (--device cpu)";
    return std::unique_ptr<Backend>(new CpuBackend(pool, cpu));
  }
  if (device == "auto" && !kCudaVerifiedOnAGpu) {
    *note = "cpu (--device auto: the CUDA backend has not passed all its checks on a GPU yet; --device cuda to use it)";
    return std::unique_ptr<Backend>(new CpuBackend(pool, cpu));
  }
  if (device == "cuda" || device == "auto") {
    absl::StatusOr<std::unique_ptr<Backend>> gpu = CudaBackend();
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
