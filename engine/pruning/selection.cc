#include "engine/pruning/selection.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/status.h"

namespace ps {

int64_t KeepCount(double fraction, int64_t n) {
  if (n <= 0) return 0;
  // Fractions come as floats (0.2f is 0.2000000030): forgive their rounding error.
  const double x = fraction * static_cast<double>(n);
  const auto k = static_cast<int64_t>(std::ceil(x - 1e-6 * x));
  return std::clamp<int64_t>(k, 1, n);
}

std::vector<int32_t> TopKInOrder(std::span<const float> scores, int64_t k) {
  const auto n = static_cast<int64_t>(scores.size());
  k = std::clamp<int64_t>(k, 0, n);
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); };
  std::nth_element(idx.begin(), idx.begin() + k, idx.end(), better);
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<float> AvgPool1d(std::span<const float> x, int kernel) {
  PS_CHECK(kernel >= 1 && kernel % 2 == 1) << "pooling kernel must be odd, got " << kernel;
  const auto n = static_cast<int64_t>(x.size());
  const int half = kernel / 2;
  std::vector<float> out(n);
  double window = 0;  // running sum of x[i - half .. i + half] inside the input
  for (int64_t j = 0; j < std::min<int64_t>(half, n); ++j) window += x[j];
  for (int64_t i = 0; i < n; ++i) {
    if (i + half < n) window += x[i + half];
    if (i - half - 1 >= 0) window -= x[i - half - 1];
    out[i] = static_cast<float>(window / kernel);
  }
  return out;
}

}  // namespace ps
