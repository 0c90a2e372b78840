// Scalar reference implementations of the block formats; the SIMD kernels are
// tested against these.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/fp16.h"
#include "base/status.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/cpu/quant.h"

namespace ps {
namespace {

// Unpacks the 6-bit quants of a Q6_K super-block to values in [-32, 31].
void UnpackQ6K(const BlockQ6_K& b, int8_t* q) {
  const uint8_t* ql = b.ql;
  const uint8_t* qh = b.qh;
  for (int n = 0; n < kQK_K; n += 128) {
    for (int l = 0; l < 32; ++l) {
      q[n + l + 0] = static_cast<int8_t>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
      q[n + l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
      q[n + l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      q[n + l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
    ql += 64;
    qh += 32;
  }
}

// The 32 five-bit quants (0..31) of a Q5_0 / Q5_1 block.
void UnpackQ5(const uint8_t* qh_bytes, const uint8_t* qs, int* q) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (int j = 0; j < 16; ++j) {
    q[j] = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
    q[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
  }
}

// A Q2_K / Q3_K / Q5_K super-block as 256 quants and, per 16 elements, a scale and a
// minimum: element = scale[e / 16] * q[e] - min[e / 16] (llama.cpp's order of operations).
void UnpackK(DType type, const void* block, int* q, float* scale, float* min) {
  if (type == DType::kQ5_K) {
    const auto& b = *static_cast<const BlockQ5_K*>(block);
    const float d = Fp16ToFp32(b.d), dmin = Fp16ToFp32(b.dmin);
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      Q4KScaleMin(s, b.scales, &sc, &m);
      scale[2 * s] = scale[2 * s + 1] = d * sc;
      min[2 * s] = min[2 * s + 1] = dmin * m;
      for (int l = 0; l < 32; ++l) {
        q[32 * s + l] = ((b.qs[(s / 2) * 32 + l] >> (4 * (s & 1))) & 0xF) | (((b.qh[l] >> s) & 1) << 4);
      }
    }
    return;
  }
  // Q2_K and Q3_K: element e has its two low bits in byte (e / 128) * 32 + e % 32, at shift 2 * ((e % 128) / 32).
  const bool q3 = type == DType::kQ3_K;
  const uint8_t* qs = q3 ? static_cast<const BlockQ3_K*>(block)->qs : static_cast<const BlockQ2_K*>(block)->qs;
  for (int e = 0; e < kQK_K; ++e) q[e] = (qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
  if (q3) {
    const auto& b = *static_cast<const BlockQ3_K*>(block);
    for (int e = 0; e < kQK_K; ++e) q[e] -= (b.hmask[e % 32] >> (e / 32)) & 1 ? 0 : 4;
    int8_t sc[16];
    Q3KScales(b.scales, sc);
    const float d = Fp16ToFp32(b.d);
    for (int g = 0; g < 16; ++g) scale[g] = d * sc[g], min[g] = 0.0f;
  } else {
    const auto& b = *static_cast<const BlockQ2_K*>(block);
    const float d = Fp16ToFp32(b.d), dmin = Fp16ToFp32(b.dmin);
    for (int g = 0; g < 16; ++g) scale[g] = d * (b.scales[g] & 0xF), min[g] = dmin * (b.scales[g] >> 4);
  }
}

}  // namespace

namespace reference {

void DequantizeRow(DType type, const void* row, float* out, int64_t n) {
  switch (type) {
    case DType::kF32: std::memcpy(out, row, n * sizeof(float)); return;
    case DType::kF16: {
      const auto* h = static_cast<const uint16_t*>(row);
      for (int64_t i = 0; i < n; ++i) out[i] = Fp16ToFp32(h[i]);
      return;
    }
    case DType::kBF16: {
      const auto* h = static_cast<const uint16_t*>(row);
      for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFp32(h[i]);
      return;
    }
    case DType::kQ4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(row);
      for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
        const float d = Fp16ToFp32(b[i].d);
        for (int j = 0; j < kQK / 2; ++j) {
          out[j] = ((b[i].qs[j] & 0xF) - 8) * d;
          out[j + 16] = ((b[i].qs[j] >> 4) - 8) * d;
        }
      }
      return;
    }
    case DType::kQ4_1: {
      const auto* b = static_cast<const BlockQ4_1*>(row);
      for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
        const float d = Fp16ToFp32(b[i].d), m = Fp16ToFp32(b[i].m);
        for (int j = 0; j < kQK / 2; ++j) {
          out[j] = (b[i].qs[j] & 0xF) * d + m;
          out[j + 16] = (b[i].qs[j] >> 4) * d + m;
        }
      }
      return;
    }
    case DType::kQ8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(row);
      for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
        const float d = Fp16ToFp32(b[i].d);
        for (int j = 0; j < kQK; ++j) out[j] = b[i].qs[j] * d;
      }
      return;
    }
    case DType::kQ5_0: {
      const auto* b = static_cast<const BlockQ5_0*>(row);
      int q[kQK];
      for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
        UnpackQ5(b[i].qh, b[i].qs, q);
        const float d = Fp16ToFp32(b[i].d);
        for (int j = 0; j < kQK; ++j) out[j] = (q[j] - 16) * d;
      }
      return;
    }
    case DType::kQ5_1: {
      const auto* b = static_cast<const BlockQ5_1*>(row);
      int q[kQK];
      for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
        UnpackQ5(b[i].qh, b[i].qs, q);
        const float d = Fp16ToFp32(b[i].d), m = Fp16ToFp32(b[i].m);
        for (int j = 0; j < kQK; ++j) out[j] = q[j] * d + m;
      }
      return;
    }
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ5_K: {
      const size_t bytes = Traits(type).block_bytes;
      int q[kQK_K];
      float scale[16], min[16];
      for (int64_t i = 0; i < n / kQK_K; ++i) {
        UnpackK(type, static_cast<const uint8_t*>(row) + i * bytes, q, scale, min);
        for (int e = 0; e < kQK_K; ++e) *out++ = scale[e / 16] * q[e] - min[e / 16];
      }
      return;
    }
    case DType::kQ4_K: {
      const auto* b = static_cast<const BlockQ4_K*>(row);
      for (int64_t i = 0; i < n / kQK_K; ++i) {
        const float d = Fp16ToFp32(b[i].d), dmin = Fp16ToFp32(b[i].dmin);
        const uint8_t* q = b[i].qs;
        for (int j = 0; j < kQK_K / 64; ++j, q += 32) {
          int sc1, m1, sc2, m2;
          Q4KScaleMin(2 * j, b[i].scales, &sc1, &m1);
          Q4KScaleMin(2 * j + 1, b[i].scales, &sc2, &m2);
          for (int l = 0; l < 32; ++l) *out++ = d * sc1 * (q[l] & 0xF) - dmin * m1;
          for (int l = 0; l < 32; ++l) *out++ = d * sc2 * (q[l] >> 4) - dmin * m2;
        }
      }
      return;
    }
    case DType::kQ6_K: {
      const auto* b = static_cast<const BlockQ6_K*>(row);
      int8_t q[kQK_K];
      for (int64_t i = 0; i < n / kQK_K; ++i) {
        const float d = Fp16ToFp32(b[i].d);
        UnpackQ6K(b[i], q);
        for (int j = 0; j < kQK_K; ++j) *out++ = d * b[i].scales[j / 16] * q[j];
      }
      return;
    }
  }
  PS_CHECK(false) << "DequantizeRow: unsupported type " << static_cast<int>(type);
}

float DotQ8(DType type, const void* row, const BlockQ8* x, int64_t n) {
  double sum = 0;
  switch (type) {
    case DType::kQ4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(row);
      for (int64_t i = 0; i < n / kQK; ++i) {
        int acc = 0;
        for (int j = 0; j < 16; ++j) {
          acc += ((b[i].qs[j] & 0xF) - 8) * x[i].qs[j] + ((b[i].qs[j] >> 4) - 8) * x[i].qs[j + 16];
        }
        sum += static_cast<double>(Fp16ToFp32(b[i].d)) * x[i].d * acc;
      }
      break;
    }
    case DType::kQ4_1: {
      const auto* b = static_cast<const BlockQ4_1*>(row);
      for (int64_t i = 0; i < n / kQK; ++i) {
        int acc = 0;
        for (int j = 0; j < 16; ++j) {
          acc += (b[i].qs[j] & 0xF) * x[i].qs[j] + (b[i].qs[j] >> 4) * x[i].qs[j + 16];
        }
        sum +=
            static_cast<double>(Fp16ToFp32(b[i].d)) * x[i].d * acc + static_cast<double>(Fp16ToFp32(b[i].m)) * x[i].s;
      }
      break;
    }
    case DType::kQ8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(row);
      for (int64_t i = 0; i < n / kQK; ++i) {
        int acc = 0;
        for (int j = 0; j < kQK; ++j) acc += b[i].qs[j] * x[i].qs[j];
        sum += static_cast<double>(Fp16ToFp32(b[i].d)) * x[i].d * acc;
      }
      break;
    }
    case DType::kQ4_K: {
      const auto* b = static_cast<const BlockQ4_K*>(row);
      for (int64_t i = 0; i < n / kQK_K; ++i) {
        const double d = Fp16ToFp32(b[i].d), dmin = Fp16ToFp32(b[i].dmin);
        const BlockQ8* xb = x + i * (kQK_K / kQK);
        for (int j = 0; j < 8; ++j) {  // sub-blocks of 32
          int sc, m;
          Q4KScaleMin(j, b[i].scales, &sc, &m);
          const uint8_t* q = b[i].qs + (j / 2) * 32;
          int acc = 0;
          for (int l = 0; l < 32; ++l) acc += ((j & 1) ? (q[l] >> 4) : (q[l] & 0xF)) * xb[j].qs[l];
          sum += d * sc * xb[j].d * acc - dmin * m * xb[j].s;
        }
      }
      break;
    }
    case DType::kQ6_K: {
      const auto* b = static_cast<const BlockQ6_K*>(row);
      int8_t q[kQK_K];
      for (int64_t i = 0; i < n / kQK_K; ++i) {
        UnpackQ6K(b[i], q);
        const double d = Fp16ToFp32(b[i].d);
        const BlockQ8* xb = x + i * (kQK_K / kQK);
        for (int g = 0; g < kQK_K / 16; ++g) {
          int acc = 0;
          for (int l = 0; l < 16; ++l) acc += q[g * 16 + l] * xb[g / 2].qs[(g % 2) * 16 + l];
          sum += d * b[i].scales[g] * xb[g / 2].d * acc;
        }
      }
      break;
    }
    case DType::kQ5_0:
    case DType::kQ5_1: {
      const bool q5_1 = type == DType::kQ5_1;
      const size_t bytes = Traits(type).block_bytes;
      int q[kQK];
      for (int64_t i = 0; i < n / kQK; ++i) {
        const uint8_t* blk = static_cast<const uint8_t*>(row) + i * bytes;
        const auto& b0 = *reinterpret_cast<const BlockQ5_0*>(blk);
        const auto& b1 = *reinterpret_cast<const BlockQ5_1*>(blk);
        UnpackQ5(q5_1 ? b1.qh : b0.qh, q5_1 ? b1.qs : b0.qs, q);
        int acc = 0;
        for (int j = 0; j < kQK; ++j) acc += (q[j] - (q5_1 ? 0 : 16)) * x[i].qs[j];
        sum += static_cast<double>(Fp16ToFp32(b0.d)) * x[i].d * acc;
        if (q5_1) sum += static_cast<double>(Fp16ToFp32(b1.m)) * x[i].s;
      }
      break;
    }
    case DType::kQ5_K: {  // minimums through the activation blocks' sums, as Q4_K
      int q[kQK_K];
      float scale[16], min[16];
      for (int64_t i = 0; i < n / kQK_K; ++i) {
        UnpackK(type, static_cast<const BlockQ5_K*>(row) + i, q, scale, min);
        const BlockQ8* xb = x + i * (kQK_K / kQK);
        for (int s = 0; s < 8; ++s) {
          int acc = 0;
          for (int l = 0; l < 32; ++l) acc += q[32 * s + l] * xb[s].qs[l];
          sum += static_cast<double>(scale[2 * s]) * xb[s].d * acc - static_cast<double>(min[2 * s]) * xb[s].s;
        }
      }
      break;
    }
    case DType::kQ2_K:
    case DType::kQ3_K: {
      const size_t bytes = Traits(type).block_bytes;
      int q[kQK_K];
      float scale[16], min[16];
      for (int64_t i = 0; i < n / kQK_K; ++i) {
        UnpackK(type, static_cast<const uint8_t*>(row) + i * bytes, q, scale, min);
        const BlockQ8* xb = x + i * (kQK_K / kQK);
        for (int g = 0; g < 16; ++g) {
          const int8_t* xq = xb[g / 2].qs + (g % 2) * 16;
          int acc = 0, xsum = 0;
          for (int l = 0; l < 16; ++l) acc += q[16 * g + l] * xq[l], xsum += xq[l];
          sum += static_cast<double>(xb[g / 2].d) * (static_cast<double>(scale[g]) * acc - min[g] * xsum);
        }
      }
      break;
    }
    default: PS_CHECK(false) << "DotQ8: unsupported type " << static_cast<int>(type);
  }
  return static_cast<float>(sum);
}

float DotF32Act(DType type, const void* row, const float* x, int64_t n) {
  std::vector<float> w(n);
  reference::DequantizeRow(type, row, w.data(), n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(w[i]) * x[i];
  return static_cast<float>(sum);
}

}  // namespace reference

void BlockSums(const float* x, float* sums, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    float s = 0;
    for (int j = 0; j < kQK; ++j) s += x[b * kQK + j];
    sums[b] = s;
  }
}

float DotF32Act(DType type, const void* row, const float* x, const float* block_sums, int64_t n) {
  if (avx512::Available() && avx512::Supports(type)) return avx512::DotF32Act(type, row, x, block_sums, n);
  if (avx2::Available() && avx2::Supports(type)) return avx2::DotF32Act(type, row, x, block_sums, n);
  return reference::DotF32Act(type, row, x, n);
}

void QuantizeRowQ8(const float* x, BlockQ8* out, int64_t n) {
  if (avx2::Available()) return avx2::QuantizeRowQ8(x, out, n);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float amax = 0;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 127.0f / amax : 0.0f;  // llama.cpp divides by amax, not by d
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      out[i].qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
      sum += out[i].qs[j];
    }
    out[i].d = Fp16ToFp32(Fp32ToFp16(d));  // stored as fp16, as llama.cpp does
    out[i].s = Fp16ToFp32(Fp32ToFp16(d * sum));
  }
}

void QuantizeRowQ8_0(const float* x, BlockQ8_0* out, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float amax = 0;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < kQK; ++j) out[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
    out[i].d = Fp32ToFp16(d);
  }
}

void DequantizeRow(DType type, const void* row, float* out, int64_t n) {
  if (type == DType::kF16 || type == DType::kBF16) return HalfToF32(type, static_cast<const uint16_t*>(row), out, n);
  if (avx512::Available() && avx512::Supports(type)) return avx512::DequantizeRow(type, row, out, n);
  if (avx2::Available() && avx2::Supports(type)) return avx2::DequantizeRow(type, row, out, n);
  reference::DequantizeRow(type, row, out, n);
}

float DotQ8(DType type, const void* row, const BlockQ8* x, int64_t n) {
  if (avx2::Available() && avx2::Supports(type)) return avx2::DotQ8(type, row, x, n);
  return reference::DotQ8(type, row, x, n);
}

}  // namespace ps
