// The CPU level the kernels dispatch on (kernels/cpu/cpu_isa.h): names, the levels this
// CPU supports, capping and restoring.
#include "kernels/cpu/cpu_isa.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(CpuIsa, NamesRoundTrip) {
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    const absl::StatusOr<CpuIsa> parsed = ParseCpuIsa(CpuIsaName(isa));
    ASSERT_TRUE(parsed.ok()) << CpuIsaName(isa);
    EXPECT_EQ(*parsed, isa);
  }
  const absl::StatusOr<CpuIsa> bad = ParseCpuIsa("sse2");
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("scalar, avx2, avx512 or avx512_bf16"));
}

TEST(CpuIsa, SupportedLevelsRunFromScalarToTheDetectedOne) {
  const std::vector<CpuIsa> levels = SupportedCpuIsas();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), CpuIsa::kScalar);
  EXPECT_EQ(levels.back(), DetectedCpuIsa());
  for (size_t i = 0; i < levels.size(); ++i) EXPECT_EQ(static_cast<int>(levels[i]), static_cast<int>(i));
  // The features behind the level.
  const std::string features = CpuFeatureNames();
  if (DetectedCpuIsa() >= CpuIsa::kAvx2) {
    EXPECT_THAT(features, ::testing::HasSubstr("avx2 fma f16c"));
  }
  if (DetectedCpuIsa() >= CpuIsa::kAvx512) {
    EXPECT_THAT(features, ::testing::HasSubstr("avx512f avx512bw avx512vl"));
  }
  if (DetectedCpuIsa() >= CpuIsa::kAvx512Bf16) {
    EXPECT_THAT(features, ::testing::HasSubstr("avx512_bf16"));
  }
}

TEST(CpuIsa, CapsAndRestores) {
  const CpuIsa before = ActiveCpuIsa();
  for (CpuIsa isa : SupportedCpuIsas()) {
    ScopedCpuIsa scoped(isa);
    EXPECT_EQ(ActiveCpuIsa(), isa);
    EXPECT_THAT(DescribeCpuIsa(), ::testing::StartsWith(std::string(CpuIsaName(isa)) + " (this CPU: "));
  }
  EXPECT_EQ(ActiveCpuIsa(), before);
  if (DetectedCpuIsa() < CpuIsa::kAvx512Bf16) {
    const absl::Status s = SetCpuIsa(CpuIsa::kAvx512Bf16);
    EXPECT_FALSE(s.ok());
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("this CPU cannot run avx512_bf16 kernels"));
    EXPECT_EQ(ActiveCpuIsa(), before);
  }
}

}  // namespace
}  // namespace ps
