#include "kernels/cpu/sgemm.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <utility>

#include "base/status.h"
#include "kernels/cpu/cpu_isa.h"

namespace ps {
namespace {

dnnl_cpu_isa_t DnnlIsa(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return dnnl_cpu_isa_sse41;  // oneDNN's lowest
    case CpuIsa::kAvx2: return dnnl_cpu_isa_avx2;
    case CpuIsa::kAvx512: return dnnl_cpu_isa_avx512_core;
    case CpuIsa::kAvx512Bf16: return dnnl_cpu_isa_avx512_core_bf16;
  }
  return dnnl_cpu_isa_all;
}

// oneDNN's ISA cap holds from its first kernel on: the level at the first product. Debian's
// oneDNN runs on OpenMP: one thread per call, in this thread's own ICVs.
void PrepareDnnl() {
  static std::once_flag cap;
  std::call_once(cap, [] { dnnl_set_max_cpu_isa(DnnlIsa(ActiveCpuIsa())); });
  static thread_local const bool single = (omp_set_num_threads(1), true);
  (void)single;
}

// This thread's oneDNN engine and stream for the BF16 products (run on the calling thread).
struct Bf16Context {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

Bf16Context& ContextForBf16() {
  PS_CHECK(ActiveCpuIsa() >= CpuIsa::kAvx512Bf16) << "BF16 products need AVX-512 BF16";
  PrepareDnnl();
  static thread_local Bf16Context context;
  return context;
}

// C = A · B on the calling thread, each operand described by its memory descriptor.
void RunMatMul(const dnnl::matmul& p, Bf16Context& ctx, const dnnl::memory::desc& a_md, const uint16_t* a,
               const dnnl::memory::desc& b_md, const uint16_t* b, const dnnl::memory::desc& c_md, float* c) {
  using dnnl::memory;
  memory am(a_md, ctx.engine, const_cast<uint16_t*>(a)), bm(b_md, ctx.engine, const_cast<uint16_t*>(b));
  memory cm(c_md, ctx.engine, c);
  p.execute(ctx.stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  ctx.stream.wait();
}

}  // namespace

bool GemmBf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float* c,
              int64_t ldc) {
  Bf16Context& ctx = ContextForBf16();
  using dnnl::memory;
  using Tag = memory::data_type;
  // One primitive per weight shape, its rows (m) and row strides given at each call.
  static thread_local std::map<std::array<int64_t, 3>, std::optional<dnnl::matmul>> primitives;
  const std::array<int64_t, 3> key{n, k, ldb};
  const memory::desc b_md({k, n}, Tag::bf16, {1, ldb});
  auto it = primitives.find(key);
  if (it == primitives.end()) {
    constexpr memory::dim kAny = DNNL_RUNTIME_DIM_VAL;
    std::optional<dnnl::matmul> p;  // none where oneDNN has no BF16 implementation
    try {
      p.emplace(dnnl::matmul::primitive_desc(dnnl::matmul::desc(memory::desc({kAny, k}, Tag::bf16, {kAny, 1}), b_md,
                                                                memory::desc({kAny, n}, Tag::f32, {kAny, 1})),
                                             ctx.engine));
    } catch (const dnnl::error&) {
      p.reset();
    }
    it = primitives.emplace(key, std::move(p)).first;
  }
  if (!it->second.has_value()) return false;
  RunMatMul(*it->second, ctx, memory::desc({m, k}, Tag::bf16, {lda, 1}), a, b_md, b,
            memory::desc({m, n}, Tag::f32, {ldc, 1}), c);
  return true;
}

namespace {

constexpr int64_t kPackedDepth = 32;  // BA16a64b2a's blocks of k
int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// Columns [n0, n1) of the packed B = Wᵀ [k, n]: their blocks start n0 / 64 blocks in.
std::pair<dnnl::memory::desc, const uint16_t*> PackedColumns(int64_t n0, int64_t n1, int64_t k,
                                                             const uint16_t* packed) {
  PS_CHECK(n0 % kPackedBf16Columns == 0 && n1 > n0) << "packed columns [" << n0 << ", " << n1 << ")";
  return {dnnl::memory::desc({k, n1 - n0}, dnnl::memory::data_type::bf16, dnnl::memory::format_tag::BA16a64b2a),
          packed + n0 * RoundUp(k, kPackedDepth)};
}

}  // namespace

size_t PackedBf16Bytes(int64_t n, int64_t k) {
  return static_cast<size_t>(RoundUp(n, kPackedBf16Columns) * RoundUp(k, kPackedDepth)) * sizeof(uint16_t);
}

void PackBf16(const uint16_t* w, int64_t n, int64_t k, int64_t ldw, uint16_t* dst) {
  Bf16Context& ctx = ContextForBf16();
  using dnnl::memory;
  std::fill_n(dst, PackedBf16Bytes(n, k) / sizeof(uint16_t), uint16_t{0});  // the padding
  const auto [dst_md, dst_data] = PackedColumns(0, n, k, dst);
  memory src(memory::desc({k, n}, memory::data_type::bf16, {1, ldw}), ctx.engine, const_cast<uint16_t*>(w));
  memory out(dst_md, ctx.engine, const_cast<uint16_t*>(dst_data));
  dnnl::reorder(src, out).execute(ctx.stream, src, out);
  ctx.stream.wait();
}

void GemmBf16Packed(int64_t m, int64_t n0, int64_t n1, int64_t k, const uint16_t* a, const uint16_t* packed, float* c) {
  Bf16Context& ctx = ContextForBf16();
  using dnnl::memory;
  using Tag = memory::data_type;
  // oneDNN's blocked-weight kernels take no run-time row count: one primitive per (m, n, k).
  // A server's batches vary, so the cache starts again past a bound.
  static thread_local std::map<std::array<int64_t, 3>, dnnl::matmul> primitives;
  constexpr size_t kMaxPrimitives = 256;
  const auto [b_md, b] = PackedColumns(n0, n1, k, packed);
  const int64_t n = n1 - n0;
  const memory::desc a_md({m, k}, Tag::bf16, {k, 1}), c_md({m, n}, Tag::f32, {n, 1});
  const std::array<int64_t, 3> key{m, n, k};
  auto it = primitives.find(key);
  if (it == primitives.end()) {
    if (primitives.size() >= kMaxPrimitives) primitives.clear();
    it = primitives
             .emplace(key, dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), ctx.engine)))
             .first;
  }
  RunMatMul(it->second, ctx, a_md, a, b_md, b, c_md, c);
}

void Sgemm(bool b_transposed, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
  PrepareDnnl();
  const dnnl_status_t s = dnnl_sgemm('N', b_transposed ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  PS_CHECK(s == dnnl_success) << "dnnl_sgemm failed (" << static_cast<int>(s) << ") for " << m << "x" << n << "x" << k;
}

}  // namespace ps
