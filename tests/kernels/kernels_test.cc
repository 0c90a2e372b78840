// CPU kernels against simple references at awkward sizes: matrix products, elementwise
// kernels, half conversions (attention: attention_test.cc).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "base/fp16.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/sgemm.h"
#include "kernels/cpu/vec.h"
#include "tests/kernels/compare.h"
#include "tests/kernels/cpu_levels.h"
#include "tests/kernels/random.h"

namespace ps {
namespace {

using testing::MaxRelErr;
using testing::Randn;

// On a CPU with BF16 dot products, BF16 weights multiply on them (oneDNN's BF16 matmul) with
// the activations rounded to BF16: the result is the exact product of the rounded
// activations, not of the F32 ones, at ragged row counts and a row length that is not a
// multiple of 32. As the weights are (from kGemvMaxRows + 1 rows up), and packed once
// (PackBf16Weights: 301 weight rows are four 64-column blocks and a ragged one) at every row
// count: one row, rows that split the weights' blocks between the threads, rows that the
// threads split between them (from 64 on two threads). First in this file: oneDNN keeps the
// instruction level of its first product, and the tests below start at scalar (ctest runs
// each test in a process of its own; run whole, the binary passes in this order).
TEST(MatMul, Bf16WeightsTakeBf16DotProducts) {
  const std::vector<CpuIsa> levels = SupportedCpuIsas();
  if (std::find(levels.begin(), levels.end(), CpuIsa::kAvx512Bf16) == levels.end()) {
    GTEST_SKIP() << "this CPU has no AVX-512 BF16 dot products";
  }
  ScopedCpuIsa level(CpuIsa::kAvx512Bf16);
  ThreadPool pool(2);
  const int64_t rows = 301;
  for (const int64_t cols : {int64_t{96}, int64_t{100}}) {
    const auto wf = Randn(rows * cols, 11);
    std::vector<uint16_t> w16(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) w16[i] = Fp32ToBf16(wf[i]);
    const MatrixView plain{
        .type = DType::kBF16, .data = reinterpret_cast<const uint8_t*>(w16.data()), .rows = rows, .cols = cols};
    ASSERT_TRUE(PacksBf16(plain));
    // Packed over NaNs (the padding must come out zero), from rows that are then zeroed: the
    // products read only the packed layout.
    std::vector<uint16_t> packed(PackedBf16Bytes(rows, cols) / sizeof(uint16_t), 0xFFFF), zeroed = w16;
    MatrixView with_packed = plain;
    with_packed.data = reinterpret_cast<const uint8_t*>(zeroed.data());
    PackBf16Weights(with_packed, reinterpret_cast<uint8_t*>(packed.data()), pool);
    std::fill(zeroed.begin(), zeroed.end(), uint16_t{0});
    with_packed.packed = reinterpret_cast<const uint8_t*>(packed.data());
    for (const int64_t m :
         {int64_t{1}, kGemvMaxRows + 1, int64_t{5}, int64_t{16}, int64_t{33}, int64_t{64}, int64_t{67}}) {
      const auto x = Randn(m * cols, 12);
      std::vector<double> exact(m * rows, 0.0), rounded(m * rows, 0.0);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t k = 0; k < cols; ++k) {
            const double wv = Bf16ToFp32(w16[r * cols + k]), xv = x[i * cols + k];
            exact[i * rows + r] += xv * wv;
            rounded[i * rows + r] += double{Bf16ToFp32(Fp32ToBf16(x[i * cols + k]))} * wv;
          }
        }
      }
      for (const MatrixView* w : {&plain, static_cast<const MatrixView*>(&with_packed)}) {
        if (w == &plain && m <= kGemvMaxRows) continue;  // F32 dot products on the BF16 rows
        std::vector<float> y(m * rows);
        MatMul(*w, x.data(), m, y.data(), pool, /*int8_activations=*/false);
        const char* which = w == &plain ? " (in place)" : " (packed)";
        EXPECT_LT(MaxRelErr(y, rounded), 1e-5) << m << " rows of " << cols << which;
        // BF16's rounding of the activations shows
        EXPECT_GT(MaxRelErr(y, exact), 1e-4) << m << " rows of " << cols << which;
      }
    }
  }
}

TEST(Vec, ElementwiseKernelsMatchScalarMath) {
  for (int n : {1, 17, 64, 4097}) {
    auto a = Randn(n, 1), b = Randn(n, 2);
    double dot = 0;
    for (int i = 0; i < n; ++i) dot += double(a[i]) * b[i];
    EXPECT_NEAR(DotF32(a.data(), b.data(), n), dot, 1e-4 * (1 + std::fabs(dot)));
    std::vector<uint16_t> h(n);
    for (int i = 0; i < n; ++i) h[i] = Fp32ToFp16(a[i]);
    double doth = 0;
    for (int i = 0; i < n; ++i) doth += double(Fp16ToFp32(h[i])) * b[i];
    EXPECT_NEAR(DotHalf(DType::kF16, h.data(), b.data(), n), doth, 1e-4 * (1 + std::fabs(doth)));

    std::vector<float> e = a;
    ExpInPlace(e.data(), n);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(e[i], std::exp(double(a[i])), 3e-7 * std::exp(double(a[i])));

    std::vector<float> s = a;
    SoftmaxInPlace(s.data(), n);
    double m = -1e30, sum = 0;
    for (float v : a) m = std::max<double>(m, v);
    for (float v : a) sum += std::exp(v - m);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(s[i], std::exp(a[i] - m) / sum, 1e-6);
    EXPECT_NEAR(LogSumExp(a.data(), n), m + std::log(sum), 1e-5 * (1 + std::fabs(m + std::log(sum))));

    std::vector<float> out(n), w(n, 1.5f);
    RmsNorm(a.data(), w.data(), out.data(), n, 1e-5f);
    double ss = 0;
    for (float v : a) ss += double(v) * v;
    for (int i = 0; i < n; ++i) EXPECT_NEAR(out[i], a[i] * 1.5 / std::sqrt(ss / n + 1e-5), 1e-5);
  }
  float masked[3] = {-INFINITY, 0.0f, -INFINITY};
  SoftmaxInPlace(masked, 3);
  EXPECT_EQ(masked[0], 0.0f);
  EXPECT_EQ(masked[1], 1.0f);
}

// Both matmul paths on F32, F16 and quantised weights against a double product
// with the same (dequantised) weights.
void CheckMatMulPaths() {
  ThreadPool pool(2);
  std::mt19937 rng(5);
  for (DType type :
       {DType::kF32, DType::kF16, DType::kBF16, DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    const int64_t cols = Traits(type).block_elems == 256 ? 512 : 96;
    for (int64_t rows : {1, 17, 300}) {
      // random valid row data: quantise random floats through dequantise of random blocks
      std::vector<uint8_t> data(RowBytes(type, cols) * rows);
      std::uniform_int_distribution<int> byte(0, 255);
      for (auto& b : data) b = static_cast<uint8_t>(byte(rng));
      if (type == DType::kF32) {
        auto f = Randn(rows * cols, 9);
        std::memcpy(data.data(), f.data(), data.size());
      } else if (type == DType::kF16 || type == DType::kBF16) {
        auto f = Randn(rows * cols, 9);
        auto* h = reinterpret_cast<uint16_t*>(data.data());
        for (size_t i = 0; i < f.size(); ++i) h[i] = type == DType::kF16 ? Fp32ToFp16(f[i]) : Fp32ToBf16(f[i]);
      } else {
        // keep fp16 scales finite: overwrite them with small values
        const size_t bb = Traits(type).block_bytes;
        for (size_t off = 0; off < data.size(); off += bb) {
          const uint16_t h = Fp32ToFp16(0.01f);
          const size_t at = type == DType::kQ6_K ? 208 : 0;
          std::memcpy(&data[off + at], &h, 2);
          if (type == DType::kQ4_1 || type == DType::kQ4_K) std::memcpy(&data[off + 2], &h, 2);
        }
      }
      MatrixView w{.type = type, .data = data.data(), .rows = rows, .cols = cols};
      std::vector<float> wf(rows * cols);
      for (int64_t r = 0; r < rows; ++r) DequantizeRow(type, w.Row(r), wf.data() + r * cols, cols);
      for (int64_t m : {1, 3, 33}) {
        auto x = Randn(m * cols, 10 + m);
        std::vector<double> want(m * rows, 0.0);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t k = 0; k < cols; ++k) want[i * rows + r] += double(x[i * cols + k]) * wf[r * cols + k];
        std::vector<float> gemm(m * rows), gemv(m * rows);
        MatMulWithPath(w, x.data(), m, gemm.data(), pool, MatMulPath::kGemm);
        MatMulWithPath(w, x.data(), m, gemv.data(), pool, MatMulPath::kGemv);
        // BF16 weights may take BF16 dot products (Bf16WeightsTakeBf16DotProducts): the
        // activations rounded to BF16.
        const bool bf16_products = type == DType::kBF16 && ActiveCpuIsa() >= CpuIsa::kAvx512Bf16;
        EXPECT_LT(MaxRelErr(gemm, want), bf16_products ? 5e-3 : 1e-5)
            << DTypeName(type) << " gemm rows=" << rows << " m=" << m;
        // GEMV on quantised weights quantises activations to int8: about 1% of the scale
        const bool quantised = Traits(type).block_elems > 1;
        EXPECT_LT(MaxRelErr(gemv, want), quantised ? 2e-2 : 1e-5) << DTypeName(type) << " gemv rows=" << rows;
        if (!quantised) {
          // int8 activations are for quantised weights: float weights take the same path either way
          std::vector<float> int8(m * rows), f32(m * rows);
          MatMul(w, x.data(), m, int8.data(), pool, /*int8_activations=*/true);
          MatMul(w, x.data(), m, f32.data(), pool, /*int8_activations=*/false);
          EXPECT_EQ(int8, f32) << DTypeName(type) << " rows=" << rows << " m=" << m;
        }
      }
    }
  }
}

TEST(MatMul, PathsAgreeWithReference) { testing::AtEveryCpuLevel(CheckMatMulPaths); }

// Half conversions equal the scalar base/fp16.h ones bit for bit (vector loops and
// tails, subnormals, infinities and NaN included), at every CPU level.
TEST(HalfRows, ConversionsEqualScalar) {
  std::vector<float> x = Randn(37, 9);
  for (float special : {0.0f, -0.0f, 1e-6f, -3e-8f, 65504.0f, 70000.0f, 1e30f, -1e-40f,
                        std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    x.push_back(special);
  }
  const int64_t n = static_cast<int64_t>(x.size());
  testing::AtEveryCpuLevel([&] {
    for (DType t : {DType::kF16, DType::kBF16}) {
      std::vector<uint16_t> h(n);
      std::vector<float> back(n);
      F32ToHalf(t, x.data(), h.data(), n);
      HalfToF32(t, h.data(), back.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t want = t == DType::kF16 ? Fp32ToFp16(x[i]) : Fp32ToBf16(x[i]);
        ASSERT_EQ(h[i], want) << DTypeName(t) << " " << x[i];
        const float wf = t == DType::kF16 ? Fp16ToFp32(want) : Bf16ToFp32(want);
        ASSERT_EQ(std::memcmp(&back[i], &wf, 4), 0) << DTypeName(t) << " " << x[i];
      }
      const int64_t finite = 37;  // dot and axpy over the random values only
      std::vector<float> y = Randn(finite, 10), y2 = y;
      double dot = 0;
      for (int64_t i = 0; i < finite; ++i) {
        dot += double(back[i]) * y[i];
        y2[i] += 0.5f * back[i];
      }
      EXPECT_NEAR(DotHalf(t, h.data(), y.data(), finite), dot, 1e-5 * (1 + std::fabs(dot)));
      AxpyHalf(t, 0.5f, h.data(), y.data(), finite);
      for (int64_t i = 0; i < finite; ++i) ASSERT_NEAR(y[i], y2[i], 1e-6f * (1 + std::fabs(y2[i]))) << i;
    }
  });
}

}  // namespace
}  // namespace ps
