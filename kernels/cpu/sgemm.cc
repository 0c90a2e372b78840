#include "kernels/cpu/sgemm.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <array>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>

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

}  // namespace

bool GemmBf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float* c,
              int64_t ldc) {
  PS_CHECK(ActiveCpuIsa() >= CpuIsa::kAvx512Bf16) << "BF16 products need AVX-512 BF16";
  PrepareDnnl();
  using dnnl::memory;
  using Tag = memory::data_type;
  static thread_local dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  static thread_local dnnl::stream stream(engine);
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
                                             engine));
    } catch (const dnnl::error&) {
      p.reset();
    }
    it = primitives.emplace(key, std::move(p)).first;
  }
  if (!it->second.has_value()) return false;
  const memory::desc a_md({m, k}, Tag::bf16, {lda, 1}), c_md({m, n}, Tag::f32, {ldc, 1});
  memory am(a_md, engine, const_cast<uint16_t*>(a)), bm(b_md, engine, const_cast<uint16_t*>(b)), cm(c_md, engine, c);
  it->second->execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  stream.wait();
  return true;
}

void Sgemm(bool b_transposed, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
  PrepareDnnl();
  const dnnl_status_t s = dnnl_sgemm('N', b_transposed ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  PS_CHECK(s == dnnl_success) << "dnnl_sgemm failed (" << static_cast<int>(s) << ") for " << m << "x" << n << "x" << k;
}

}  // namespace ps
