// Seeded random inputs for the kernel tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "base/fp16.h"
#include "kernels/cpu/quant.h"

namespace ps::testing {

// n standard-normal floats from a generator seeded with `seed`.
inline std::vector<float> Randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g;
  std::vector<float> v(n);
  for (float& x : v) x = g(rng);
  return v;
}

// Random bytes for a row of `type` with sane (finite, small) fp16 scales.
inline std::vector<uint8_t> RandomRow(DType type, int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> row(RowBytes(type, n));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : row) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  auto set_half = [&](uint8_t* p) {
    const uint16_t h = Fp32ToFp16(scale(rng));
    std::memcpy(p, &h, 2);
  };
  const size_t bb = Traits(type).block_bytes;
  for (size_t off = 0; off < row.size(); off += bb) {
    uint8_t* b = row.data() + off;
    switch (type) {
      case DType::kQ4_0:
      case DType::kQ5_0:
      case DType::kQ8_0: set_half(b); break;
      case DType::kQ4_1:
      case DType::kQ5_1:
      case DType::kQ4_K:
      case DType::kQ5_K:
        set_half(b);
        set_half(b + 2);
        break;
      case DType::kQ2_K:
        set_half(b + 80);
        set_half(b + 82);
        break;
      case DType::kQ3_K: set_half(b + 108); break;
      case DType::kQ6_K: set_half(b + 208); break;
      default: break;
    }
  }
  return row;
}

}  // namespace ps::testing
