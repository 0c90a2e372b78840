#include "kernels/cpu/cpu_isa.h"

#include <cpuid.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace ps {
namespace {

struct Features {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_vnni = false, avx512_bf16 = false, avx_vnni = false;
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false;
};

// CPUID and XGETBV: an instruction set counts only when the operating system saves its
// registers (XCR0), which a hypervisor may decline for AVX-512 or AMX.
Features Detect() {
  Features f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid(1, a, b, c, d);
  const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
  if (!osxsave || !avx) return f;
  const bool fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
  uint32_t xcr0_lo = 0, xcr0_hi = 0;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const uint64_t xcr0 = (static_cast<uint64_t>(xcr0_hi) << 32) | xcr0_lo;
  const bool ymm_state = (xcr0 & 0x6) == 0x6;
  const bool zmm_state = ymm_state && (xcr0 & 0xE0) == 0xE0;
  const bool amx_state = ((xcr0 >> 17) & 3) == 3;
  if (!ymm_state) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned leaf7_eax = a;
  f.avx2 = (b >> 5) & 1;
  f.fma = fma;
  f.f16c = f16c;
  if (zmm_state) {
    f.avx512f = (b >> 16) & 1;
    f.avx512dq = (b >> 17) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512vl = (b >> 31) & 1;
    f.avx512_vnni = (c >> 11) & 1;
  }
  if (amx_state) {
    f.amx_bf16 = (d >> 22) & 1;
    f.amx_tile = (d >> 24) & 1;
    f.amx_int8 = (d >> 25) & 1;
  }
  if (leaf7_eax >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avx_vnni = (a >> 4) & 1;
    f.avx512_bf16 = zmm_state && ((a >> 5) & 1);
  }
  return f;
}

const Features& CpuFeatures() {
  static const Features f = Detect();
  return f;
}

CpuIsa BestOf(const Features& f) {
  if (!(f.avx2 && f.fma && f.f16c)) return CpuIsa::kScalar;
  if (!(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq)) return CpuIsa::kAvx2;
  if (!(f.avx512_vnni && f.avx512_bf16)) return CpuIsa::kAvx512;
  return CpuIsa::kAvx512Bf16;
}

// The level from $PS_CPU_ISA, capped at the detected one (an unknown name is ignored
// with a message: kernels must not fail to start over it).
int InitialLevel() {
  const CpuIsa best = BestOf(CpuFeatures());
  const char* env = std::getenv("PS_CPU_ISA");
  if (env == nullptr || *env == '\0') return static_cast<int>(best);
  const absl::StatusOr<CpuIsa> asked = ParseCpuIsa(env);
  if (!asked.ok()) {
    std::fprintf(stderr, "PS_CPU_ISA: %s; using %s\n", std::string(asked.status().message()).c_str(),
                 std::string(CpuIsaName(best)).c_str());
    return static_cast<int>(best);
  }
  return static_cast<int>(std::min(*asked, best));
}

std::atomic<int>& Level() {
  static std::atomic<int> level{InitialLevel()};
  return level;
}

}  // namespace

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx512Bf16: return "avx512_bf16";
  }
  return "?";
}

absl::StatusOr<CpuIsa> ParseCpuIsa(std::string_view name) {
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (name == CpuIsaName(isa)) return isa;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown CPU level '", std::string(name), "' (scalar, avx2, avx512 or avx512_bf16)"));
}

CpuIsa DetectedCpuIsa() { return BestOf(CpuFeatures()); }

std::string CpuFeatureNames() {
  const Features& f = CpuFeatures();
  const std::pair<bool, const char*> names[] = {{f.avx2, "avx2"},
                                                {f.fma, "fma"},
                                                {f.f16c, "f16c"},
                                                {f.avx512f, "avx512f"},
                                                {f.avx512bw, "avx512bw"},
                                                {f.avx512vl, "avx512vl"},
                                                {f.avx512dq, "avx512dq"},
                                                {f.avx512_vnni, "avx512_vnni"},
                                                {f.avx512_bf16, "avx512_bf16"},
                                                {f.avx_vnni, "avx_vnni"},
                                                {f.amx_tile, "amx_tile"},
                                                {f.amx_int8, "amx_int8"},
                                                {f.amx_bf16, "amx_bf16"}};
  std::string out;
  for (const auto& [has, name] : names) {
    if (has) absl::StrAppend(&out, out.empty() ? "" : " ", name);
  }
  return out.empty() ? "none of the vector extensions the kernels use" : out;
}

std::vector<CpuIsa> SupportedCpuIsas() {
  std::vector<CpuIsa> out;
  for (int i = 0; i <= static_cast<int>(DetectedCpuIsa()); ++i) out.push_back(static_cast<CpuIsa>(i));
  return out;
}

CpuIsa ActiveCpuIsa() { return static_cast<CpuIsa>(Level().load(std::memory_order_relaxed)); }

absl::Status SetCpuIsa(CpuIsa isa) {
  if (isa > DetectedCpuIsa()) {
    return absl::InvalidArgumentError(absl::StrCat("this CPU cannot run ", std::string(CpuIsaName(isa)),
                                                   " kernels (its best level is ",
                                                   std::string(CpuIsaName(DetectedCpuIsa())), ")"));
  }
  Level().store(static_cast<int>(isa), std::memory_order_relaxed);
  return absl::OkStatus();
}

std::string DescribeCpuIsa() {
  return absl::StrCat(std::string(CpuIsaName(ActiveCpuIsa())),
                      " (this CPU: ", std::string(CpuIsaName(DetectedCpuIsa())), "; features: ", CpuFeatureNames(),
                      ")");
}

ScopedCpuIsa::ScopedCpuIsa(CpuIsa isa) : previous_(ActiveCpuIsa()) {
  const absl::Status s = SetCpuIsa(isa);
  PS_CHECK(s.ok()) << s.message();
}

ScopedCpuIsa::~ScopedCpuIsa() { Level().store(static_cast<int>(previous_), std::memory_order_relaxed); }

}  // namespace ps
