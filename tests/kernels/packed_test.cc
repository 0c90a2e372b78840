// The packed layout and its int8 products (kernels/cpu/packed.h): packing keeps every
// weight, the kernels of every CPU level this machine has compute the int8-activation
// product exactly as the scalar reference does, and that product is the double-precision
// one of the dequantised weights and activations up to float rounding.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed.h"
#include "kernels/cpu/quant.h"
#include "tests/kernels/random.h"

namespace ps {
namespace {

using testing::RandomRow;

// A random matrix of `rows` rows of `type` and its packed layout.
struct Matrix {
  Matrix(DType type, int64_t rows, int64_t cols, uint32_t seed) {
    std::mt19937 rng(seed);
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<uint8_t> row = RandomRow(type, cols, rng);
      bytes.insert(bytes.end(), row.begin(), row.end());
    }
    view = MatrixView{.type = type, .data = bytes.data(), .rows = rows, .cols = cols};
    packed.resize(PackedBytes(type, rows, cols));
    ThreadPool pool(2);
    PackMatrix(view, packed.data(), pool);
  }
  std::vector<uint8_t> bytes, packed;
  MatrixView view;
};

class PackedTypes : public ::testing::TestWithParam<DType> {
 protected:
  // Columns of `blocks` of the type's own blocks (256 for the K formats).
  int64_t Cols(int64_t blocks) const { return blocks * Traits(GetParam()).block_elems; }
};

TEST_P(PackedTypes, PackingKeepsEveryWeight) {
  const DType type = GetParam();
  for (int64_t rows : {1, 8, 13}) {
    for (int64_t blocks : {1, 3}) {
      const int64_t cols = Cols(blocks);
      Matrix w(type, rows, cols, 11 + rows);
      std::vector<float> want(cols), got(cols);
      for (int64_t r = 0; r < rows; ++r) {
        DequantizeRow(type, w.view.Row(r), want.data(), cols);
        UnpackRow(type, w.packed.data(), cols, r, got.data());
        for (int64_t k = 0; k < cols; ++k) {
          ASSERT_EQ(got[k], want[k]) << DTypeName(type) << " rows=" << rows << " row " << r << " column " << k;
        }
      }
    }
  }
}

TEST_P(PackedTypes, EveryLevelComputesTheInt8Product) {
  const DType type = GetParam();
  ThreadPool pool(2);
  for (int64_t rows : {8, 13, 40}) {
    for (int64_t blocks : {1, 3}) {
      const int64_t cols = Cols(blocks);
      Matrix w(type, rows, cols, 7 * rows + blocks);
      // From 9 rows VNNI takes two groups a call; from 32 (Q6_K: from 9) it decodes them
      // first and takes up to 4 groups and 6 rows a call (38: 6 calls of 6 rows, then 2).
      for (int64_t m : {1, 2, 3, 4, 5, 7, 17, 38}) {
        const std::vector<float> x = testing::Randn(m * cols, static_cast<uint32_t>(m * 1000 + rows));
        // The double-precision product of the dequantised weights and activations.
        std::vector<ActBlock> xq(m * cols / 32);
        {
          ScopedCpuIsa scalar(CpuIsa::kScalar);
          for (int64_t i = 0; i < m; ++i) QuantizeActivations(x.data() + i * cols, cols, xq.data() + i * cols / 32);
        }
        std::vector<double> want(m * rows), norm(m * rows);
        std::vector<float> wrow(cols);
        for (int64_t r = 0; r < rows; ++r) {
          DequantizeRow(type, w.view.Row(r), wrow.data(), cols);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t k = 0; k < cols; ++k) {
              const ActBlock& a = xq[(i * cols + k) / 32];
              const double p = double(wrow[k]) * a.d * a.qs[k % 32];
              want[i * rows + r] += p;
              norm[i * rows + r] += std::fabs(p);
            }
          }
        }
        std::vector<float> scalar;
        for (CpuIsa isa : SupportedCpuIsas()) {
          ScopedCpuIsa level(isa);
          std::vector<float> got(m * rows, NAN), fly(m * rows, NAN);
          PackedMatMul(w.view, w.packed.data(), x.data(), m, got.data(), pool);
          PackedMatMul(w.view, nullptr, x.data(), m, fly.data(), pool);
          const std::string where = std::string(DTypeName(type)) + " " + std::string(CpuIsaName(isa)) +
                                    " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
                                    " m=" + std::to_string(m);
          for (int64_t e = 0; e < m * rows; ++e) {
            ASSERT_NEAR(got[e], want[e], 1e-5 * norm[e] + 1e-6) << where << " element " << e;
            ASSERT_EQ(fly[e], got[e]) << where << ": packed on the fly differs, element " << e;
          }
          if (isa == CpuIsa::kScalar) {
            scalar = got;
          } else {
            ASSERT_EQ(0, std::memcmp(got.data(), scalar.data(), got.size() * sizeof(float)))
                << where << ": differs from the scalar kernel";
          }
        }
      }
    }
  }
}

TEST_P(PackedTypes, ManyRowsRunInPassesThatAgreeWithTheScalarKernel) {
  // 2048 columns: the SIMD kernels broadcast a few dozen activation rows a pass.
  const DType type = GetParam();
  ThreadPool pool(2);
  // 24 rows: VNNI's decoded calls take 4 groups (the last one twice, its copy's columns
  // dropped); 40: 4 groups, then one and its copy.
  for (const int64_t rows : {24, 40}) {
    const int64_t cols = 2048, m = 203;
    Matrix w(type, rows, cols, 3);
    const std::vector<float> x = testing::Randn(m * cols, 4);
    std::vector<float> scalar(m * rows);
    {
      ScopedCpuIsa level(CpuIsa::kScalar);
      PackedMatMul(w.view, w.packed.data(), x.data(), m, scalar.data(), pool);
    }
    for (CpuIsa isa : SupportedCpuIsas()) {
      ScopedCpuIsa level(isa);
      std::vector<float> got(m * rows, NAN);
      PackedMatMul(w.view, w.packed.data(), x.data(), m, got.data(), pool);
      for (int64_t e = 0; e < m * rows; ++e) {
        ASSERT_EQ(got[e], scalar[e]) << DTypeName(type) << " " << CpuIsaName(isa) << " rows=" << rows << " row "
                                     << e / rows;
      }
    }
  }
}

TEST_P(PackedTypes, MatMulTakesThePackedKernelsForInt8Activations) {
  const DType type = GetParam();
  ThreadPool pool(2);
  const int64_t rows = 24, cols = Cols(2);
  Matrix w(type, rows, cols, 5);
  for (int64_t m : {1, 6}) {
    const std::vector<float> x = testing::Randn(m * cols, 9);
    std::vector<float> want(m * rows), got(m * rows);
    PackedMatMul(w.view, w.packed.data(), x.data(), m, want.data(), pool);
    MatrixView packed_view = w.view;
    packed_view.packed = w.packed.data();
    MatMul(packed_view, x.data(), m, got.data(), pool, /*int8_activations=*/true);
    EXPECT_EQ(got, want) << DTypeName(type) << " m=" << m;
    // Unpacked weights take the same kernels from a few rows up (packed on the fly).
    if (m > GemvMaxRows(type)) {
      MatMul(w.view, x.data(), m, got.data(), pool, true);
      EXPECT_EQ(got, want) << DTypeName(type) << " m=" << m << " unpacked";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, PackedTypes,
                         ::testing::Values(DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0,
                                           DType::kQ4_K, DType::kQ5_K, DType::kQ6_K),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(Packed, SeveralProductsOfOneInputEqualEachOnItsOwn) {
  // A layer's q, k and v of different formats and sizes (Qwen2's Q5_0 / Q8_0 mix),
  // one packed at start-up, one not, in one parallel region.
  ThreadPool pool(2);
  const int64_t cols = 256;
  Matrix q(DType::kQ5_0, 40, cols, 1), k(DType::kQ8_0, 13, cols, 2), v(DType::kQ4_K, 16, cols, 3);
  for (int64_t m : {1, 3, 9}) {
    const std::vector<float> x = testing::Randn(m * cols, static_cast<uint32_t>(m));
    for (CpuIsa isa : SupportedCpuIsas()) {
      ScopedCpuIsa level(isa);
      std::vector<float> yq(m * 40), yk(m * 13), yv(m * 16), want_q(m * 40), want_k(m * 13), want_v(m * 16);
      PackedMatMul(q.view, q.packed.data(), x.data(), m, want_q.data(), pool);
      PackedMatMul(k.view, nullptr, x.data(), m, want_k.data(), pool);
      PackedMatMul(v.view, v.packed.data(), x.data(), m, want_v.data(), pool);
      const PackedProduct products[] = {{.w = q.view, .packed = q.packed.data(), .y = yq.data()},
                                        {.w = k.view, .packed = nullptr, .y = yk.data()},
                                        {.w = v.view, .packed = v.packed.data(), .y = yv.data()}};
      PackedMatMuls(products, x.data(), m, pool);
      EXPECT_EQ(yq, want_q) << CpuIsaName(isa) << " m=" << m;
      EXPECT_EQ(yk, want_k) << CpuIsaName(isa) << " m=" << m;
      EXPECT_EQ(yv, want_v) << CpuIsaName(isa) << " m=" << m;
    }
  }
}

TEST(Packed, OnlyBlockFormatsWithALayoutArePackable) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ2_K, DType::kQ3_K}) {
    EXPECT_FALSE(Packable(t)) << DTypeName(t);
  }
  EXPECT_EQ(PackedBytes(DType::kQ4_1, 8, 64), 2 * 8 * sizeof(BlockQ4_1));   // the original's size
  EXPECT_EQ(PackedBytes(DType::kQ6_K, 9, 256), 2 * 8 * sizeof(BlockQ6_K));  // rows rounded up to 8
}

TEST(Packed, ActivationQuantisationIsTheSameAtEveryLevel) {
  std::vector<float> x = testing::Randn(32 * 9, 3);
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // a block of zeros: scale 0
  std::vector<ActBlock> scalar(9);
  {
    ScopedCpuIsa level(CpuIsa::kScalar);
    QuantizeActivations(x.data(), 32 * 9, scalar.data());
  }
  for (int b = 0; b < 9; ++b) {
    float amax = 0;
    int sum = 0;
    for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(x[32 * b + k]));
    for (int k = 0; k < 32; ++k) {
      EXPECT_NEAR(scalar[b].qs[k] * amax / 127.0f, x[32 * b + k], amax / 254.0f * 1.0001f);
      sum += scalar[b].qs[k];
    }
    EXPECT_EQ(scalar[b].sum_lo + scalar[b].sum_hi, sum);
    EXPECT_NEAR(scalar[b].d, amax / 127.0f, amax / 127.0f / 1024);  // fp16-rounded
  }
  for (CpuIsa isa : SupportedCpuIsas()) {
    ScopedCpuIsa level(isa);
    std::vector<ActBlock> got(9);
    QuantizeActivations(x.data(), 32 * 9, got.data());
    EXPECT_EQ(0, std::memcmp(got.data(), scalar.data(), 9 * sizeof(ActBlock))) << CpuIsaName(isa);
    if (isa < CpuIsa::kAvx512Bf16) continue;
    // The decoded kernel's form: the same blocks with every quant stored plus 128.
    std::vector<ActBlock> want = scalar;
    for (ActBlock& a : want) {
      for (int8_t& q : a.qs) q = static_cast<int8_t>(static_cast<uint8_t>(q) ^ 0x80);
    }
    packed_internal::avx512_vnni::QuantizeUnsigned(x.data(), 32 * 9, got.data());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), 9 * sizeof(ActBlock))) << CpuIsaName(isa) << " unsigned";
  }
}

}  // namespace
}  // namespace ps
