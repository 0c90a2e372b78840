// Strategy parameters: per-model defaults, `key=value` parsing (server flags,
// CLI), validation with messages that name the field, and the factory.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/pruning/strategy.h"

namespace ps {

enum class StrategyKind { kFull, kLazyLlm, kGemFilter };
inline constexpr StrategyKind kAllStrategies[] = {StrategyKind::kFull, StrategyKind::kLazyLlm, StrategyKind::kGemFilter};
std::string_view StrategyName(StrategyKind k);
absl::StatusOr<StrategyKind> ParseStrategyName(std::string_view name);

struct LazyLlmParams {
  // Progressive schedule: before layers[i], keep the keep[i] fraction of the
  // context (layers ascending in [1, n_layers), keep non-increasing in (0, 1]).
  std::vector<int> layers;
  std::vector<float> keep;
};

struct GemFilterParams {
  int filter_layer = 0;  // layers 0..filter_layer score the prompt
  int top_k = 1024;      // prompt tokens kept (prompts of top_k or fewer run unchanged)
  int pool_kernel = 5;   // average pooling of the scores (odd)
  bool original_positions = false;  // kept tokens keep their positions (default: fresh, contiguous)
};

struct PruningParams {
  StrategyKind strategy = StrategyKind::kFull;
  LazyLlmParams lazyllm;
  GemFilterParams gemfilter;
};

// Defaults for a model (documented in README "Pruning strategies").
PruningParams DefaultPruningParams(const ModelConfig& config);

// Sets one parameter of `kind` from text ("layers=4,8,12", "keep=0.5,0.3,0.2",
// "filter_layer=12", "top_k=1024", "pool_kernel=5", "original_positions=true").
absl::Status SetStrategyArg(StrategyKind kind, std::string_view key, std::string_view value, PruningParams* params);
// Applies "key=value" items to `kind` (the strategy is selected too).
absl::Status ApplyStrategyArgs(StrategyKind kind, const std::vector<std::string>& args, PruningParams* params);
// The parameters of `kind` as key=value pairs, in SetStrategyArg's syntax.
std::vector<std::pair<std::string, std::string>> StrategyArgs(StrategyKind kind, const PruningParams& params);

// Checks the selected strategy's parameters against the model; errors name the
// field as `<prefix>.<strategy>.<key>`.
absl::Status ValidatePruning(const PruningParams& params, const ModelConfig& config, std::string_view prefix = "pruning");

// A fresh strategy instance for one sequence (null for `full`). Params must be valid.
std::unique_ptr<PruningStrategy> MakeStrategy(const PruningParams& params, const ModelConfig& config);

}  // namespace ps
