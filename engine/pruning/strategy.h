// Per-request token pruning policy, called by the forward pass at fixed hooks.
// A sequence without a strategy (`full`) keeps every row at every layer.
// Strategies (LazyLLM, GemFilter, ...) subclass this; the engine never
// special-cases one.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace ps {

class PruningStrategy {
 public:
  virtual ~PruningStrategy() = default;
  virtual std::string_view name() const = 0;

  // Before layer `layer` (>= 1): `rows` holds the step-local indices of this
  // sequence's rows still active after layer-1. The strategy may remove entries
  // (pruning); order must stay ascending and the last row must stay.
  virtual void RowsForLayer(int layer, std::vector<int32_t>* rows) { (void)layer, (void)rows; }

  // Whether the forward pass should report the last query's attention
  // probabilities (mean over heads) at `layer` through AfterAttention.
  virtual bool WantsLastQueryProbs(int layer) const { (void)layer; return false; }
  // probs[i] belongs to the cached KV row with position kv_positions[i].
  virtual void AfterAttention(int layer, std::span<const float> probs, std::span<const int32_t> kv_positions) {
    (void)layer, (void)probs, (void)kv_positions;
  }
};

}  // namespace ps
