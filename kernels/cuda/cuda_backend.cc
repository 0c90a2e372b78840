#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fp16.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/weight_mirrors.h"

namespace ps::cuda {
namespace {

// Device memory that grows on demand (contents are not kept when it grows).
class Scratch {
 public:
  absl::StatusOr<uint8_t*> Get(size_t bytes) {
    if (bytes > capacity_) {
      absl::StatusOr<MemoryRegion> r = AllocateDevice(bytes);
      if (!r.ok()) return r.status();
      Release();
      region_ = std::move(*r);
      capacity_ = bytes;
    }
    return region_.base;
  }
  ~Scratch() { Release(); }

 private:
  void Release() {
    if (region_.release) region_.release(region_.base);
    region_ = {};
  }
  MemoryRegion region_;
  size_t capacity_ = 0;
};

// Whether each of the n block pointers (null for a dropped block) is 16-byte aligned.
bool Aligned16(const void* const* blocks, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (reinterpret_cast<uintptr_t>(blocks[i]) % 16 != 0) return false;
  }
  return true;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(WeightRowDecoder decode) : decode_(decode) {}
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string_view name() const override { return "cuda"; }
  absl::StatusOr<MemoryRegion> AllocateTier(bool device_tier, size_t bytes) override {
    return device_tier ? AllocateDevice(bytes) : AllocatePinned(bytes);
  }
  absl::StatusOr<MemoryRegion> AllocateActivations(size_t bytes) override { return AllocateDevice(bytes); }
  void CopyToHost(const void* src, void* dst, size_t bytes) override { Keep(Copy(dst, src, bytes)); }
  void CopyFromHost(const void* src, void* dst, size_t bytes) override { Keep(Copy(dst, src, bytes)); }
  void GatherRows(const float* src, std::span<const int32_t> rows, int64_t width, float* dst) override {
    const auto* d_rows = Stage(index_, rows.data(), rows.size_bytes());
    if (d_rows != nullptr) {
      Keep(GatherRowsDevice(src, reinterpret_cast<const int32_t*>(d_rows), static_cast<int64_t>(rows.size()), width,
                            dst));
    }
  }

  void ReduceRowRuns(const float* x, int64_t width, std::span<const int32_t> bounds, RowReduction op,
                     float* out) override {
    const auto* d_bounds = Stage(index_, bounds.data(), bounds.size_bytes());
    if (d_bounds != nullptr) {
      Keep(ReduceRowRunsDevice(x, width, reinterpret_cast<const int32_t*>(d_bounds),
                               static_cast<int64_t>(bounds.size()) - 1, op == RowReduction::kMaxMin, out));
    }
  }

  void PrepareWeights(const MatrixView& w) override {
    if (w.type == DType::kF32) {
      Mirror(reinterpret_cast<const float*>(w.data), w.rows * w.cols);
    } else {
      MirrorBf16(w);
    }
  }
  void UseWeightsOf(uint64_t model_id) override { mirrors_.UseModel(model_id); }
  absl::StatusOr<int64_t> FreeDeviceBytes() override { return cuda::FreeDeviceBytes(); }

  void MatMul(const MatrixView& w, const float* x, int64_t m, float* y) override {
    const int rows = static_cast<int>(w.rows), cols = static_cast<int>(w.cols);
    if (w.type == DType::kF32) {
      if (const float* dw = Mirror(reinterpret_cast<const float*>(w.data), w.rows * w.cols); dw != nullptr) {
        Keep(GemmDevice(x, dw, y, static_cast<int>(m), rows, cols));
      }
      return;
    }
    const uint16_t* dw = MirrorBf16(w);
    absl::StatusOr<uint8_t*> x16 = bf16_.Get(static_cast<size_t>(m) * cols * sizeof(uint16_t));
    if (dw == nullptr || !x16.ok()) return Keep(x16.status());
    auto* xb = reinterpret_cast<uint16_t*>(*x16);
    Keep(ToBf16Device(x, xb, m * w.cols));
    Keep(GemmBf16Device(xb, dw, y, static_cast<int>(m), rows, cols));
  }
  void Embed(const MatrixView& table, std::span<const int32_t> tokens, float* x) override {
    const bool bf16 = table.type != DType::kF32;
    const void* dt = bf16 ? static_cast<const void*>(MirrorBf16(table))
                          : Mirror(reinterpret_cast<const float*>(table.data), table.rows * table.cols);
    const auto* d_tokens = Stage(index_, tokens.data(), tokens.size_bytes());
    if (dt == nullptr || d_tokens == nullptr) return;
    Keep(EmbedDevice(dt, bf16, reinterpret_cast<const int32_t*>(d_tokens), static_cast<int64_t>(tokens.size()),
                     table.cols, x));
  }
  void RmsNorm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps) override {
    if (const float* dw = Mirror(w, n); dw != nullptr) Keep(RmsNormDevice(x, dw, out, rows, n, eps));
  }
  void AddRmsNorm(const float* delta, float* x, const float* w, float* out, int64_t rows, int64_t n,
                  float eps) override {
    if (const float* dw = Mirror(w, n); dw != nullptr) Keep(AddRmsNormDevice(delta, x, dw, out, rows, n, eps));
  }
  void Add(const float* x, float* y, int64_t rows, int64_t n) override { Keep(AddDevice(x, y, rows * n)); }
  void BiasRope(const RopeParams& rope, std::span<const int32_t> positions, const QkvBias& bias, float* q, float* k,
                float* v, int n_heads, int n_kv_heads, int head_dim) override {
    const int qd = n_heads * head_dim, kvd = n_kv_heads * head_dim;
    RopeDevice r{.n_dims = rope.n_dims,
                 .theta_scale = std::pow(rope.freq_base, -2.0f / static_cast<float>(rope.n_dims)),
                 .freq_scale = rope.freq_scale,
                 .neox = rope.neox};
    if (!rope.freq_factors.empty()) {
      r.freq_factors = Mirror(rope.freq_factors.data(), static_cast<int64_t>(rope.freq_factors.size()));
      if (r.freq_factors == nullptr) return;
    }
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr, *bk_shift = nullptr;
    if (bias.q != nullptr) {
      bq = Mirror(bias.q, qd);
      bk = Mirror(bias.k, kvd);
      bv = Mirror(bias.v, kvd);
      if (bq == nullptr || bk == nullptr || bv == nullptr) return;
    }
    if (bias.k_shift != nullptr) {
      bk_shift = Mirror(bias.k_shift, kvd);
      if (bk_shift == nullptr) return;
    }
    const auto* d_pos = Stage(index_, positions.data(), positions.size_bytes());
    if (d_pos == nullptr) return;
    Keep(BiasRopeDevice(r, reinterpret_cast<const int32_t*>(d_pos), static_cast<int64_t>(positions.size()), bq, bk, bv,
                        bk_shift, q, k, v, n_heads, n_kv_heads, head_dim));
  }
  void SiluMul(float* gate, const float* up, int64_t rows, int64_t n) override {
    Keep(SiluMulDevice(gate, up, rows * n));
  }
  void Attention(const AttentionShape& shape, const KvRows& kv, const AttentionArgs& a) override {
    const AttentionCall call{.kv = kv, .args = a};
    Attentions(shape, {&call, 1});
  }
  // Every call's index arrays and arguments go to the device in one staged copy, and the
  // calls run as one launch per kernel.
  void Attentions(const AttentionShape& shape, std::span<const AttentionCall> calls) override {
    if (calls.empty()) return;
    // Host layout of the staged bytes: each call's segments, ranges, query positions, key
    // positions and block tables (offsets in `at`), then the calls' arguments.
    staged_.clear();
    auto put = [&](const void* p, size_t bytes) {
      const size_t offset = staged_.size();
      staged_.resize(offset + (bytes + 7) / 8 * 8);
      if (bytes > 0) std::memcpy(staged_.data() + offset, p, bytes);
      return offset;
    };
    at_.clear();
    for (const AttentionCall& c : calls) {
      const KvRows& kv = c.kv;
      const AttentionArgs& a = c.args;
      // The selection as segments over flat ranges (everything: one segment, one range).
      segments_.clear();
      ranges_.clear();
      if (a.selection == nullptr || a.selection->all()) {
        segments_.push_back({.q_begin = 0, .q_end = static_cast<int32_t>(a.n_q), .kv_head = -1, .range_end = 1});
        ranges_ = {0, static_cast<int32_t>(kv.n)};
      } else {
        for (const KvSelection::Segment& sel : a.selection->segments) {
          const auto first = static_cast<int32_t>(ranges_.size() / 2);
          for (const KvRange& r : sel.ranges) ranges_.insert(ranges_.end(), {r.begin, r.end});
          segments_.push_back({.q_begin = sel.q_begin,
                               .q_end = sel.q_end,
                               .kv_head = sel.kv_head,
                               .range_begin = first,
                               .range_end = static_cast<int32_t>(ranges_.size() / 2)});
        }
      }
      int64_t n_blocks = kv.block_rows > 0 ? (kv.n + kv.block_rows - 1) / kv.block_rows : 0;
      if (kv.head_cols > 0) n_blocks += (shape.n_kv_heads - 1) * kv.head_blocks;  // heads in blocks of their own
      at_.push_back(Offsets{.segments = put(segments_.data(), segments_.size() * sizeof(AttentionSegment)),
                            .ranges = put(ranges_.data(), ranges_.size() * sizeof(int32_t)),
                            .q_pos = put(a.q_pos, static_cast<size_t>(a.n_q) * sizeof(int32_t)),
                            .positions = put(kv.positions, static_cast<size_t>(kv.n) * sizeof(int32_t)),
                            .k_blocks = put(kv.k_blocks, static_cast<size_t>(n_blocks) * sizeof(void*)),
                            .v_blocks = put(kv.v_blocks, static_cast<size_t>(n_blocks) * sizeof(void*)),
                            .n_segments = static_cast<int>(segments_.size()),
                            .n_blocks = n_blocks});
    }
    const size_t args_at = staged_.size();
    staged_.resize(args_at + calls.size() * sizeof(AttentionDeviceArgs));
    absl::StatusOr<uint8_t*> base = attention_scratch_.Get(staged_.size());
    if (!base.ok()) return Keep(base.status());
    // The arguments, with their arrays' device addresses; the last-query statistics'
    // and the splits' scratch in two more regions.
    args_.clear();
    size_t stats_floats = 0;
    int64_t batch_blocks = 0;
    for (size_t i = 0; i < calls.size(); ++i) {
      const KvRows& kv = calls[i].kv;
      const AttentionArgs& a = calls[i].args;
      const Offsets& o = at_[i];
      args_.push_back(AttentionDeviceArgs{
          .n_heads = shape.n_heads,
          .n_kv_heads = shape.n_kv_heads,
          .head_dim = shape.head_dim,
          .scale = shape.scale,
          .q = a.q,
          .q_pos = reinterpret_cast<const int32_t*>(*base + o.q_pos),
          .n_q = a.n_q,
          .q_stride = a.q_stride,
          .out = a.out,
          .out_stride = a.out_stride,
          .k_blocks = reinterpret_cast<const void* const*>(*base + o.k_blocks),
          .v_blocks = reinterpret_cast<const void* const*>(*base + o.v_blocks),
          .block_rows = kv.block_rows,
          .stride = kv.stride,
          .n = kv.n,
          .head_blocks = kv.head_cols > 0 ? kv.head_blocks : 0,
          .positions = reinterpret_cast<const int32_t*>(*base + o.positions),
          .dtype = kv.dtype,
          .rows_aligned16 = Aligned16(kv.k_blocks, o.n_blocks) && Aligned16(kv.v_blocks, o.n_blocks),
          .segments = reinterpret_cast<const AttentionSegment*>(*base + o.segments),
          .n_segments = o.n_segments,
          .ranges = reinterpret_cast<const int32_t*>(*base + o.ranges),
          .window_part = static_cast<int>(a.window.part),
          .sinks = a.window.sinks,
          .recent = a.window.recent,
          .lse = a.lse,
          .lse_stride = a.lse_stride});
      if (a.last_query_probs != nullptr || a.last_query_logits != nullptr) {
        stats_floats += static_cast<size_t>(shape.n_heads) * (kv.n + 2);
      }
      batch_blocks += TiledBlocks(args_.back());
    }
    float* stats = nullptr;
    if (stats_floats > 0) {
      absl::StatusOr<uint8_t*> buf = stats_scratch_.Get(stats_floats * sizeof(float));
      if (!buf.ok()) return Keep(buf.status());
      stats = reinterpret_cast<float*>(*buf);
    }
    size_t split_floats = 0;
    for (size_t i = 0; i < calls.size(); ++i) {
      AttentionDeviceArgs& d = args_[i];
      d.splits = AttentionSplits(d, batch_blocks, MultiprocessorCount());
      if (d.splits > 1) split_floats += static_cast<size_t>(d.splits) * d.n_q * shape.n_heads * (shape.head_dim + 2);
      const AttentionArgs& a = calls[i].args;
      if (a.last_query_probs != nullptr || a.last_query_logits != nullptr) {
        d.last_logits = stats;
        d.last_norm = d.last_logits + static_cast<int64_t>(shape.n_heads) * d.n;
        stats = d.last_norm + 2 * shape.n_heads;
        Keep(FillDevice(d.last_logits, shape.n_heads * d.n, -INFINITY));
        Keep(FillDevice(d.last_norm, 2 * shape.n_heads, 0.0f));
      }
    }
    if (split_floats > 0) {
      absl::StatusOr<uint8_t*> buf = split_scratch_.Get(split_floats * sizeof(float));
      if (!buf.ok()) return Keep(buf.status());
      auto* split_out = reinterpret_cast<float*>(*buf);
      for (AttentionDeviceArgs& d : args_) {
        if (d.splits == 1) continue;
        d.split_out = split_out;
        split_out += static_cast<size_t>(d.splits) * d.n_q * shape.n_heads * (shape.head_dim + 2);
      }
    }
    // The tiled kernel's calls first.
    sorted_.clear();
    for (int tiled = 1; tiled >= 0; --tiled) {
      for (const AttentionDeviceArgs& d : args_) {
        if (TiledApplies(d) == (tiled == 1)) sorted_.push_back(d);
      }
    }
    std::memcpy(staged_.data() + args_at, sorted_.data(), sorted_.size() * sizeof(AttentionDeviceArgs));
    const uint8_t* d_staged = Stage(attention_scratch_, staged_.data(), staged_.size());
    if (d_staged == nullptr) return;
    PS_CHECK(d_staged == *base) << "attention scratch moved";
    Keep(AttentionDevice(sorted_.data(), reinterpret_cast<const AttentionDeviceArgs*>(d_staged + args_at),
                         static_cast<int>(sorted_.size())));
    for (size_t i = 0; i < calls.size(); ++i) {
      const AttentionArgs& a = calls[i].args;
      const AttentionDeviceArgs& d = args_[i];
      if (d.last_logits == nullptr) continue;
      Keep(LastQueryStatsDevice(d.last_logits, d.last_norm, shape.n_heads, d.n, a.last_query_probs,
                                a.last_query_logits));
    }
  }
  void MergeByGate(int64_t n, int heads, int hd, float* o_p, int64_t p_stride, const float* o_d, int64_t d_stride,
                   const float* lse_p, const float* lse_d, int64_t lse_stride) override {
    Keep(MergeByGateDevice(n, heads, hd, o_p, p_stride, o_d, d_stride, lse_p, lse_d, lse_stride));
  }
  void StoreKv(DType dtype, int64_t kv_dim, int64_t n, const float* k, const float* v, uint8_t* const* k_dst,
               uint8_t* const* v_dst) override {
    // Both pointer arrays in one upload: k's then v's.
    pointers_.assign(k_dst, k_dst + n);
    pointers_.insert(pointers_.end(), v_dst, v_dst + n);
    const auto* d = Stage(index_, pointers_.data(), pointers_.size() * sizeof(uint8_t*));
    if (d == nullptr) return;
    auto* const* d_ptrs = reinterpret_cast<uint8_t* const*>(d);
    Keep(StoreKvDevice(dtype, kv_dim, n, k, v, d_ptrs, d_ptrs + n));
  }
  absl::Status Synchronize() override {
    Keep(cuda::Synchronize());
    absl::Status s = std::move(error_);
    error_ = absl::OkStatus();
    return s;
  }

 private:
  void Keep(const absl::Status& s) { error_.Update(s); }
  // The device copy of n floats of host weights (uploaded on first use: weights never
  // change), or null with the error kept.
  const float* Mirror(const float* host, int64_t n) {
    if (uint8_t* copy = mirrors_.Find(host, n, kF32Copy); copy != nullptr) return reinterpret_cast<const float*>(copy);
    absl::StatusOr<MemoryRegion> r = AllocateDevice(static_cast<size_t>(n) * sizeof(float));
    if (!r.ok()) {
      Keep(r.status());
      return nullptr;
    }
    if (absl::Status s = Copy(r->base, host, static_cast<size_t>(n) * sizeof(float)); !s.ok()) {
      r->release(r->base);
      Keep(s);
      return nullptr;
    }
    return reinterpret_cast<const float*>(mirrors_.Add(host, n, kF32Copy, std::move(*r)));
  }
  // The BF16 device copy of a weight matrix of another type, decoded row by row on
  // the host (first use only), or null with the error kept.
  const uint16_t* MirrorBf16(const MatrixView& w) {
    if (uint8_t* copy = mirrors_.Find(w.data, w.rows * w.cols, kBf16Copy); copy != nullptr) {
      return reinterpret_cast<const uint16_t*>(copy);
    }
    absl::StatusOr<MemoryRegion> r = AllocateDevice(static_cast<size_t>(w.rows * w.cols) * sizeof(uint16_t));
    if (!r.ok()) {
      Keep(r.status());
      return nullptr;
    }
    constexpr int64_t kChunkRows = 256;
    std::vector<float> row(static_cast<size_t>(w.cols));
    std::vector<uint16_t> chunk;
    for (int64_t r0 = 0; r0 < w.rows; r0 += kChunkRows) {
      const int64_t r1 = std::min(w.rows, r0 + kChunkRows);
      chunk.resize(static_cast<size_t>((r1 - r0) * w.cols));
      for (int64_t i = r0; i < r1; ++i) {
        decode_(w, i, row.data());
        for (int64_t c = 0; c < w.cols; ++c) chunk[(i - r0) * w.cols + c] = Fp32ToBf16(row[c]);
      }
      if (absl::Status s = Copy(r->base + r0 * w.cols * sizeof(uint16_t), chunk.data(), chunk.size() * 2); !s.ok()) {
        r->release(r->base);
        Keep(s);
        return nullptr;
      }
    }
    return reinterpret_cast<const uint16_t*>(mirrors_.Add(w.data, w.rows * w.cols, kBf16Copy, std::move(*r)));
  }
  // Host index data copied into `scratch` for the next kernel, or null with the error
  // kept. The copy is ordered with the kernels (the next Stage into the same scratch
  // lands after this one's readers) and the host need not wait for it.
  const uint8_t* Stage(Scratch& scratch, const void* host, size_t bytes) {
    absl::StatusOr<uint8_t*> d = scratch.Get(bytes > 0 ? bytes : 1);
    if (!d.ok()) {
      Keep(d.status());
      return nullptr;
    }
    if (absl::Status s = staging_.CopyToDevice(*d, host, bytes); !s.ok()) {
      Keep(s);
      return nullptr;
    }
    return *d;
  }

  WeightRowDecoder decode_;
  absl::Status error_;
  // Device copies of the current model's weights: F32 as they are, or decoded to BF16.
  static constexpr int kF32Copy = 0, kBf16Copy = 1;
  WeightMirrors mirrors_;
  StagingRing staging_;
  Scratch index_, bf16_;
  // Attention's staged arguments (built on the host, then one copy) and statistics.
  std::vector<AttentionSegment> segments_;
  std::vector<int32_t> ranges_;
  std::vector<uint8_t> staged_;
  struct Offsets {  // of a call's arrays in staged_
    size_t segments, ranges, q_pos, positions, k_blocks, v_blocks;
    int n_segments;
    int64_t n_blocks;
  };
  std::vector<AttentionDeviceArgs> args_, sorted_;  // in the calls' order; the tiled kernel's first
  std::vector<Offsets> at_;
  Scratch attention_scratch_, stats_scratch_, split_scratch_;
  std::vector<uint8_t*> pointers_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(WeightRowDecoder decode) {
  if (decode == nullptr) return absl::InvalidArgumentError("the CUDA backend needs a weight decoder");
  if (absl::Status s = DeviceAvailable(); !s.ok()) return s;
  return std::unique_ptr<Backend>(new CudaBackend(decode));
}

}  // namespace ps::cuda

extern "C" ps::Backend* ps_cuda_create_backend(char* error, size_t error_size, ps::WeightRowDecoder decode) {
  absl::StatusOr<std::unique_ptr<ps::Backend>> b = ps::cuda::CreateCudaBackend(decode);
  if (b.ok()) return b->release();
  std::snprintf(error, error_size, "%s", std::string(b.status().message()).c_str());
  return nullptr;
}
