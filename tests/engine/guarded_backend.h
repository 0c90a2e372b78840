// GuardedBackend: a Backend that forwards every operation to another one and keeps
// its activation memory out of host code's reach, as device memory is on a GPU:
// the pages are inaccessible (PROT_NONE) except while one of its operations runs,
// so host code that reads or writes activations other than through CopyToHost /
// CopyFromHost crashes the test. It is not host-addressable, so the forward pass
// hands strategies copies and stages their data back, as it does for a GPU.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "kernels/backend.h"

namespace ps::testing {

class GuardedBackend : public Backend {
 public:
  explicit GuardedBackend(Backend& inner) : inner_(inner) {}

  DeviceKind kind() const override { return inner_.kind(); }
  std::string_view name() const override { return "guarded"; }
  absl::StatusOr<MemoryRegion> AllocateTier(bool device_tier, size_t bytes) override {
    return inner_.AllocateTier(device_tier, bytes);
  }
  absl::StatusOr<MemoryRegion> AllocateActivations(size_t bytes) override {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t len = (bytes + page - 1) / page * page;
    void* p = ::mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return absl::ResourceExhaustedError(absl::StrCat("mmap of ", len, " bytes failed"));
    auto* base = static_cast<uint8_t*>(p);
    {
      std::lock_guard<std::mutex> lock(mu_);
      regions_[base] = len;
    }
    return MemoryRegion{.base = base, .release = [this](uint8_t* q) {
                          std::lock_guard<std::mutex> lock(mu_);
                          ::munmap(q, regions_.at(q));
                          regions_.erase(q);
                        }};
  }
  // Operations run so far (each with the activations opened for it).
  int64_t guarded_calls() const { return calls_.load(); }

  void CopyToHost(const void* src, void* dst, size_t bytes) override {
    Open open(*this);
    inner_.CopyToHost(src, dst, bytes);
  }
  void CopyFromHost(const void* src, void* dst, size_t bytes) override {
    Open open(*this);
    inner_.CopyFromHost(src, dst, bytes);
  }
  void GatherRows(const float* src, std::span<const int32_t> rows, int64_t width, float* dst) override {
    Open open(*this);
    inner_.GatherRows(src, rows, width, dst);
  }
  void ReduceRowRuns(const float* x, int64_t width, std::span<const int32_t> bounds, RowReduction op,
                     float* out) override {
    Open open(*this);
    inner_.ReduceRowRuns(x, width, bounds, op, out);
  }
  void MatMul(const MatrixView& w, const float* x, int64_t m, float* y) override {
    Open open(*this);
    inner_.MatMul(w, x, m, y);
  }
  void Embed(const MatrixView& table, std::span<const int32_t> tokens, float* x) override {
    Open open(*this);
    inner_.Embed(table, tokens, x);
  }
  void RmsNorm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps) override {
    Open open(*this);
    inner_.RmsNorm(x, w, out, rows, n, eps);
  }
  void AddRmsNorm(const float* delta, float* x, const float* w, float* out, int64_t rows, int64_t n,
                  float eps) override {
    Open open(*this);
    inner_.AddRmsNorm(delta, x, w, out, rows, n, eps);
  }
  void Add(const float* x, float* y, int64_t rows, int64_t n) override {
    Open open(*this);
    inner_.Add(x, y, rows, n);
  }
  void BiasRope(const RopeParams& rope, std::span<const int32_t> positions, const QkvBias& bias, float* q, float* k,
                float* v, int n_heads, int n_kv_heads, int head_dim) override {
    Open open(*this);
    inner_.BiasRope(rope, positions, bias, q, k, v, n_heads, n_kv_heads, head_dim);
  }
  void SiluMul(float* gate, const float* up, int64_t rows, int64_t n) override {
    Open open(*this);
    inner_.SiluMul(gate, up, rows, n);
  }
  void Attention(const AttentionShape& shape, const KvRows& kv, const AttentionArgs& args) override {
    Open open(*this);
    inner_.Attention(shape, kv, args);
  }
  void MergeByGate(int64_t n, int heads, int hd, float* o_p, int64_t p_stride, const float* o_d, int64_t d_stride,
                   const float* lse_p, const float* lse_d, int64_t lse_stride) override {
    Open open(*this);
    inner_.MergeByGate(n, heads, hd, o_p, p_stride, o_d, d_stride, lse_p, lse_d, lse_stride);
  }
  bool StoresKv(DType dtype) const override { return inner_.StoresKv(dtype); }
  void UseWeightsOf(uint64_t model_id) override { inner_.UseWeightsOf(model_id); }
  void StoreKv(DType dtype, int64_t kv_dim, int64_t n, const float* k, const float* v, uint8_t* const* k_dst,
               uint8_t* const* v_dst) override {
    Open open(*this);
    inner_.StoreKv(dtype, kv_dim, n, k, v, k_dst, v_dst);
  }
  absl::Status Synchronize() override { return inner_.Synchronize(); }

 private:
  // Activation memory is accessible for the life of one of these.
  class Open {
   public:
    explicit Open(GuardedBackend& b) : b_(b) {
      ++b_.calls_;
      b_.Protect(PROT_READ | PROT_WRITE);
    }
    ~Open() { b_.Protect(PROT_NONE); }

   private:
    GuardedBackend& b_;
  };
  void Protect(int prot) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [base, len] : regions_) PS_CHECK(::mprotect(base, len, prot) == 0) << "mprotect failed";
  }

  Backend& inner_;
  std::mutex mu_;
  std::map<uint8_t*, size_t> regions_;
  std::atomic<int64_t> calls_ = 0;
};

}  // namespace ps::testing
