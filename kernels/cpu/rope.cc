#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

#include "kernels/shared_math.h"

namespace ps {

void RopeCache(const RopeParams& p, int32_t pos, float* cos_sin) {
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_dims));
  float theta = static_cast<float>(pos);
  for (int i = 0; i < p.n_dims / 2; ++i) {
    const float t = RopeAngle(theta, p.freq_factors.empty() ? 1.0f : p.freq_factors[i], p.freq_scale);
    cos_sin[2 * i] = std::cos(t);
    cos_sin[2 * i + 1] = std::sin(t);
    theta *= theta_scale;
  }
}

void RopeMeanCache(const RopeParams& p, int32_t positions, float* cos_sin) {
  const int n = p.n_dims;
  std::vector<double> sums(n, 0.0);
  std::vector<float> cs(n);
  for (int32_t pos = 0; pos < positions; ++pos) {
    RopeCache(p, pos, cs.data());
    for (int i = 0; i < n; ++i) sums[i] += cs[i];
  }
  for (int i = 0; i < n; ++i) cos_sin[i] = positions > 0 ? static_cast<float>(sums[i] / positions) : 0.0f;
}

void RopeApply(const RopeParams& p, const float* cos_sin, float* x, int n_heads, int head_dim) {
  const int half = p.n_dims / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      int a = 0, b = 0;
      RopePair(p.neox, i, half, &a, &b);
      RopeRotate(cos_sin[2 * i], cos_sin[2 * i + 1], &v[a], &v[b]);
    }
  }
}

}  // namespace ps
