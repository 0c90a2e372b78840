// CPU kernels against simple references at awkward sizes.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/fp16.h"
#include "gtest/gtest.h"
#include "tests/kernels/random.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/vec.h"

namespace ps {
namespace {

using testing::Randn;

double MaxRelErr(const std::vector<float>& got, const std::vector<double>& want) {
  double scale = 1e-12, err = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::fabs(got[i] - want[i]));
  return err / scale;
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
    EXPECT_NEAR(DotF16F32(h.data(), b.data(), n), doth, 1e-4 * (1 + std::fabs(doth)));

    std::vector<float> e = a;
    ExpInPlace(e.data(), n);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(e[i], std::exp(double(a[i])), 3e-7 * std::exp(double(a[i])));

    std::vector<float> s = a;
    SoftmaxInPlace(s.data(), n);
    double m = -1e30, sum = 0;
    for (float v : a) m = std::max<double>(m, v);
    for (float v : a) sum += std::exp(v - m);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(s[i], std::exp(a[i] - m) / sum, 1e-6);

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
TEST(MatMul, PathsAgreeWithReference) {
  ThreadPool pool(2);
  std::mt19937 rng(5);
  for (DType type : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kQ4_K,
                     DType::kQ6_K}) {
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
        EXPECT_LT(MaxRelErr(gemm, want), 1e-5) << DTypeName(type) << " gemm rows=" << rows << " m=" << m;
        // GEMV on quantised weights quantises activations to int8: about 1% of the scale
        const bool quantised = Traits(type).block_elems > 1;
        EXPECT_LT(MaxRelErr(gemv, want), quantised ? 2e-2 : 1e-5) << DTypeName(type) << " gemv rows=" << rows;
      }
    }
  }
}

// Attention over arbitrary (unsorted) KV positions against a direct computation,
// with the cache contiguous (one block) and paged (blocks of 16 and of 7 rows).
TEST(Attention, MatchesNaiveWithCausalMaskByPosition) {
  ThreadPool pool(2);
  const AttentionShape s{.n_heads = 6, .n_kv_heads = 2, .head_dim = 8, .scale = 0.35f};
  for (int64_t block_rows : {50, 16, 7})
  for (int64_t nq : {1, 5, 40}) {
    const int64_t nkv = 50;
    auto q = Randn(nq * 48, 1), k = Randn(nkv * 16, 2), v = Randn(nkv * 16, 3);
    std::vector<int32_t> kv_pos(nkv), q_pos(nq);
    for (int64_t j = 0; j < nkv; ++j) kv_pos[j] = static_cast<int32_t>((j * 7) % nkv);  // a permutation
    for (int64_t i = 0; i < nq; ++i) q_pos[i] = static_cast<int32_t>(nkv - nq + i);
    std::vector<float> out(nq * 48), probs(nkv);
    // Every block in its own allocation: the kernel must follow the block table.
    std::vector<std::vector<float>> kb, vb;
    std::vector<const float*> kp, vp;
    for (int64_t b = 0; b * block_rows < nkv; ++b) {
      const int64_t rows = std::min(block_rows, nkv - b * block_rows);
      kb.emplace_back(k.begin() + b * block_rows * 16, k.begin() + (b * block_rows + rows) * 16);
      vb.emplace_back(v.begin() + b * block_rows * 16, v.begin() + (b * block_rows + rows) * 16);
    }
    for (size_t b = 0; b < kb.size(); ++b) kp.push_back(kb[b].data()), vp.push_back(vb[b].data());
    Attention(s, KvRows{.k_blocks = kp.data(), .v_blocks = vp.data(), .block_rows = block_rows,
                        .positions = kv_pos.data(), .n = nkv, .stride = 16},
              AttentionArgs{.q = q.data(), .q_pos = q_pos.data(), .n_q = nq, .q_stride = 48, .out = out.data(),
                            .out_stride = 48, .last_query_probs = probs.data()},
              pool);
    std::vector<double> want(nq * 48, 0.0), want_probs(nkv, 0.0);
    for (int64_t i = 0; i < nq; ++i) {
      for (int h = 0; h < 6; ++h) {
        const int kvh = h / 3;
        std::vector<double> sc(nkv);
        double m = -1e300, sum = 0;
        for (int64_t j = 0; j < nkv; ++j) {
          double d = 0;
          for (int e = 0; e < 8; ++e) d += double(q[i * 48 + h * 8 + e]) * k[j * 16 + kvh * 8 + e];
          sc[j] = kv_pos[j] <= q_pos[i] ? d * 0.35 : -1e300;
          m = std::max(m, sc[j]);
        }
        for (auto& x : sc) sum += (x = (x == -1e300 ? 0 : std::exp(x - m)));
        for (int64_t j = 0; j < nkv; ++j) {
          for (int e = 0; e < 8; ++e) want[i * 48 + h * 8 + e] += sc[j] / sum * v[j * 16 + kvh * 8 + e];
          if (i == nq - 1) want_probs[j] += sc[j] / sum / 6;
        }
      }
    }
    EXPECT_LT(MaxRelErr(out, want), 1e-5) << "nq=" << nq << " block_rows=" << block_rows;
    EXPECT_LT(MaxRelErr(probs, want_probs), 1e-5) << "nq=" << nq << " block_rows=" << block_rows;
  }
}

}  // namespace
}  // namespace ps
