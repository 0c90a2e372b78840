// Token selection math shared by the strategies: keep counts, top-k with the
// original order restored, average pooling.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ps {

// Tokens kept out of n for a keep fraction in (0, 1]: ceil(fraction * n) (up to float
// rounding of the fraction: 0.2f of 5 is 1), at least 1.
int64_t KeepCount(double fraction, int64_t n);

// Indices of the k largest scores (ties: the lower index first), returned in
// ascending index order. k is clamped to [0, scores.size()].
std::vector<int32_t> TopKInOrder(std::span<const float> scores, int64_t k);

// Stride-1 average pooling with `kernel` (odd) and zero padding of kernel/2 on
// both sides, dividing by `kernel` everywhere (PyTorch's avg_pool1d with
// count_include_pad, as GemFilter uses it). Output has the input's length.
std::vector<float> AvgPool1d(std::span<const float> x, int kernel);

}  // namespace ps
