// CUDA kernels against the CPU kernels, by relative error. Skips without a GPU.
#include <cmath>
#include <random>
#include <vector>

#include "base/thread_pool.h"
#include "gtest/gtest.h"
#include "tests/kernels/random.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/vec.h"
#include "kernels/cuda/cuda_backend.h"

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

}  // namespace
}  // namespace ps
