// A synthetic calibration for tests (PoD's layer groups): KV head h's layers a and b
// diverge by (0.1 + 0.05 h) |a - b|, so at the default delta 0.25 head 0 groups its
// layers in threes, heads 1 and 2 in pairs, and head 3 not at all.
#pragma once

#include <cmath>
#include <memory>

#include "engine/pruning/calibration.h"

namespace ps::testing {

inline CalibrationPtr TestCalibration(const ModelConfig& config) {
  Calibration c{.model = config.name, .n_layers = config.n_layers, .n_kv_heads = config.n_kv_heads};
  for (int h = 0; h < config.n_kv_heads; ++h) {
    auto& sim = c.similarity.emplace_back(config.n_layers, std::vector<double>(config.n_layers, 1.0));
    for (int a = 0; a < config.n_layers; ++a) {
      for (int b = 0; b < config.n_layers; ++b) sim[a][b] = std::max(0.0, 1.0 - (0.1 + 0.05 * h) * std::abs(a - b));
    }
  }
  c.Regroup(0.25);
  return std::make_shared<const Calibration>(std::move(c));
}

}  // namespace ps::testing
