// PoD (Proximal tokens over Distant tokens; Ma et al., 2024): attention scores of
// distant tokens shared across layers. Per KV head, consecutive layers whose
// attention distributions are alike form groups (tools/pruneserve-calibrate
// measures the similarities; the groups at `delta` follow PoD's greedy Algorithm 1,
// engine/pruning/calibration.h). At a layer of a group above its lowest layer ℓa, a
// query attends to its proximal tokens (the first `sinks` and the `recent` newest)
// with its own scores, and to the distant ones with layer ℓa's scores (ℓa's queries
// and keys) and its own values; the two parts are mixed by the gate from their
// log-sum-exps (engine/shared_attention.h). Distant keys are needed once per group:
// the KV saving. Layers that start a group (singletons included) attend as `full`,
// so delta = 0 (every layer alone) equals `full` token for token. With gate_skip > 0
// a decode step skips the distant part where the gate is at least gate_skip.
//
// The paper post-trains its model (5B tokens) for this attention and never measures
// PoD without; here it runs on stock weights, and costs accuracy accordingly.
#pragma once

#include <memory>
#include <vector>

#include "engine/pruning/calibration.h"
#include "engine/pruning/registry.h"
#include "engine/pruning/strategy.h"
#include "model/model.h"

namespace ps {

struct PodParams {
  CalibrationPtr calibration;  // the model's layer similarities (required)
  double delta = 0.5;          // grouping threshold (calibration.h); the file's by default
  int sinks = 16;              // proximal: the first tokens
  int recent = 4080;           // ... and the newest ones (the query's own included)
  float gate_skip = 0;         // in [0, 1]; 0: never skip the distant part
};

// The registry's defaults: the paper's 16 sinks and 4080 recent tokens of a 32k
// context, scaled to the model's trained context (recent = n_ctx / 8 - sinks), the
// calibration's delta. Without a calibration PoD is unavailable.
std::unique_ptr<StrategyParams> PodDefaults(const ModelConfig& config, const CalibrationPtr& calibration);

class Pod : public PruningStrategy {
 public:
  Pod(const PodParams& params, const ModelConfig& config);

  std::string_view name() const override { return "pod"; }
  std::unique_ptr<PruningStrategy> Fork() const override;
  absl::Status BeginStep(StepRows* rows, SeqContext& ctx) override;
  void SelectKv(int layer, const LayerAttention& att, SeqContext& ctx, KvSelection* selection) override;
  const SharedScores* ShareScores(int layer) override;

  // [kv_head][layer]: the lowest layer of the layer's group.
  const std::vector<std::vector<int>>& base() const { return base_; }
  // The share of (layer, KV head) pairs whose distant keys need not be stored.
  double KeySaving() const;
  int64_t distant_skipped() const { return distant_skipped_; }

 private:
  PodParams params_;
  int n_layers_, n_kv_heads_, q_dim_;
  std::vector<std::vector<int>> base_;
  std::vector<char> shares_;           // [layer]: a head reads another layer's scores here
  std::vector<char> feeds_;            // [layer]: a group of several layers starts here for some head
  std::vector<int> last_reader_;       // [layer]: the highest layer reading its queries
  std::vector<std::vector<float>> q_;  // [layer]: this step's queries at the layers that feed others
  SharedScores plan_;
  std::vector<float> distant_lse_;
  std::vector<char> distant_lse_valid_;
  int64_t distant_skipped_ = 0;
};

}  // namespace ps
