#include "kernels/cpu/rope.h"

#include <cmath>

namespace ps {

void RopeCache(const RopeParams& p, int32_t pos, float* cos_sin) {
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_dims));
  float theta = static_cast<float>(pos);
  for (int i = 0; i < p.n_dims / 2; ++i) {
    const float ff = p.freq_factors.empty() ? 1.0f : p.freq_factors[i];
    const float t = p.freq_scale * (theta / ff);
    cos_sin[2 * i] = std::cos(t);
    cos_sin[2 * i + 1] = std::sin(t);
    theta *= theta_scale;
  }
}

void RopeApply(const RopeParams& p, const float* cos_sin, float* x, int n_heads, int head_dim) {
  const int half = p.n_dims / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const int a = p.neox ? i : 2 * i;
      const int b = p.neox ? i + half : 2 * i + 1;
      const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * c - x1 * s;
      v[b] = x0 * s + x1 * c;
    }
  }
}

}  // namespace ps
