// Quantised formats: SIMD dot products and dequantisation against the scalar
// reference on random blocks, and the reference against an independent decoding
// of the bit layout.
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <random>
#include <vector>

#include "base/fp16.h"
#include "gtest/gtest.h"
#include "kernels/cpu/quant.h"
#include "tests/kernels/random.h"

namespace ps {
namespace {

using testing::RandomRow;

std::vector<float> RandomFloats(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = g(rng);
  return x;
}

class QuantTypes : public ::testing::TestWithParam<DType> {};

TEST_P(QuantTypes, SimdDotEqualsReference) {
  const DType type = GetParam();
  if (!avx2::Available()) GTEST_SKIP() << "no AVX2 on this CPU";
  const bool simd = avx2::Supports(type);  // otherwise the dispatcher must fall back to the reference
  std::mt19937 rng(42);
  const int64_t block = Traits(type).block_elems;
  for (int64_t blocks : {1, 3, 17, 40}) {  // odd lengths included
    const int64_t n = blocks * block;
    const auto row = RandomRow(type, n, rng);
    const auto x = RandomFloats(n, rng);
    std::vector<BlockQ8> xq(n / kQK);
    QuantizeRowQ8(x.data(), xq.data(), n);
    const float ref = reference::DotQ8(type, row.data(), xq.data(), n);
    if (!simd) {
      EXPECT_EQ(DotQ8(type, row.data(), xq.data(), n), ref) << DTypeName(type) << " n=" << n;
      continue;
    }
    const float got = avx2::DotQ8(type, row.data(), xq.data(), n);
    EXPECT_NEAR(got, ref, 1e-5f * (1.0f + std::fabs(ref))) << DTypeName(type) << " n=" << n;
  }
}

TEST_P(QuantTypes, MultiRowDotsEqualReference) {
  // avx2::DotQ8Rows: one weight row against 1..9 activation rows (groups of four and tails).
  const DType type = GetParam();
  if (!avx2::Available()) GTEST_SKIP() << "no AVX2 on this CPU";
  if (!avx2::Supports(type)) GTEST_SKIP() << DTypeName(type) << ": MatMul keeps the per-row scalar path";
  std::mt19937 rng(45);
  const int64_t n = 3 * Traits(type).block_elems, blocks = n / kQK;
  const auto row = RandomRow(type, n, rng);
  for (int64_t m : {1, 4, 9}) {
    const auto x = RandomFloats(m * n, rng);
    std::vector<BlockQ8> xq(m * blocks);
    for (int64_t i = 0; i < m; ++i) QuantizeRowQ8(x.data() + i * n, xq.data() + i * blocks, n);
    std::vector<float> out(2 * m, -1.0f);
    avx2::DotQ8Rows(type, row.data(), xq.data(), blocks, m, n, out.data(), 2);
    for (int64_t i = 0; i < m; ++i) {
      // The same float arithmetic as the one-row kernel; the double reference within float
      // rounding of terms that cancel (the K formats' minimums).
      const float ref = reference::DotQ8(type, row.data(), xq.data() + i * blocks, n);
      const float one = avx2::DotQ8(type, row.data(), xq.data() + i * blocks, n);
      EXPECT_NEAR(out[2 * i], one, 1e-5f * (1.0f + std::fabs(one))) << DTypeName(type) << " m=" << m << " row " << i;
      EXPECT_NEAR(out[2 * i], ref, 1e-4f * (1.0f + std::fabs(ref))) << DTypeName(type) << " m=" << m << " row " << i;
      EXPECT_EQ(out[2 * i + 1], -1.0f) << "wrote outside its stride";
    }
  }
}

TEST_P(QuantTypes, F32ActivationDotsEqualReference) {
  const DType type = GetParam();
  std::mt19937 rng(43);
  const int64_t block = Traits(type).block_elems;
  for (int64_t blocks : {1, 3, 17, 40}) {
    const int64_t n = blocks * block;
    const auto row = RandomRow(type, n, rng);
    const auto x = RandomFloats(n, rng);
    std::vector<float> sums(n / kQK);
    BlockSums(x.data(), sums.data(), n);
    const float ref = reference::DotF32Act(type, row.data(), x.data(), n);
    const float tol = 2e-5f * (1.0f + std::fabs(ref));
    EXPECT_NEAR(DotF32Act(type, row.data(), x.data(), sums.data(), n), ref, tol) << DTypeName(type) << " n=" << n;
    if (avx2::Available() && avx2::Supports(type)) {
      EXPECT_NEAR(avx2::DotF32Act(type, row.data(), x.data(), sums.data(), n), ref, tol) << "avx2 " << n;
    }
    if (avx512::Available() && avx512::Supports(type)) {
      EXPECT_NEAR(avx512::DotF32Act(type, row.data(), x.data(), sums.data(), n), ref, tol) << "avx512 " << n;
    }
  }
}

TEST_P(QuantTypes, DequantiseEqualsReferenceBitForBit) {
  const DType type = GetParam();
  std::mt19937 rng(44);
  for (int64_t blocks : {1, 3, 17}) {
    const int64_t n = blocks * Traits(type).block_elems;
    const auto row = RandomRow(type, n, rng);
    std::vector<float> ref(n), got(n);
    reference::DequantizeRow(type, row.data(), ref.data(), n);
    DequantizeRow(type, row.data(), got.data(), n);  // the dispatched (SIMD where there is one) version
    EXPECT_EQ(std::memcmp(ref.data(), got.data(), n * sizeof(float)), 0) << DTypeName(type) << " n=" << n;
    if (avx2::Available() && avx2::Supports(type)) {
      avx2::DequantizeRow(type, row.data(), got.data(), n);
      EXPECT_EQ(std::memcmp(ref.data(), got.data(), n * sizeof(float)), 0) << "avx2 " << DTypeName(type) << " n=" << n;
    }
  }
}

TEST_P(QuantTypes, QuantisedDotApproximatesFloatDot) {
  // The activation quantisation error, measured: int8 activations vs F32 ones.
  const DType type = GetParam();
  std::mt19937 rng(7);
  const int64_t n = 8 * Traits(type).block_elems;
  const auto row = RandomRow(type, n, rng);
  const auto x = RandomFloats(n, rng);
  std::vector<float> w(n);
  reference::DequantizeRow(type, row.data(), w.data(), n);
  double exact = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) exact += double(w[i]) * x[i], norm += std::fabs(double(w[i]) * x[i]);
  std::vector<BlockQ8> xq(n / kQK);
  QuantizeRowQ8(x.data(), xq.data(), n);
  const float got = DotQ8(type, row.data(), xq.data(), n);
  // int8 rounding: each activation is off by at most amax/254 of its block.
  EXPECT_NEAR(got, exact, 0.01 * norm) << DTypeName(type);
}

INSTANTIATE_TEST_SUITE_P(All, QuantTypes,
                         ::testing::Values(DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0,
                                           DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(Quant, SimdActivationQuantisationEqualsScalar) {
  if (!avx2::Available()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(3);
  const auto x = RandomFloats(32 * 9, rng);
  std::vector<BlockQ8> a(9), b(9);
  avx2::QuantizeRowQ8(x.data(), a.data(), 32 * 9);
  // scalar version, written out
  for (int i = 0; i < 9; ++i) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[i * 32 + j]));
    const float d = amax / 127.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      b[i].qs[j] = static_cast<int8_t>(std::nearbyint(x[i * 32 + j] * (127.0f / amax)));
      sum += b[i].qs[j];
    }
    b[i].d = Fp16ToFp32(Fp32ToFp16(d));
    b[i].s = Fp16ToFp32(Fp32ToFp16(d * sum));
  }
  for (int i = 0; i < 9; ++i) {
    EXPECT_EQ(a[i].d, b[i].d);
    EXPECT_FLOAT_EQ(a[i].s, b[i].s);
    EXPECT_EQ(0, std::memcmp(a[i].qs, b[i].qs, 32)) << "block " << i;
  }
}

// Independent decodings of each layout, element by element.
TEST(Quant, DequantiseMatchesBitLayout) {
  std::mt19937 rng(11);
  {
    const auto row = RandomRow(DType::kQ4_0, 64, rng);
    std::vector<float> out(64);
    reference::DequantizeRow(DType::kQ4_0, row.data(), out.data(), 64);
    const auto* b = reinterpret_cast<const BlockQ4_0*>(row.data());
    EXPECT_EQ(out[33], ((b[1].qs[1] & 0xF) - 8) * Fp16ToFp32(b[1].d));
    EXPECT_EQ(out[49], ((b[1].qs[1] >> 4) - 8) * Fp16ToFp32(b[1].d));
  }
  {
    const auto row = RandomRow(DType::kQ4_1, 32, rng);
    std::vector<float> out(32);
    reference::DequantizeRow(DType::kQ4_1, row.data(), out.data(), 32);
    const auto* b = reinterpret_cast<const BlockQ4_1*>(row.data());
    EXPECT_EQ(out[20], (b->qs[4] >> 4) * Fp16ToFp32(b->d) + Fp16ToFp32(b->m));
  }
  {
    const auto row = RandomRow(DType::kQ8_0, 32, rng);
    std::vector<float> out(32);
    reference::DequantizeRow(DType::kQ8_0, row.data(), out.data(), 32);
    const auto* b = reinterpret_cast<const BlockQ8_0*>(row.data());
    EXPECT_EQ(out[31], b->qs[31] * Fp16ToFp32(b->d));
  }
  {
    // Q4_K: element 200 is in sub-block 6 (scale index 6 uses the high-bit packing),
    // low nibble of qs[3*32 + 8].
    const auto row = RandomRow(DType::kQ4_K, 256, rng);
    std::vector<float> out(256);
    reference::DequantizeRow(DType::kQ4_K, row.data(), out.data(), 256);
    const auto* b = reinterpret_cast<const BlockQ4_K*>(row.data());
    const int sc = (b->scales[10] & 0xF) | ((b->scales[2] >> 6) << 4);
    const int mn = (b->scales[10] >> 4) | ((b->scales[6] >> 6) << 4);
    EXPECT_FLOAT_EQ(out[200], Fp16ToFp32(b->d) * sc * (b->qs[3 * 32 + 8] & 0xF) - Fp16ToFp32(b->dmin) * mn);
  }
  {
    // Q6_K: element 150 = second half (128..255), l = 22 in the 4th quarter? 150-128 = 22 -> q1 group.
    const auto row = RandomRow(DType::kQ6_K, 256, rng);
    std::vector<float> out(256);
    reference::DequantizeRow(DType::kQ6_K, row.data(), out.data(), 256);
    const auto* b = reinterpret_cast<const BlockQ6_K*>(row.data());
    const int q = ((b->ql[64 + 22] & 0xF) | (((b->qh[32 + 22] >> 0) & 3) << 4)) - 32;
    EXPECT_FLOAT_EQ(out[150], Fp16ToFp32(b->d) * b->scales[8 + 22 / 16] * q);
  }
}

// The new formats, element by element from the bit layout as llama.cpp's
// dequantize_row_* functions read it.
TEST(Quant, Q5AndLowBitKQuantsMatchBitLayout) {
  std::mt19937 rng(12);
  {
    const auto row = RandomRow(DType::kQ5_0, 64, rng);
    std::vector<float> out(64);
    reference::DequantizeRow(DType::kQ5_0, row.data(), out.data(), 64);
    const auto* b = reinterpret_cast<const BlockQ5_0*>(row.data());
    uint32_t qh;
    std::memcpy(&qh, b[1].qh, 4);
    const int x0 = ((b[1].qs[3] & 0xF) | (((qh >> 3) << 4) & 0x10)) - 16;
    const int x1 = ((b[1].qs[3] >> 4) | ((qh >> (3 + 12)) & 0x10)) - 16;
    EXPECT_EQ(out[32 + 3], x0 * Fp16ToFp32(b[1].d));
    EXPECT_EQ(out[32 + 19], x1 * Fp16ToFp32(b[1].d));
  }
  {
    const auto row = RandomRow(DType::kQ5_1, 32, rng);
    std::vector<float> out(32);
    reference::DequantizeRow(DType::kQ5_1, row.data(), out.data(), 32);
    const auto* b = reinterpret_cast<const BlockQ5_1*>(row.data());
    uint32_t qh;
    std::memcpy(&qh, b->qh, 4);
    const int x1 = (b->qs[9] >> 4) | ((qh >> (9 + 12)) & 0x10);
    EXPECT_EQ(out[25], x1 * Fp16ToFp32(b->d) + Fp16ToFp32(b->m));
  }
  {
    // Q5_K element 200: j = 192 (third 64-group: ql += 96, u1 = 1 << 6), low nibble, l = 8.
    const auto row = RandomRow(DType::kQ5_K, 256, rng);
    std::vector<float> out(256);
    reference::DequantizeRow(DType::kQ5_K, row.data(), out.data(), 256);
    const auto* b = reinterpret_cast<const BlockQ5_K*>(row.data());
    const int sc = (b->scales[10] & 0xF) | ((b->scales[2] >> 6) << 4);
    const int mn = (b->scales[10] >> 4) | ((b->scales[6] >> 6) << 4);
    const int q = (b->qs[96 + 8] & 0xF) + ((b->qh[8] & (1 << 6)) ? 16 : 0);
    EXPECT_EQ(out[200], Fp16ToFp32(b->d) * sc * q - Fp16ToFp32(b->dmin) * mn);
  }
  {
    // Q2_K element 170: n = 128 (q += 32), j = 1 (shift 2), first half, l = 10; scale index 10.
    const auto row = RandomRow(DType::kQ2_K, 256, rng);
    std::vector<float> out(256);
    reference::DequantizeRow(DType::kQ2_K, row.data(), out.data(), 256);
    const auto* b = reinterpret_cast<const BlockQ2_K*>(row.data());
    const uint8_t sc = b->scales[10];
    const float dl = Fp16ToFp32(b->d) * (sc & 0xF), ml = Fp16ToFp32(b->dmin) * (sc >> 4);
    EXPECT_EQ(out[170], dl * ((b->qs[32 + 10] >> 2) & 3) - ml);
  }
  {
    // Q3_K element 170 as above, hmask bit m = 1 << 5; scales through llama.cpp's kmask unpacking.
    const auto row = RandomRow(DType::kQ3_K, 256, rng);
    std::vector<float> out(256);
    reference::DequantizeRow(DType::kQ3_K, row.data(), out.data(), 256);
    const auto* b = reinterpret_cast<const BlockQ3_K*>(row.data());
    uint32_t aux[4];
    std::memcpy(aux, b->scales, 12);
    const uint32_t tmp = aux[2], kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    const auto* scales = reinterpret_cast<const int8_t*>(aux);
    const float dl = Fp16ToFp32(b->d) * (scales[10] - 32);
    const int q = ((b->qs[32 + 10] >> 2) & 3) - ((b->hmask[10] & (1 << 5)) ? 0 : 4);
    EXPECT_EQ(out[170], dl * q);
  }
}

// gguf's Python dequantisation (tools/record_gguf_dequant_golden.py) of random blocks
// of every type, bit for bit. Its real-tensor counterpart is in eval_model_test.
TEST(Quant, DequantiseEqualsGgufPythonOnRandomBlocks) {
  std::ifstream in(std::string(PS_SOURCE_DIR) + "/tests/golden/gguf_dequant_random.tsv");
  ASSERT_TRUE(in) << "golden file missing";
  std::string line;
  std::set<std::string> types;
  auto hex_bytes = [](const std::string& h) {
    std::vector<uint8_t> out(h.size() / 2);
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(std::stoul(h.substr(2 * i, 2), nullptr, 16));
    return out;
  };
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line.starts_with("type\t")) continue;
    std::vector<std::string> f;
    for (size_t a = 0, b; a <= line.size(); a = b + 1) {
      b = std::min(line.find('\t', a), line.size());
      f.push_back(line.substr(a, b - a));
    }
    ASSERT_EQ(f.size(), 4u);
    DType type = DType::kF32;
    for (uint32_t id = 0; id < 64; ++id) {
      if (const DTypeTraits* t = FindDType(id); t != nullptr && t->name == f[0]) type = static_cast<DType>(id);
    }
    ASSERT_NE(type, DType::kF32) << "unknown type " << f[0];
    types.insert(f[0]);
    const std::vector<uint8_t> blocks = hex_bytes(f[2]);
    const int64_t n = static_cast<int64_t>(blocks.size() / Traits(type).block_bytes) * Traits(type).block_elems;
    std::vector<uint32_t> want;
    for (size_t a = 0; a < f[3].size(); a += 9) want.push_back(std::stoul(f[3].substr(a, 8), nullptr, 16));
    ASSERT_EQ(static_cast<int64_t>(want.size()), n) << f[0];
    std::vector<float> ref(n), got(n);
    reference::DequantizeRow(type, blocks.data(), ref.data(), n);
    DequantizeRow(type, blocks.data(), got.data(), n);
    EXPECT_EQ(std::memcmp(ref.data(), want.data(), n * 4), 0) << f[0] << ": reference differs from gguf";
    EXPECT_EQ(std::memcmp(got.data(), want.data(), n * 4), 0) << f[0] << ": dispatched kernel differs from gguf";
  }
  EXPECT_EQ(types.size(), 10u);  // every block type
}

TEST(Quant, Fp16AndBf16RoundTrip) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 1e-3f, 3.14159f}) {
    EXPECT_EQ(Fp16ToFp32(Fp32ToFp16(v)), Fp16ToFp32(Fp32ToFp16(Fp16ToFp32(Fp32ToFp16(v)))));
    EXPECT_NEAR(Fp16ToFp32(Fp32ToFp16(v)), v, std::fabs(v) * 1e-3 + 6e-8) << v;
    EXPECT_NEAR(Bf16ToFp32(Fp32ToBf16(v)), v, std::fabs(v) * 8e-3) << v;
  }
  // every half value survives half -> float -> half
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) continue;  // NaN payloads
    ASSERT_EQ(Fp32ToFp16(Fp16ToFp32(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

}  // namespace
}  // namespace ps
