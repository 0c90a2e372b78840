// Comparing a kernel's floats with a reference in doubles, for the kernel tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace ps::testing {

// The largest difference between got and want, relative to want's largest magnitude.
inline double MaxRelErr(const std::vector<float>& got, const std::vector<double>& want) {
  double scale = 1e-12, err = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::fabs(got[i] - want[i]));
  return err / scale;
}

}  // namespace ps::testing
