// Which instruction-set level the CPU kernels run at: detected once from the CPU's
// features, capped by $PS_CPU_ISA or `--cpu-isa` (to run and test a lower level on a
// machine that has a higher one). Every kernel dispatches on ActiveCpuIsa(); the
// server logs it at start-up and GetModelInfo reports it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ps {

// Ordered: each level has every instruction of the ones below it.
enum class CpuIsa : int {
  kScalar = 0,     // portable C++ (the reference every other level is tested against)
  kAvx2 = 1,       // AVX2 + FMA + F16C (Haswell, Zen 1-3)
  kAvx512 = 2,     // + AVX-512 F/BW/VL/DQ (Skylake-SP)
  kAvx512Bf16 = 3  // + AVX-512 VNNI and BF16 dot products (Zen 4/5, Cooper Lake, Sapphire Rapids)
};

std::string_view CpuIsaName(CpuIsa isa);  // "scalar", "avx2", "avx512", "avx512_bf16"
absl::StatusOr<CpuIsa> ParseCpuIsa(std::string_view name);

// The best level this CPU (and its operating system's saved register state) supports.
CpuIsa DetectedCpuIsa();
// The features behind it, as the kernels see them ("avx2 fma f16c avx512f ... amx_int8").
std::string CpuFeatureNames();
// Every level this CPU can run, lowest first (what the kernel tests iterate over).
std::vector<CpuIsa> SupportedCpuIsas();

// The level kernels use: the detected one, or lower when $PS_CPU_ISA or SetCpuIsa
// asked for it. Cheap (one relaxed load): the kernels call it per operation.
CpuIsa ActiveCpuIsa();
// Caps the active level (a level the CPU lacks is an error); thread-safe, but meant to
// be called before kernels run (at start-up, or between tests).
absl::Status SetCpuIsa(CpuIsa isa);
// "avx2 (this CPU: avx2; features: avx2 fma f16c)": for logs, --help and GetModelInfo.
std::string DescribeCpuIsa();

// Runs a scope at a given level and restores the previous one (tests).
class ScopedCpuIsa {
 public:
  explicit ScopedCpuIsa(CpuIsa isa);
  ~ScopedCpuIsa();
  ScopedCpuIsa(const ScopedCpuIsa&) = delete;
  ScopedCpuIsa& operator=(const ScopedCpuIsa&) = delete;

 private:
  CpuIsa previous_;
};

}  // namespace ps
