#include "kernels/cuda/cuda_backend.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_kernels.h"

namespace ps::cuda {
namespace {

class CudaBackend final : public Backend {
 public:
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string_view name() const override { return "cuda"; }
  std::vector<std::string> MissingOps() const override {
    return {"embed", "matmul (quantised weights)", "add_rms_norm", "add", "bias_rope", "attention", "store_kv"};
  }
  absl::StatusOr<MemoryRegion> AllocateTier(bool device_tier, size_t bytes) override {
    return device_tier ? AllocateDevice(bytes) : AllocatePinned(bytes);
  }

  void MatMul(const MatrixView& w, const float* x, int64_t m, float* y) override {
    if (w.type != DType::kF32) return Missing("matmul (quantised weights)");
    Keep(Gemm(x, reinterpret_cast<const float*>(w.data), y, static_cast<int>(m), static_cast<int>(w.rows),
              static_cast<int>(w.cols)));
  }
  void Embed(const MatrixView&, std::span<const int32_t>, float*) override { Missing("embed"); }
  void RmsNorm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps) override {
    Keep(cuda::RmsNorm(x, w, out, static_cast<int>(rows), static_cast<int>(n), eps));
  }
  void AddRmsNorm(const float*, float*, const float*, float*, int64_t, int64_t, float) override {
    Missing("add_rms_norm");
  }
  void Add(const float*, float*, int64_t, int64_t) override { Missing("add"); }
  void BiasRope(const RopeParams&, std::span<const int32_t>, const QkvBias&, float*, float*, float*, int, int,
                int) override {
    Missing("bias_rope");
  }
  void SiluMul(float* gate, const float* up, int64_t rows, int64_t n) override {
    Keep(cuda::SiluMul(gate, up, rows * n));
  }
  void Attention(const AttentionShape&, const KvRows&, const AttentionArgs&) override { Missing("attention"); }
  void StoreKv(DType, int64_t, int64_t, const float*, const float*, uint8_t* const*, uint8_t* const*) override {
    Missing("store_kv");
  }
  absl::Status Synchronize() override {
    absl::Status s = std::move(error_);
    error_ = absl::OkStatus();
    return s;
  }

 private:
  void Keep(const absl::Status& s) { error_.Update(s); }
  void Missing(std::string_view op) {
    Keep(absl::UnimplementedError(absl::StrCat("the CUDA backend has no ", std::string(op), " yet")));
  }
  absl::Status error_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend() {
  if (absl::Status s = DeviceAvailable(); !s.ok()) return s;
  return std::unique_ptr<Backend>(new CudaBackend());
}

}  // namespace ps::cuda

extern "C" ps::Backend* ps_cuda_create_backend(char* error, size_t error_size) {
  absl::StatusOr<std::unique_ptr<ps::Backend>> b = ps::cuda::CreateCudaBackend();
  if (b.ok()) return b->release();
  std::snprintf(error, error_size, "%s", std::string(b.status().message()).c_str());
  return nullptr;
}
