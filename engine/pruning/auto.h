// `auto`: per request, the strategy the evaluation found fastest without losing the
// answer at the prompt's length. The table is the evaluation's (pruneserve-eval
// --auto-table; engine/pruning/calibration.h's AutoTable, which the server attaches
// to the model's calibration): at the longest measured length whose shortest prompt
// (from_tokens) is not above the prompt's, the strategy with the highest TTFT speedup
// (at least min_speedup) whose pooled accuracy is inside `full`'s 95% interval there
// (score >= full's lower bound) and which lost no task there (`loses`: a task's score
// below full's interval for that task, the evaluation table's marked cells); `full`
// when none is, or the prompt is shorter than every measured length. The chosen
// strategy runs with the server's defaults for it (its calibration and --strategy-arg
// included; the registry's when auto is made outside StrategyDefaults) and reports its
// name (Usage.strategy). The prompt is taken in one step.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "engine/pruning/calibration.h"
#include "engine/pruning/registry.h"
#include "engine/pruning/strategy.h"
#include "model/model.h"

namespace ps {

struct AutoParams {
  CalibrationPtr calibration;                   // its auto_table is required
  float min_speedup = 1.1f;                     // a strategy must be at least this much faster than `full`
  std::shared_ptr<const DefaultParams> others;  // the server's defaults of the strategies to pick from
};

// The registry's defaults; without a table `auto` is unavailable (FailedPrecondition).
std::unique_ptr<StrategyParams> AutoDefaults(const ModelConfig& config, const CalibrationPtr& calibration);

// The strategy `table` picks for a prompt of `prompt_tokens` ("full" included),
// among those `usable` accepts.
std::string AutoChoice(const AutoTable& table, int64_t prompt_tokens, float min_speedup,
                       const std::function<bool(const std::string&)>& usable);

class Auto final : public PruningStrategy {
 public:
  Auto(const AutoParams& params, const ModelConfig& config) : params_(params), config_(config) {}

  std::string_view name() const override { return chosen_; }  // "auto" until the prompt is seen
  std::unique_ptr<PruningStrategy> Fork() const override;     // its choice's fork
  int64_t MaxAddedRows() const override { return inner_ != nullptr ? inner_->MaxAddedRows() : 0; }
  absl::Status BeginStep(StepRows* rows, SeqContext& ctx) override;
  void RowsForLayer(int layer, LayerRows& rows, SeqContext& ctx) override {
    if (inner_ != nullptr) inner_->RowsForLayer(layer, rows, ctx);
  }
  void SelectKv(int layer, const LayerAttention& att, SeqContext& ctx, KvSelection* selection) override {
    if (inner_ != nullptr) inner_->SelectKv(layer, att, ctx, selection);
  }
  const SharedScores* ShareScores(int layer) override {
    return inner_ != nullptr ? inner_->ShareScores(layer) : nullptr;
  }
  LastQueryStat WantsLastQuery(int layer) const override {
    return inner_ != nullptr ? inner_->WantsLastQuery(layer) : LastQueryStat::kNone;
  }
  void AfterAttention(int layer, std::span<const float> values, std::span<const int32_t> kv_positions,
                      SeqContext& ctx) override {
    if (inner_ != nullptr) inner_->AfterAttention(layer, values, kv_positions, ctx);
  }

 private:
  AutoParams params_;
  ModelConfig config_;
  std::string chosen_ = "auto";
  std::unique_ptr<PruningStrategy> inner_;  // null: `full`
};

}  // namespace ps
