#include "kernels/cpu/sgemm.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <mutex>

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

}  // namespace

void Sgemm(bool b_transposed, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
  // oneDNN's ISA cap holds from its first kernel on: the level at the first product.
  static std::once_flag cap;
  std::call_once(cap, [] { dnnl_set_max_cpu_isa(DnnlIsa(ActiveCpuIsa())); });
  // Debian's oneDNN runs on OpenMP: one thread per call, in this thread's own ICVs.
  static thread_local const bool single = (omp_set_num_threads(1), true);
  (void)single;
  const dnnl_status_t s = dnnl_sgemm('N', b_transposed ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  PS_CHECK(s == dnnl_success) << "dnnl_sgemm failed (" << static_cast<int>(s) << ") for " << m << "x" << n << "x" << k;
}

}  // namespace ps
