// Seeded random inputs for the kernel tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace ps::testing {

// n standard-normal floats from a generator seeded with `seed`.
inline std::vector<float> Randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g;
  std::vector<float> v(n);
  for (float& x : v) x = g(rng);
  return v;
}

}  // namespace ps::testing
