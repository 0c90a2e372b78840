// SlimInfer (Long et al., 2025): block-wise pruning of the prompt's hidden states
// with the KV of inactive blocks in the host tier. The prompt is cut into blocks of
// block_size tokens, each into units of unit_size. After the attention of each slim
// layer ℓ_i, every prompt block with keys at ℓ_i is scored: q = mean of the queries
// of the last `window` tokens (the prompt's tail in prefill, a ring of the newest
// decoded tokens after it), a unit's key = the mean of its keys (post-RoPE, per KV
// head), the block's score = max over its units of the mean over query heads of
// q·k_unit (unscaled, no softmax). The candidates C are the first block, the blocks
// holding the prompt's last `window` tokens and the best-scored others, budgets[i]
// tokens in all. C becomes the active set A_i of layers ℓ_i+1 .. ℓ_{i+1}: only the
// active blocks' rows (and every generated token's) flow through them, are attended
// to and keep their KV in the device tier. Layers up to ℓ_0 hold every token.
//
// Prefill: A_i = C, nested (a block pruned at one stage has no keys deeper). Decode:
// A_i(t) = C(t) only when |C(t) ∩ A_i(t-1)| / |C(t)| < gamma, else A_i(t-1) stays
// (overlap-aware swapping, Algorithm 1). On a switch, for each layer of the stage the
// device KV pages holding only inactive rows move to the host tier and the host pages
// holding active rows are prefetched; the attention of a layer waits for its moves, so
// the copies overlap the compute of the layers in between. A block whose KV at the
// stage was never computed (it left at an earlier stage) is revived from the Aux Cache
// at the stage's first layer (aux_rows.h, LazyLLM's mechanism): that is our choice
// for what the paper leaves open. Generated tokens are never pruned. A stage whose
// budget covers the prompt keeps everything: budgets >= prompt equal `full` token for
// token.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/pruning/aux_rows.h"
#include "engine/pruning/registry.h"
#include "engine/pruning/strategy.h"
#include "model/model.h"

namespace ps {

struct SlimInferParams {
  std::vector<int> layers;   // slim layers, ascending in [0, n_layers - 2]
  std::vector<int> budgets;  // prompt tokens kept after layers[i], non-increasing
  int block_size = 64;       // tokens per block (a multiple of unit_size)
  int unit_size = 8;         // tokens per unit
  int window = 4;            // queries averaged into the scoring query
  float gamma = 0.9f;        // overlap below which decode switches the active set
};

// The registry's defaults, the paper's rule: absolute token budgets at layers placed
// by relative depth. Qwen2 models take its Qwen2.5-7B schedule (12k/6k/4k after
// layers 9/18/26 of 28), the others its LLaMA-3.1-8B one (8k/4k/2k after 10/20/30 of
// 32); the budgets do not scale with the trained context, so a 128k model prunes a
// 32k prompt as the paper's did.
std::unique_ptr<StrategyParams> SlimInferDefaults(const ModelConfig& config, const CalibrationPtr& calibration);
// Those defaults as a struct (LazyLLM's "sliminfer" preset prunes at its layers).
SlimInferParams SlimInferSchedule(const ModelConfig& config);

// Unit keys from running sums: sums [units, width] of the keys of counts[u] rows
// each; the mean per unit (zeros where no row was summed) into *out (reused storage:
// this runs at every slim layer of every decode step).
void UnitMeans(std::span<const float> sums, std::span<const int32_t> counts, int width, std::vector<float>* out);

// Block scores: for each block of `units_per_block` unit keys (the last may have
// fewer), the max over its units of the mean over query heads h of q[h]·k[h / group]
// (q: [n_heads * head_dim], unit_keys: [units, n_kv_heads * head_dim]).
std::vector<float> BlockScores(std::span<const float> q, std::span<const float> unit_keys, int units_per_block,
                               const AttentionShape& shape);

// |candidate ∩ active| / |candidate| (candidate: block indices; active: per block).
double ActiveOverlap(std::span<const int32_t> candidate, std::span<const char> active);

class SlimInfer : public PruningStrategy {
 public:
  SlimInfer(const SlimInferParams& params, const ModelConfig& config);

  std::string_view name() const override { return "sliminfer"; }
  int64_t MaxAddedRows() const override;
  absl::Status BeginStep(StepRows* rows, SeqContext& ctx) override;
  void RowsForLayer(int layer, LayerRows& rows, SeqContext& ctx) override;
  void SelectKv(int layer, const LayerAttention& att, SeqContext& ctx, KvSelection* selection) override;

  // State, for tests and accounting.
  int32_t prompt_tokens() const { return prompt_; }
  bool Active(int stage, int32_t block) const { return active_[stage][block] != 0; }
  int64_t switches() const { return switches_; }  // decode switches of an active set
  const AuxRows& rows() const { return rows_; }

 protected:
  // Scores of the prompt blocks at slim layer `stage` (-inf for a block without keys
  // there); tests override it to force switches.
  virtual void Score(int stage, std::span<const float> q_mean, std::vector<float>* scores);

 private:
  struct Stage {
    int layer = 0;                    // the slim layer ℓ_i
    int64_t keep = 0;                 // blocks kept
    std::vector<float> unit_sum;      // [units][kv_dim]: sums of the unit's keys at ℓ_i
    std::vector<int32_t> unit_count;  // [units]: rows summed
    std::vector<float> ring;          // [window][q_dim]: the newest queries at ℓ_i
    int64_t ring_pushed = 0;
    bool decided = false;
  };
  int StageOf(int layer) const;  // the stage whose active set holds at `layer`, or -1
  void Decide(int i, const LayerAttention& att, SeqContext& ctx);
  void MoveStage(int i, SeqContext& ctx);

  SlimInferParams params_;
  AuxRows rows_;
  int n_layers_;
  int kv_dim_, q_dim_;
  AttentionShape shape_;
  int32_t prompt_ = 0;  // prompt tokens (the first step's rows)
  int32_t n_blocks_ = 0;
  int32_t tail_block_ = 0;  // the first block holding one of the prompt's last `window` tokens
  std::vector<Stage> stages_;
  std::vector<std::vector<char>> active_;  // [stage][block]
  int64_t switches_ = 0;
  // Scratch.
  std::vector<float> q_mean_, scores_, unit_keys_;
  std::vector<int32_t> bounds_, run_unit_;  // Decide's runs of key rows: bounds, and each run's unit (-1: none)
  std::vector<char> go_on_;
  std::vector<int32_t> revive_, kv_rows_, to_device_, to_host_;
};

}  // namespace ps
