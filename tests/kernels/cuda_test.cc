// CUDA kernels against the CPU kernels, by relative error (the backends' operations
// on the same random inputs, awkward sizes; the CUDA swap engine:
// tests/memory/cuda_swap_engine_test.cc). Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fp16.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/activations.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/vec.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/kernels/random.h"

namespace ps {
namespace {

using testing::Randn;

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaTest, GemmMatchesCpu) {
  const int m = 17, n = 300, k = 576;
  auto x = Randn(m * k, 1), w = Randn(n * k, 2);
  std::vector<float> gpu(m * n), cpu(m * n);
  ASSERT_TRUE(cuda::Gemm(x.data(), w.data(), gpu.data(), m, n, k).ok());
  ThreadPool pool(2);
  MatMul(MatrixView{.type = DType::kF32, .data = reinterpret_cast<const uint8_t*>(w.data()), .rows = n, .cols = k},
         x.data(), m, cpu.data(), pool);
  for (int i = 0; i < m * n; ++i) EXPECT_NEAR(gpu[i], cpu[i], 1e-3f * (1 + std::fabs(cpu[i])));
}

TEST_F(CudaTest, RmsNormAndSiluMatchCpu) {
  const int rows = 5, n = 576;
  auto x = Randn(rows * n, 3), w = Randn(n, 4);
  std::vector<float> gpu(rows * n), cpu(rows * n);
  ASSERT_TRUE(cuda::RmsNorm(x.data(), w.data(), gpu.data(), rows, n, 1e-5f).ok());
  for (int r = 0; r < rows; ++r) RmsNorm(x.data() + r * n, w.data(), cpu.data() + r * n, n, 1e-5f);
  for (int i = 0; i < rows * n; ++i) EXPECT_NEAR(gpu[i], cpu[i], 1e-4f * (1 + std::fabs(cpu[i])));
  auto g1 = Randn(4097, 5), up = Randn(4097, 6);
  auto g2 = g1;
  ASSERT_TRUE(cuda::SiluMul(g1.data(), up.data(), 4097).ok());
  SiluMul(g2.data(), up.data(), 4097);
  for (int i = 0; i < 4097; ++i) EXPECT_NEAR(g1[i], g2[i], 1e-5f * (1 + std::fabs(g2[i])));
}

// K and V of n rows of kvd random values (seeds 24 and 25) in blocks of 16 rows, as
// `dtype`: in host memory for the CPU and in a device tier for the GPU.
class PagedKv {
 public:
  static constexpr int64_t kBlockRows = 16;
  PagedKv(Backend& gpu, DType dtype, int64_t n, int64_t kvd) : dtype_(dtype), n_(n), kvd_(kvd) {
    const int64_t n_blocks = (n + kBlockRows - 1) / kBlockRows;
    const auto k = Randn(n_blocks * kBlockRows * kvd, 24), v = Randn(n_blocks * kBlockRows * kvd, 25);
    const size_t elem = dtype == DType::kF32 ? 4 : 2;
    k_host_.resize(k.size() * elem);
    v_host_.resize(v.size() * elem);
    for (size_t i = 0; i < k.size(); ++i) {
      Put(k_host_.data(), i, k[i]);
      Put(v_host_.data(), i, v[i]);
    }
    auto tier = gpu.AllocateTier(true, 2 * k_host_.size());
    EXPECT_TRUE(tier.ok()) << tier.status();
    if (!tier.ok()) return;
    tier_ = std::move(*tier);
    gpu.CopyFromHost(k_host_.data(), tier_.base, k_host_.size());
    gpu.CopyFromHost(v_host_.data(), tier_.base + k_host_.size(), v_host_.size());
    for (int64_t b = 0; b < n_blocks; ++b) {
      const int64_t at = b * kBlockRows * kvd * static_cast<int64_t>(elem);
      k_cpu_.push_back(k_host_.data() + at);
      v_cpu_.push_back(v_host_.data() + at);
      k_gpu_.push_back(tier_.base + at);
      v_gpu_.push_back(tier_.base + k_host_.size() + at);
    }
  }
  ~PagedKv() {
    if (tier_.release) tier_.release(tier_.base);
  }
  bool ok() const { return tier_.base != nullptr; }
  KvRows View(bool on_gpu, const std::vector<int32_t>& positions) const {
    return KvRows{.k_blocks = on_gpu ? k_gpu_.data() : k_cpu_.data(),
                  .v_blocks = on_gpu ? v_gpu_.data() : v_cpu_.data(),
                  .block_rows = kBlockRows,
                  .positions = positions.data(),
                  .n = n_,
                  .stride = kvd_,
                  .positions_ascending = true,
                  .dtype = dtype_};
  }
  // Drops the GPU's copy of K block b (a null pointer, as PoD leaves it).
  void DropGpuKeyBlock(int64_t b) { k_gpu_[b] = nullptr; }

 private:
  void Put(uint8_t* base, size_t i, float x) const {
    if (dtype_ == DType::kF32) {
      reinterpret_cast<float*>(base)[i] = x;
    } else {
      reinterpret_cast<uint16_t*>(base)[i] = dtype_ == DType::kF16 ? Fp32ToFp16(x) : Fp32ToBf16(x);
    }
  }
  DType dtype_;
  int64_t n_, kvd_;
  std::vector<uint8_t> k_host_, v_host_;
  MemoryRegion tier_;
  std::vector<const void*> k_cpu_, v_cpu_, k_gpu_, v_gpu_;
};

// The tolerance of the GPU's attention: F32 KV runs in F32; 16-bit KV runs on the
// tensor cores with the queries and probabilities rounded to the KV's type.
float AttentionTolerance(DType t) { return t == DType::kF32 ? 1e-4f : t == DType::kF16 ? 4e-3f : 3e-2f; }

// The CUDA backend next to the CPU backend: device copies of host data in, host
// copies out.
class CudaBackendTest : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    auto b = cuda::CreateCudaBackend(
        [](const MatrixView& w, int64_t row, float* out) { DequantizeRow(w.type, w.Row(row), out, w.cols); });
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
  }
  float* Device(const std::vector<float>& host) {
    buffers_.push_back(std::make_unique<Activations>());
    EXPECT_TRUE(buffers_.back()->Reserve(*gpu_, static_cast<int64_t>(host.size()) + 1).ok());
    gpu_->CopyFromHost(host.data(), buffers_.back()->data(), host.size() * sizeof(float));
    return buffers_.back()->data();
  }
  std::vector<float> FromDevice(const float* d, size_t n) {
    std::vector<float> h(n);
    gpu_->CopyToHost(d, h.data(), n * sizeof(float));
    EXPECT_TRUE(gpu_->Synchronize().ok());
    return h;
  }
  static void ExpectNear(const std::vector<float>& gpu, const std::vector<float>& cpu, float rel,
                         const std::string& what) {
    ASSERT_EQ(gpu.size(), cpu.size()) << what;
    for (size_t i = 0; i < cpu.size(); ++i) {
      ASSERT_NEAR(gpu[i], cpu[i], rel * (1 + std::fabs(cpu[i]))) << what << " at " << i;
    }
  }

  // Attention of queries q over kv on both backends, from `base` (its query, output and
  // statistics pointers set here): the outputs and log-sum-exps, and the last row's
  // probabilities and logits where asked for, within `tol` of the CPU's.
  // Returns the GPU's largest difference from the CPU's outputs.
  float CompareAttention(const AttentionShape& shape, const PagedKv& kv, const std::vector<int32_t>& positions,
                         const AttentionArgs& base, const std::vector<float>& q, bool probs, bool logits, float tol,
                         const std::string& what) {
    const int64_t n = kv.View(false, positions).n;
    std::vector<float> out(base.n_q * base.out_stride), lse(base.n_q * base.lse_stride), p(n), l(n);
    AttentionArgs on_gpu = base, on_cpu = base;
    on_gpu.q = Device(q);
    on_gpu.out = Device(out);
    on_gpu.lse = Device(lse);
    on_gpu.last_query_probs = probs ? Device(p) : nullptr;
    on_gpu.last_query_logits = logits ? Device(l) : nullptr;
    on_cpu.q = q.data();
    on_cpu.out = out.data();
    on_cpu.lse = lse.data();
    on_cpu.last_query_probs = probs ? p.data() : nullptr;
    on_cpu.last_query_logits = logits ? l.data() : nullptr;
    gpu_->Attention(shape, kv.View(true, positions), on_gpu);
    cpu_.Attention(shape, kv.View(false, positions), on_cpu);
    const std::vector<float> gpu_out = FromDevice(on_gpu.out, out.size());
    ExpectNear(gpu_out, out, tol, "out " + what);
    ExpectNear(FromDevice(on_gpu.lse, lse.size()), lse, tol / 10, "lse " + what);
    if (probs) ExpectNear(FromDevice(on_gpu.last_query_probs, p.size()), p, tol / 10, "probs " + what);
    if (logits) ExpectLogitsNear(FromDevice(on_gpu.last_query_logits, l.size()), l, tol, "logits " + what);
    return MaxDifference(gpu_out, out);
  }
  static float MaxDifference(const std::vector<float>& a, const std::vector<float>& b) {
    float worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
    return worst;
  }
  // The CPU's attention outputs of `base`'s queries over `selection` (null: every key).
  std::vector<float> CpuOutput(const AttentionShape& shape, const PagedKv& kv, const std::vector<int32_t>& positions,
                               const AttentionArgs& base, const std::vector<float>& q, const KvSelection* selection) {
    std::vector<float> out(base.n_q * base.out_stride), lse(base.n_q * base.lse_stride);
    AttentionArgs args = base;
    args.q = q.data();
    args.out = out.data();
    args.lse = lse.data();
    args.selection = selection;
    cpu_.Attention(shape, kv.View(false, positions), args);
    return out;
  }
  // Summed last-row logits: -inf where the CPU's are (masked keys), else near.
  static void ExpectLogitsNear(const std::vector<float>& gpu, const std::vector<float>& cpu, float rel,
                               const std::string& what) {
    ASSERT_EQ(gpu.size(), cpu.size()) << what;
    for (size_t j = 0; j < cpu.size(); ++j) {
      if (std::isinf(cpu[j])) {
        ASSERT_TRUE(std::isinf(gpu[j]) && gpu[j] < 0) << what << " at " << j << ": " << gpu[j];
      } else {
        ASSERT_NEAR(gpu[j], cpu[j], rel * (1 + std::fabs(cpu[j]))) << what << " at " << j;
      }
    }
  }

  ThreadPool pool_{2};
  CpuBackend cpu_{pool_};
  std::unique_ptr<Backend> gpu_;
  std::vector<std::unique_ptr<Activations>> buffers_;
};

TEST_F(CudaBackendTest, ElementwiseOperationsMatchCpu) {
  for (const int rows : {1, 17}) {
    for (const int n : {1, 17, 4097}) {
      const std::string what = std::to_string(rows) + "x" + std::to_string(n);
      const size_t size = static_cast<size_t>(rows) * n;
      auto x = Randn(size, 1), delta = Randn(size, 2), w = Randn(n, 3);
      std::vector<float> out(size), x_cpu = x;
      float* dx = Device(x);
      float* dout = Device(out);
      gpu_->RmsNorm(dx, w.data(), dout, rows, n, 1e-5f);
      cpu_.RmsNorm(x.data(), w.data(), out.data(), rows, n, 1e-5f);
      ExpectNear(FromDevice(dout, size), out, 1e-5f, "rms_norm " + what);

      gpu_->AddRmsNorm(Device(delta), dx, w.data(), dout, rows, n, 1e-5f);
      cpu_.AddRmsNorm(delta.data(), x_cpu.data(), w.data(), out.data(), rows, n, 1e-5f);
      ExpectNear(FromDevice(dx, size), x_cpu, 1e-6f, "add_rms_norm (sum) " + what);
      ExpectNear(FromDevice(dout, size), out, 1e-5f, "add_rms_norm " + what);

      gpu_->Add(Device(delta), dx, rows, n);
      cpu_.Add(delta.data(), x_cpu.data(), rows, n);
      ExpectNear(FromDevice(dx, size), x_cpu, 1e-6f, "add " + what);

      auto gate = Randn(size, 4), up = Randn(size, 5);
      float* dgate = Device(gate);
      gpu_->SiluMul(dgate, Device(up), rows, n);
      cpu_.SiluMul(gate.data(), up.data(), rows, n);
      ExpectNear(FromDevice(dgate, size), gate, 1e-5f, "silu_mul " + what);
    }
  }
}

TEST_F(CudaBackendTest, GatherRowsAndMergeByGateMatchCpu) {
  const int width = 17;
  const auto src = Randn(40 * width, 6);
  const std::vector<int32_t> rows = {39, -1, 0, 7, 7, -1, 38};
  std::vector<float> dst = Randn(rows.size() * width, 7);
  float* ddst = Device(dst);
  gpu_->GatherRows(Device(src), rows, width, ddst);
  cpu_.GatherRows(src.data(), rows, width, dst.data());
  ExpectNear(FromDevice(ddst, dst.size()), dst, 0, "gather_rows");

  // 17 rows of 2 heads of 64, the log-sum-exps 3 apart with -inf (no distant keys) among them.
  const int n = 17, heads = 2, hd = 64;
  auto o_p = Randn(n * heads * hd, 8), o_d = Randn(n * heads * hd, 9);
  auto lse_p = Randn(n * 3, 10), lse_d = Randn(n * 3, 11);
  lse_d[4] = -std::numeric_limits<float>::infinity();
  float* dp = Device(o_p);
  gpu_->MergeByGate(n, heads, hd, dp, heads * hd, Device(o_d), heads * hd, Device(lse_p), Device(lse_d), 3);
  cpu_.MergeByGate(n, heads, hd, o_p.data(), heads * hd, o_d.data(), heads * hd, lse_p.data(), lse_d.data(), 3);
  ExpectNear(FromDevice(dp, o_p.size()), o_p, 1e-6f, "merge_by_gate");
}

TEST_F(CudaBackendTest, ReduceRowRunsMatchesCpu) {
  // 300 columns (two column tiles), runs of 1, 5, 32 and 500 rows.
  const int width = 300;
  const std::vector<int32_t> bounds = {3, 4, 9, 41, 541};
  const auto src = Randn(545 * width, 12);
  for (const RowReduction op : {RowReduction::kMaxMin, RowReduction::kSum}) {
    const size_t floats = (bounds.size() - 1) * width * (op == RowReduction::kMaxMin ? 2 : 1);
    std::vector<float> want(floats);
    float* got = Device(std::vector<float>(floats, 0.0f));
    gpu_->ReduceRowRuns(Device(src), width, bounds, op, got);
    cpu_.ReduceRowRuns(src.data(), width, bounds, op, want.data());
    ExpectNear(FromDevice(got, floats), want, op == RowReduction::kSum ? 1e-4f : 0, "reduce_row_runs");
  }
}

TEST_F(CudaBackendTest, BiasRopeMatchesCpu) {
  const std::vector<int32_t> positions = {0, 1, 5, 4096, 32767};
  const int rows = static_cast<int>(positions.size());
  struct Case {
    int n_heads, n_kv_heads, head_dim, n_dims;
    bool neox, bias, factors;
    float freq_scale;
  };
  for (const Case& c : {Case{4, 2, 64, 64, false, false, false, 1.0f}, Case{4, 2, 64, 64, true, true, false, 1.0f},
                        Case{6, 2, 128, 64, true, false, true, 0.25f}, Case{3, 1, 48, 48, false, true, true, 1.0f}}) {
    const std::string what = std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + " heads of " +
                             std::to_string(c.head_dim) + (c.neox ? " neox" : "") + (c.bias ? " bias" : "") +
                             (c.factors ? " factors" : "");
    RopeParams rope{.n_dims = c.n_dims, .freq_base = 500000.0f, .freq_scale = c.freq_scale, .neox = c.neox};
    if (c.factors) {
      for (int i = 0; i < c.n_dims / 2; ++i) rope.freq_factors.push_back(1.0f + static_cast<float>(i % 5));
    }
    const int qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
    auto q = Randn(rows * qd, 12), k = Randn(rows * kvd, 13), v = Randn(rows * kvd, 14);
    const auto bq = Randn(qd, 15), bk = Randn(kvd, 16), bv = Randn(kvd, 17), shift = Randn(kvd, 20);
    const QkvBias bias =
        c.bias ? QkvBias{.q = bq.data(), .k = bk.data(), .v = bv.data(), .k_shift = shift.data()} : QkvBias{};
    float *dq = Device(q), *dk = Device(k), *dv = Device(v);
    gpu_->BiasRope(rope, positions, bias, dq, dk, dv, c.n_heads, c.n_kv_heads, c.head_dim);
    cpu_.BiasRope(rope, positions, bias, q.data(), k.data(), v.data(), c.n_heads, c.n_kv_heads, c.head_dim);
    // Angles up to 32767 rad: sin/cos of the same float angle, within a few ulp of it.
    ExpectNear(FromDevice(dq, q.size()), q, 2e-4f, "q " + what);
    ExpectNear(FromDevice(dk, k.size()), k, 2e-4f, "k " + what);
    ExpectNear(FromDevice(dv, v.size()), v, 1e-6f, "v " + what);
  }
}

TEST_F(CudaBackendTest, StoreKvWritesTheCpuBytes) {
  const int64_t kv_dim = 17 * 8, n = 17;
  const auto k = Randn(n * kv_dim, 18), v = Randn(n * kv_dim, 19);
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const size_t row_bytes = kv_dim * (dtype == DType::kF32 ? 4 : 2);
    auto tier = gpu_->AllocateTier(true, 2 * n * row_bytes);
    ASSERT_TRUE(tier.ok()) << tier.status();
    std::vector<uint8_t> host(2 * n * row_bytes);
    std::vector<uint8_t*> k_dev, v_dev, k_host, v_host;
    for (int64_t i = 0; i < n; ++i) {  // rows in reverse order, k's and v's interleaved
      const size_t at = (n - 1 - i) * 2 * row_bytes;
      k_dev.push_back(tier->base + at);
      v_dev.push_back(tier->base + at + row_bytes);
      k_host.push_back(host.data() + at);
      v_host.push_back(host.data() + at + row_bytes);
    }
    gpu_->StoreKv(dtype, kv_dim, n, Device(k), Device(v), k_dev.data(), v_dev.data());
    cpu_.StoreKv(dtype, kv_dim, n, k.data(), v.data(), k_host.data(), v_host.data());
    std::vector<uint8_t> got(host.size());
    gpu_->CopyToHost(tier->base, got.data(), got.size());
    ASSERT_TRUE(gpu_->Synchronize().ok());
    EXPECT_EQ(got, host) << "dtype " << static_cast<int>(dtype);
    tier->release(tier->base);
  }
}

TEST_F(CudaBackendTest, F32MatMulMatchesCpuAndErrorsFailTheStep) {
  const int m = 17, n = 300, k = 576;
  auto x = Randn(m * k, 20), w = Randn(n * k, 21);
  const MatrixView view{.type = DType::kF32, .data = reinterpret_cast<const uint8_t*>(w.data()), .rows = n, .cols = k};
  std::vector<float> y(m * n);
  float* dy = Device(y);
  gpu_->MatMul(view, Device(x), m, dy);
  cpu_.MatMul(view, x.data(), m, y.data());
  ExpectNear(FromDevice(dy, y.size()), y, 1e-3f, "matmul");
  const std::vector<int32_t> pos = {0};
  gpu_->Attention(AttentionShape{.n_heads = 1, .n_kv_heads = 1, .head_dim = 512, .scale = 1},
                  KvRows{.block_rows = 1, .stride = 512},
                  AttentionArgs{.q = dy, .q_pos = pos.data(), .n_q = 1, .q_stride = 512, .out = dy, .out_stride = 512});
  EXPECT_EQ(gpu_->Synchronize().code(), absl::StatusCode::kInvalidArgument) << "a head too wide fails the step";
  EXPECT_TRUE(gpu_->Synchronize().ok()) << "and the error is reported once";
}

// Attention over paged KV (F32, F16, BF16) against the CPU kernel: everything, a
// selection per KV head, PoD's proximal and distant windows with their log-sum-exps,
// and the last query row's statistics.
TEST_F(CudaBackendTest, AttentionMatchesCpu) {
  const AttentionShape shape{.n_heads = 4, .n_kv_heads = 2, .head_dim = 64, .scale = 0.125f};
  const int64_t kvd = 128, n = 97, n_q = 17;
  std::vector<int32_t> positions(n), q_pos(n_q);
  for (int64_t j = 0; j < n; ++j) positions[j] = static_cast<int32_t>(j);
  for (int64_t i = 0; i < n_q; ++i) q_pos[i] = static_cast<int32_t>(n - n_q + i);
  const auto q = Randn(n_q * 256, 26);
  KvSelection per_head;  // KV head 0: rows 0-9 and 40-96; head 1: rows 20-96
  per_head.segments.push_back(
      {.q_begin = 0, .q_end = static_cast<int32_t>(n_q), .ranges = {{0, 10}, {40, 97}}, .kv_head = 0});
  per_head.segments.push_back({.q_begin = 0, .q_end = static_cast<int32_t>(n_q), .ranges = {{20, 97}}, .kv_head = 1});
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const PagedKv kv(*gpu_, dtype, n, kvd);
    ASSERT_TRUE(kv.ok());
    const float tol = AttentionTolerance(dtype);
    struct Case {
      const char* name;
      const KvSelection* selection;
      PositionWindow window;
    };
    for (const Case& c :
         {Case{"all", nullptr, {}}, Case{"per-head selection", &per_head, {}},
          Case{"proximal", nullptr, {.part = PositionWindow::Part::kProximal, .sinks = 4, .recent = 16}},
          Case{"distant", nullptr, {.part = PositionWindow::Part::kDistant, .sinks = 4, .recent = 16}}}) {
      const std::string what = std::string(c.name) + " " + std::string(DTypeName(dtype));
      const AttentionArgs base{.q_pos = q_pos.data(),
                               .n_q = n_q,
                               .q_stride = 256,
                               .out_stride = 256,
                               .selection = c.selection,
                               .lse_stride = 4,
                               .window = c.window};
      // The last row's probabilities and its logits, each asked for alone.
      CompareAttention(shape, kv, positions, base, q, /*probs=*/true, /*logits=*/false, tol, what);
      CompareAttention(shape, kv, positions, base, q, /*probs=*/false, /*logits=*/true, tol, what);
    }
  }
}

// The tiled tensor-core kernel (16-bit KV) against the CPU over shapes that stress its
// tiles: GQA groups of 1, 4 and 7 (a tile of 63 rows), head dimensions 16 to 128,
// 1 to 4097 keys and 1 to 100 query rows; block-sparse segments per query range
// (CritiPrefill's shape), PoD's proximal part with the distant K blocks dropped
// (null pointers on the GPU), and the last row's statistics. The 4097-key shapes with
// few query rows split their keys across thread blocks (AttentionSplits) and merge.
TEST_F(CudaBackendTest, TiledAttentionMatchesCpuAcrossShapes) {
  struct Shape {
    int n_heads, n_kv_heads, head_dim;
    int64_t n, n_q;
  };
  for (const Shape& sh : {Shape{4, 1, 64, 1, 1}, Shape{4, 1, 64, 17, 17}, Shape{7, 1, 128, 300, 100},
                          Shape{8, 8, 16, 4097, 3}, Shape{32, 8, 128, 4097, 1}, Shape{14, 2, 64, 1000, 65}}) {
    const AttentionShape shape{.n_heads = sh.n_heads,
                               .n_kv_heads = sh.n_kv_heads,
                               .head_dim = sh.head_dim,
                               .scale = 1.0f / std::sqrt(static_cast<float>(sh.head_dim))};
    const int64_t kvd = int64_t{sh.n_kv_heads} * sh.head_dim, qd = int64_t{sh.n_heads} * sh.head_dim;
    std::vector<int32_t> positions(sh.n), q_pos(sh.n_q);
    for (int64_t j = 0; j < sh.n; ++j) positions[j] = static_cast<int32_t>(j);
    for (int64_t i = 0; i < sh.n_q; ++i) q_pos[i] = static_cast<int32_t>(sh.n - sh.n_q + i);
    const auto q = Randn(sh.n_q * qd, 27);
    // Block-sparse: query rows in segments of 16, each over the first block, one block
    // of its own choosing and its own causal tail.
    KvSelection sparse;
    for (int32_t q0 = 0; q0 < sh.n_q; q0 += 16) {
      const int32_t q1 = std::min<int32_t>(static_cast<int32_t>(sh.n_q), q0 + 16);
      const int32_t tail = std::max<int32_t>(0, q_pos[q0] - 31), mid = tail / 2 / 16 * 16;
      KvSelection::Segment seg{.q_begin = q0, .q_end = q1, .kv_head = -1};
      seg.ranges.push_back({0, std::min<int32_t>(16, tail)});
      if (mid >= 16 && mid + 16 <= tail) seg.ranges.push_back({mid, mid + 16});
      seg.ranges.push_back({tail, static_cast<int32_t>(sh.n)});
      std::erase_if(seg.ranges, [](const KvRange& r) { return r.begin >= r.end; });
      sparse.segments.push_back(std::move(seg));
    }
    const PositionWindow proximal{.part = PositionWindow::Part::kProximal, .sinks = 16, .recent = 64};
    for (const DType dtype : {DType::kF16, DType::kBF16}) {
      PagedKv kv(*gpu_, dtype, sh.n, kvd);
      ASSERT_TRUE(kv.ok());
      const float tol = AttentionTolerance(dtype);
      for (const char* name : {"all", "block-sparse", "proximal"}) {
        const std::string what = absl::StrCat(name, " ", std::string(DTypeName(dtype)), " heads ", sh.n_heads, "/",
                                              sh.n_kv_heads, " hd ", sh.head_dim, " n ", sh.n, " n_q ", sh.n_q);
        const bool is_proximal = std::string(name) == "proximal";
        if (is_proximal) {  // K blocks whose keys are distant to every query: never read
          for (int64_t b = 1; (b + 1) * PagedKv::kBlockRows - 1 <= q_pos[0] - proximal.recent; ++b) {
            kv.DropGpuKeyBlock(b);
          }
        }
        const AttentionArgs base{.q_pos = q_pos.data(),
                                 .n_q = sh.n_q,
                                 .q_stride = qd,
                                 .out_stride = qd,
                                 .selection = std::string(name) == "block-sparse" ? &sparse : nullptr,
                                 .lse_stride = sh.n_heads,
                                 .window = is_proximal ? proximal : PositionWindow{}};
        const float error = CompareAttention(shape, kv, positions, base, q, /*probs=*/true, /*logits=*/true, tol, what);
        // The tolerance must catch a kernel that skips one key tile (64 keys): the GPU is
        // several times closer to the CPU than the CPU is to itself without a tile.
        if (std::string(name) == "all" && sh.n >= 256) {
          KvSelection without_tile;  // keys [128, 192) left out
          without_tile.segments.push_back({.q_begin = 0,
                                           .q_end = static_cast<int32_t>(sh.n_q),
                                           .ranges = {{0, 128}, {192, static_cast<int32_t>(sh.n)}},
                                           .kv_head = -1});
          const float tile = MaxDifference(CpuOutput(shape, kv, positions, base, q, &without_tile),
                                           CpuOutput(shape, kv, positions, base, q, nullptr));
          EXPECT_LT(error * 4, tile) << what << ": the GPU is off by " << error << ", a dropped tile by " << tile;
          std::printf("%s: GPU off by %.2e; a dropped key tile moves the output by %.2e\n", what.c_str(), error, tile);
        }
      }
    }
  }
}

// Several sequences' attentions run together (Backend::Attentions: one staged copy, one
// launch per kernel), as a decode batch does: each call's output equals the CPU's for
// that call alone. Calls of 1 to 4,097 keys and 1 or 17 query rows (some split their
// keys, some not), one block-sparse, one with the last row's statistics; BF16 KV (the
// tiled kernel) and F32 KV (the F32 kernel).
TEST_F(CudaBackendTest, AttentionsOfABatchMatchTheCpuCallByCall) {
  const AttentionShape shape{.n_heads = 32, .n_kv_heads = 8, .head_dim = 128, .scale = 1.0f / std::sqrt(128.0f)};
  const int64_t qd = 32 * 128, kvd = 8 * 128;
  struct Call {
    int64_t n, n_q;
    bool sparse, stats;
  };
  const std::vector<Call> calls = {{1, 1, false, false},
                                   {4097, 1, false, false},
                                   {300, 1, false, true},
                                   {1000, 17, true, false},
                                   {64, 1, false, false}};
  for (const DType dtype : {DType::kBF16, DType::kF32}) {
    std::vector<std::unique_ptr<PagedKv>> kvs;
    std::vector<std::vector<int32_t>> positions(calls.size()), q_pos(calls.size());
    std::vector<std::vector<float>> q(calls.size()), out(calls.size()), probs(calls.size());
    std::vector<KvSelection> sparse(calls.size());
    std::vector<AttentionCall> on_gpu, on_cpu;
    for (size_t c = 0; c < calls.size(); ++c) {
      const auto [n, n_q, is_sparse, stats] = calls[c];
      kvs.push_back(std::make_unique<PagedKv>(*gpu_, dtype, n, kvd));
      ASSERT_TRUE(kvs.back()->ok());
      for (int64_t j = 0; j < n; ++j) positions[c].push_back(static_cast<int32_t>(j));
      for (int64_t i = 0; i < n_q; ++i) q_pos[c].push_back(static_cast<int32_t>(n - n_q + i));
      q[c] = Randn(n_q * qd, 40 + static_cast<uint32_t>(c));
      out[c].assign(n_q * qd, 0.0f);
      probs[c].assign(stats ? n : 0, 0.0f);
      if (is_sparse) {  // the first 64 keys and the last 200
        sparse[c].segments.push_back({.q_begin = 0,
                                      .q_end = static_cast<int32_t>(n_q),
                                      .ranges = {{0, 64}, {static_cast<int32_t>(n) - 200, static_cast<int32_t>(n)}},
                                      .kv_head = -1});
      }
      const AttentionArgs args{.q = q[c].data(),
                               .q_pos = q_pos[c].data(),
                               .n_q = n_q,
                               .q_stride = qd,
                               .out = out[c].data(),
                               .out_stride = qd,
                               .selection = is_sparse ? &sparse[c] : nullptr,
                               .last_query_probs = stats ? probs[c].data() : nullptr};
      on_cpu.push_back({.kv = kvs[c]->View(false, positions[c]), .args = args});
      AttentionArgs g = args;
      g.q = Device(q[c]);
      g.out = Device(out[c]);
      g.last_query_probs = stats ? Device(probs[c]) : nullptr;
      on_gpu.push_back({.kv = kvs[c]->View(true, positions[c]), .args = g});
    }
    gpu_->Attentions(shape, on_gpu);
    for (const AttentionCall& c : on_cpu) cpu_.Attention(shape, c.kv, c.args);
    for (size_t c = 0; c < calls.size(); ++c) {
      const std::string what = absl::StrCat(std::string(DTypeName(dtype)), " call ", c, " of ", calls[c].n, " keys");
      ExpectNear(FromDevice(on_gpu[c].args.out, out[c].size()), out[c], AttentionTolerance(dtype), "out " + what);
      if (calls[c].stats) {
        ExpectNear(FromDevice(on_gpu[c].args.last_query_probs, probs[c].size()), probs[c],
                   AttentionTolerance(dtype) / 10, "probs " + what);
      }
    }
  }
}

// Weights of other types run as BF16 copies (GEMM with F32 accumulation): the result
// within BF16's rounding of the CPU's.
TEST_F(CudaBackendTest, HalfWeightsRunAsBf16) {
  const int m = 17, n = 300, k = 576;
  const auto x = Randn(m * k, 22), w = Randn(n * k, 23);
  std::vector<uint16_t> w16(w.size());
  for (size_t i = 0; i < w.size(); ++i) w16[i] = Fp32ToFp16(w[i]);
  const MatrixView view{
      .type = DType::kF16, .data = reinterpret_cast<const uint8_t*>(w16.data()), .rows = n, .cols = k};
  std::vector<float> y(m * n);
  float* dy = Device(y);
  gpu_->MatMul(view, Device(x), m, dy);
  cpu_.MatMul(view, x.data(), m, y.data());
  const std::vector<float> got = FromDevice(dy, y.size());
  double err = 0, norm = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    err += (got[i] - y[i]) * (got[i] - y[i]);
    norm += y[i] * y[i];
  }
  EXPECT_LT(std::sqrt(err / norm), 1e-2);

  const std::vector<int32_t> tokens = {299, 0, 17, 17, 4};
  std::vector<float> e(tokens.size() * k);
  float* de = Device(e);
  gpu_->Embed(view, tokens, de);
  cpu_.Embed(view, tokens, e.data());
  ExpectNear(FromDevice(de, e.size()), e, 8e-3f, "embed");
}

}  // namespace
}  // namespace ps
