// The CPU backend: the kernels of kernels/cpu/ (dispatched on the CPU's level,
// kernels/cpu/cpu_isa.h; oneDNN's sgemm) run on a thread pool. Host memory everywhere, so every pointer the
// forward pass holds is directly usable.
#pragma once

#include "base/thread_pool.h"
#include "kernels/backend.h"

namespace ps {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(ThreadPool& pool, const CpuBackendOptions& options = {}) : pool_(pool), options_(options) {}

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string_view name() const override { return "cpu"; }
  absl::StatusOr<MemoryRegion> AllocateTier(bool device_tier, size_t bytes) override;
  absl::StatusOr<MemoryRegion> AllocateActivations(size_t bytes) override;
  bool host_addressable() const override { return true; }
  bool StoresKv(DType dtype) const override { return dtype == DType::kQ8_0 || Backend::StoresKv(dtype); }
  void CopyToHost(const void* src, void* dst, size_t bytes) override;
  void CopyFromHost(const void* src, void* dst, size_t bytes) override;
  void GatherRows(const float* src, std::span<const int32_t> rows, int64_t width, float* dst) override;
  void ReduceRowRuns(const float* x, int64_t width, std::span<const int32_t> bounds, RowReduction op,
                     float* out) override;

  size_t PackedWeightBytes(const MatrixView& w) const override;
  void PackWeights(const MatrixView& w, uint8_t* dst) override;
  void MatMul(const MatrixView& w, const float* x, int64_t m, float* y) override;
  void MatMuls(std::span<const MatMulOutput> outs, const float* x, int64_t m) override;
  void Embed(const MatrixView& table, std::span<const int32_t> tokens, float* x) override;
  void RmsNorm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps) override;
  void AddRmsNorm(const float* delta, float* x, const float* w, float* out, int64_t rows, int64_t n,
                  float eps) override;
  void Add(const float* x, float* y, int64_t rows, int64_t n) override;
  void BiasRope(const RopeParams& rope, std::span<const int32_t> positions, const QkvBias& bias, float* q, float* k,
                float* v, int n_heads, int n_kv_heads, int head_dim) override;
  void SiluMul(float* gate, const float* up, int64_t rows, int64_t n) override;
  void Attention(const AttentionShape& shape, const KvRows& kv, const AttentionArgs& args) override;
  void Attentions(const AttentionShape& shape, std::span<const AttentionCall> calls) override;
  void MergeByGate(int64_t n, int heads, int hd, float* o_p, int64_t p_stride, const float* o_d, int64_t d_stride,
                   const float* lse_p, const float* lse_d, int64_t lse_stride) override;
  void StoreKv(DType dtype, int64_t kv_dim, int64_t n, const float* k, const float* v, uint8_t* const* k_dst,
               uint8_t* const* v_dst) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }

  ThreadPool& pool() { return pool_; }

 private:
  ThreadPool& pool_;
  CpuBackendOptions options_;
};

}  // namespace ps
