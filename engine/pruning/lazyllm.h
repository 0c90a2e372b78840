// LazyLLM (Fu et al., 2024): progressive, dynamic token pruning in prefill and
// decode. Before each pruning layer L_j of a step, the tokens are ranked by the
// attention probability (mean over heads) the newest token gave them at layer
// L_j - 1, and the top keep_j fraction of the context is selected, within the
// previous layer's selection (so selections shrink through a step). Selected
// tokens flow through L_j; the others are pruned there, their hidden states
// waiting in the Aux Cache, and a later step that selects them again at L_j
// revives them (aux_rows.h). The newest token is always kept. From the first
// pruning layer on, the step's queries attend only to the selected tokens (paper
// Fig. 3) through the KV selection. A step revives every selected token waiting in
// the Aux Cache, as the paper, or at most max_revivals per pruning layer (the
// best-scored): a revived token is computed from its layer to the end, and
// reviving thousands in every decode step made decoding ~10x slower than `full`.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/pruning/aux_rows.h"
#include "engine/pruning/registry.h"
#include "engine/pruning/strategy.h"
#include "model/model.h"

namespace ps {

struct LazyLlmParams {
  // Progressive schedule: before layers[i], keep the keep[i] fraction of the
  // context (layers ascending in [1, n_layers), keep non-increasing in (0, 1]).
  std::vector<int> layers;
  std::vector<float> keep;
  int max_revivals = 0;  // tokens revived per pruning layer and step at most (0: unbounded)
};

// The registry's defaults: layers at 60% and 80% of the depth (or the calibration's),
// keep 0.3 and 0.1, revival unbounded; presets "default" and "sliminfer" (50% kept
// from the layer after each of SlimInfer's slim layers).
std::unique_ptr<StrategyParams> LazyLlmDefaults(const ModelConfig& config, const CalibrationPtr& calibration);

class LazyLlm : public PruningStrategy {
 public:
  LazyLlm(const LazyLlmParams& params, const ModelConfig& config);

  std::string_view name() const override { return "lazyllm"; }
  int64_t MaxAddedRows() const override;
  absl::Status BeginStep(StepRows* rows, SeqContext& ctx) override;
  void RowsForLayer(int layer, LayerRows& rows, SeqContext& ctx) override;
  void SelectKv(int layer, const LayerAttention& att, SeqContext& ctx, KvSelection* selection) override;
  LastQueryStat WantsLastQuery(int layer) const override;
  void AfterAttention(int layer, std::span<const float> probs, std::span<const int32_t> kv_positions,
                      SeqContext& ctx) override;

  // State, for tests and accounting: a token's KV exists at layers < Depth(pos);
  // when Depth(pos) < n_layers its hidden state at that layer is in the Aux Cache.
  int Depth(int32_t pos) const { return rows_.Depth(pos); }
  bool InAux(int32_t pos) const { return rows_.InAux(pos); }
  // In the current step's selection (after the last pruning layer passed).
  bool Selected(int32_t pos) const { return pos < static_cast<int32_t>(selected_.size()) && selected_[pos]; }
  int64_t aux_entries() const { return rows_.aux_entries(); }
  int64_t revived() const { return rows_.revived(); }

 protected:
  // Importance of the tokens at the pruning layer `layer`, indexed by position;
  // scores_[pos] < 0 marks a token without a score. Tests override it to force revivals.
  virtual void Score(int layer, std::span<const float> probs, std::span<const int32_t> kv_positions);
  std::vector<float> scores_;

 private:
  AuxRows rows_;
  std::vector<float> keep_;
  int max_revivals_;
  std::vector<char> selected_;          // per position: in this step's current selection
  std::vector<int32_t> cand_, revive_;  // RowsForLayer's scratch
  std::vector<float> score_;
  std::vector<int32_t> kv_rows_;  // SelectKv's scratch
  std::vector<char> computed_;
};

}  // namespace ps
