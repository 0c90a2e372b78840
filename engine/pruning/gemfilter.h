// GemFilter (Shi et al., 2024): early layers find the relevant tokens. The first
// step runs layers 0..r over the whole prompt (on scratch KV), scores each token
// by the last query's pre-softmax attention at layer r (after RoPE, each query
// head against its GQA key head, summed over heads), average-pools the scores
// (kernel 5), keeps the top k in their original order (the last prompt token
// always) and then runs the whole model on those tokens only; generation goes on
// from that cache. Kept tokens get fresh contiguous positions (as the paper) or,
// with original_positions, their own. Prompts of k tokens or fewer run unchanged.
#pragma once

#include <memory>
#include <vector>

#include "engine/pruning/registry.h"
#include "engine/pruning/strategy.h"
#include "model/model.h"

namespace ps {

struct GemFilterParams {
  int filter_layer = 0;             // layers 0..filter_layer score the prompt
  int top_k = 1024;                 // prompt tokens kept (prompts of top_k or fewer run unchanged)
  int pool_kernel = 5;              // average pooling of the scores (odd)
  bool original_positions = false;  // kept tokens keep their positions (default: fresh, contiguous)
};

// The registry's defaults: filter_layer at 40% of the depth (the paper's 13 of 32
// layers for LLaMA-3.1-8B), top_k 1024, pool_kernel 5.
std::unique_ptr<StrategyParams> GemFilterDefaults(const ModelConfig& config, const CalibrationPtr& calibration);

class GemFilter : public PruningStrategy {
 public:
  explicit GemFilter(const GemFilterParams& params) : params_(params) {}

  std::string_view name() const override { return "gemfilter"; }
  std::unique_ptr<PruningStrategy> Fork() const override { return std::make_unique<GemFilter>(*this); }
  absl::Status BeginStep(StepRows* rows, SeqContext& ctx) override;
  LastQueryStat WantsLastQuery(int layer) const override;
  void AfterAttention(int layer, std::span<const float> logits, std::span<const int32_t> kv_positions,
                      SeqContext& ctx) override;

  // Which of the first step's rows were kept (indices into them), in order.
  const std::vector<int32_t>& selected() const { return selected_; }

 private:
  GemFilterParams params_;
  bool filtered_ = false;      // the first step has been seen
  bool scoring_ = false;       // inside the prefix pass
  std::vector<float> scores_;  // per prompt row, from the prefix pass
  std::vector<int32_t> selected_;
};

}  // namespace ps
