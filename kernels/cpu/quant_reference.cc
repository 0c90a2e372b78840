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
  if (avx2::Available()) return avx2::DotF32Act(type, row, x, block_sums, n);
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

void DequantizeRow(DType type, const void* row, float* out, int64_t n) {
  if (type == DType::kF16 || type == DType::kBF16) return HalfToF32(type, static_cast<const uint16_t*>(row), out, n);
  if (avx512::Available() && avx512::Supports(type)) return avx512::DequantizeRow(type, row, out, n);
  reference::DequantizeRow(type, row, out, n);
}

float DotQ8(DType type, const void* row, const BlockQ8* x, int64_t n) {
  if (avx2::Available()) return avx2::DotQ8(type, row, x, n);
  return reference::DotQ8(type, row, x, n);
}

}  // namespace ps
