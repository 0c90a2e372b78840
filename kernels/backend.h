// The seam between the forward pass and the hardware: every operation the
// forward pass runs, one interface, implemented by CpuBackend (kernels/cpu/) and
// CudaBackend (kernels/cuda/), chosen at start-up by CreateBackend
// (`--device cpu|cuda|auto`). Call from one thread at a time (the engine thread).
//
// Where data lives: activations (every float buffer an operation reads or writes,
// row-major [rows, width]) are in the backend's memory, from AllocateActivations;
// host code reaches them only through CopyToHost / CopyFromHost, unless
// host_addressable(). KV rows are in tier memory (AllocateTier). Weights (MatrixView,
// norm and bias vectors) and index arrays (tokens, positions, block tables,
// selections) are host memory: a device backend may mirror the weights once (they
// never change) and reads the index arrays at the call.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/memory_region.h"
#include "kernels/types.h"

namespace ps {

class ThreadPool;

enum class DeviceKind { kCpu, kCuda };

// How ReduceRowRuns reduces a run of rows, column by column.
enum class RowReduction {
  kMaxMin,  // two rows per run: the maximum, then the minimum
  kSum,     // one row per run: the sum
};

// Biases of the q, k and v projections ([q_dim], [kv_dim], [kv_dim]); all null without.
// k_shift ([kv_dim], or null) is added to k after the rotation (model.h's bk_shift).
struct QkvBias {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* k_shift = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string_view name() const = 0;

  // Memory for the device KV tier (device memory) or the host tier (host memory
  // the device copies to and from directly: pinned on a GPU).
  virtual absl::StatusOr<MemoryRegion> AllocateTier(bool device_tier, size_t bytes) = 0;
  // Memory for activations (device memory on a GPU).
  virtual absl::StatusOr<MemoryRegion> AllocateActivations(size_t bytes) = 0;
  // Makes the device's copy of weight matrix w now rather than at its first use (a
  // GPU's mirror), so that the weights are in device memory before the KV tiers are
  // sized from what is left. Nothing to do where weights are used in place (the CPU).
  // Errors show at the next Synchronize().
  virtual void PrepareWeights(const MatrixView& /*w*/) {}
  // The weights handed to this backend from now on are the model `model_id`'s
  // (Model::id(), unique in the process): copies a backend keeps of another model's
  // weights are dropped (kernels/weight_mirrors.h).
  virtual void UseWeightsOf(uint64_t /*model_id*/) {}
  // Bytes of w in the layout this backend's products read it in, when that is not w's own
  // (the CPU's int8 and BF16 kernels: kernels/cpu/packed.h, sgemm.h); 0 when w is used as it
  // is. A layout keeps the rows in groups of at most kPackedRowGroup: the layout of w's first
  // r rows (r a multiple of it) is the first PackedWeightBytes(those rows) bytes of w's, so
  // that w can be packed a part at a time.
  static constexpr int64_t kPackedRowGroup = 64;
  virtual size_t PackedWeightBytes(const MatrixView& /*w*/) const { return 0; }
  // Writes that layout of w to dst (PackedWeightBytes(w) bytes); MatMul then reads it
  // through w.packed.
  virtual void PackWeights(const MatrixView& /*w*/, uint8_t* /*dst*/) {}
  // Bytes of device memory free now; Unimplemented where the device tier is host
  // memory (the CPU).
  virtual absl::StatusOr<int64_t> FreeDeviceBytes() {
    return absl::UnimplementedError("this backend keeps its device tier in host memory");
  }
  // True when host code may read and write activation memory in place (the CPU):
  // the forward pass then hands its strategies views instead of copies.
  virtual bool host_addressable() const { return false; }
  // Copies between host memory and activation memory, ordered with the operations
  // before and after; CopyToHost returns once `dst` holds the bytes.
  virtual void CopyToHost(const void* src, void* dst, size_t bytes) = 0;
  virtual void CopyFromHost(const void* src, void* dst, size_t bytes) = 0;
  // dst row i = src row rows[i] for rows of `width` floats; a negative rows[i] leaves
  // dst row i as it is. src and dst do not overlap.
  virtual void GatherRows(const float* src, std::span<const int32_t> rows, int64_t width, float* dst) = 0;
  // Each run of rows [bounds[i], bounds[i + 1]) of x (rows of `width` floats; runs
  // non-empty, bounds ascending) reduced column by column into out: rows 2i and 2i + 1
  // (kMaxMin) or row i (kSum) of `width` floats. What the strategies' scoring reads in
  // place of the rows themselves, so that only the reduction leaves the device.
  virtual void ReduceRowRuns(const float* x, int64_t width, std::span<const int32_t> bounds, RowReduction op,
                             float* out) = 0;

  // y[m, w.rows] = x[m, w.cols] · wᵀ
  virtual void MatMul(const MatrixView& w, const float* x, int64_t m, float* y) = 0;
  // Several products of the same x (matrices of as many columns: a layer's q, k and v),
  // which a backend may run as one.
  virtual void MatMuls(std::span<const MatMulOutput> outs, const float* x, int64_t m) {
    for (const MatMulOutput& o : outs) MatMul(*o.w, x, m, o.y);
  }
  // x[r] = row tokens[r] of `table`, as F32 ([tokens.size(), table.cols]).
  virtual void Embed(const MatrixView& table, std::span<const int32_t> tokens, float* x) = 0;
  // out[r] = x[r] / rms(x[r]) * w for `rows` rows of n.
  virtual void RmsNorm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps) = 0;
  // The residual add and the next norm: x[r] += delta[r]; out[r] = RmsNorm(x[r]) * w.
  virtual void AddRmsNorm(const float* delta, float* x, const float* w, float* out, int64_t rows, int64_t n,
                          float eps) = 0;
  // y[r] += x[r] for `rows` rows of n.
  virtual void Add(const float* x, float* y, int64_t rows, int64_t n) = 0;
  // Adds the biases to q [rows, n_heads*head_dim], k and v [rows, n_kv_heads*head_dim]
  // and rotates q and k by the rows' positions.
  virtual void BiasRope(const RopeParams& rope, std::span<const int32_t> positions, const QkvBias& bias, float* q,
                        float* k, float* v, int n_heads, int n_kv_heads, int head_dim) = 0;
  // gate[r] = silu(gate[r]) * up[r] for `rows` rows of n.
  virtual void SiluMul(float* gate, const float* up, int64_t rows, int64_t n) = 0;
  // Causal attention of one sequence's query rows over its selected cached rows.
  virtual void Attention(const AttentionShape& shape, const KvRows& kv, const AttentionArgs& args) = 0;
  // Several sequences' attentions (a decode batch's), which a backend may run as one.
  virtual void Attentions(const AttentionShape& shape, std::span<const AttentionCall> calls) {
    for (const AttentionCall& c : calls) Attention(shape, c.kv, c.args);
  }
  // The merge of a proximal and a distant attention part (PositionWindow), for n rows of `heads`
  // heads of `hd` values: o_p = g o_p + (1 - g) o_d with g = ProximalGate(lse_p, lse_d)
  // of the row and head (kernels/shared_math.h; rows p_stride / d_stride apart, the
  // log-sum-exps [n, heads] lse_stride apart).
  virtual void MergeByGate(int64_t n, int heads, int hd, float* o_p, int64_t p_stride, const float* o_d,
                           int64_t d_stride, const float* lse_p, const float* lse_d, int64_t lse_stride) = 0;
  // Whether StoreKv and Attention take a KV cache of `dtype`: F32, F16 and BF16
  // everywhere; Q8_0 (blocks of 32 int8 values and an fp16 scale) on the CPU.
  virtual bool StoresKv(DType dtype) const {
    return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
  }
  // Writes n rows of K and V ([n, kv_dim] F32) into cache rows of `dtype`: row i to
  // k_dst[i] and v_dst[i].
  virtual void StoreKv(DType dtype, int64_t kv_dim, int64_t n, const float* k, const float* v, uint8_t* const* k_dst,
                       uint8_t* const* v_dst) = 0;
  // The first error since the last call (devices that run asynchronously report
  // failures here); always OK on the CPU.
  virtual absl::Status Synchronize() = 0;
};

struct CpuBackendOptions {
  // Products with quantised weights quantise the activations to int8 blocks
  // (llama.cpp's numerics; the packed int8 kernels). false: F32 activations, exact
  // products of the quantised weights, slower (`--activations f32`); models with outlier
  // activations (SmolLM2) stay equal to their F32-dequantised selves.
  bool int8_activations = true;
};

// `--activations int8|f32` as CpuBackendOptions::int8_activations.
absl::StatusOr<bool> ParseActivations(std::string_view name);

// The CPU kernels' instruction level, chosen once from the CPU's features
// (kernels/cpu/cpu_isa.h). `--cpu-isa` caps it: scalar | avx2 | avx512 | avx512_bf16 (a
// level this CPU lacks is an error). CpuKernelLevel is the active level's name;
// DescribeCpuKernels says it with the CPU's best and its features, for logs and --help.
absl::Status CapCpuKernels(std::string_view level);
std::string CpuKernelLevel();
std::string DescribeCpuKernels();

// The backend for `--device`: "cpu", "cuda" (an error when this machine or build has
// no usable CUDA device, or the CUDA backend is incomplete) or "auto" (cuda when
// usable, else cpu). *note says what was chosen and why (for the start-up log).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view device, ThreadPool& pool,
                                                       const CpuBackendOptions& cpu, std::string* note);

}  // namespace ps
