// CritiPrefill (Lv et al., 2024): segment-wise block-sparse prefill attention. The
// prompt's query rows are cut into segments of segment_size, its keys into blocks of
// block_size. Per layer and KV head, a segment is represented by the element-wise
// maximum and minimum of its queries (each of the group's query heads), a block by
// the element-wise maximum and minimum of its keys; a block's criticality for the
// segment is the largest, over its two key representatives, of the mean over the
// segment's representatives of the unscaled dot product, softmaxed over the blocks
// strictly before the segment and fused with the previous layer's (official code:
// S = fusion_prev_weight * S_prev + (1 - fusion_prev_weight) * S_cur, reset at layer
// 1). The segment then attends to its ceil(budget / block_size) most critical blocks
// and its own keys (causal). Layer 0, the segments starting before dense_prefix
// tokens and the last segment attend densely, and so does decode: the KV cache stays
// whole. The prompt is computed in one step (WholePrompt); a segment whose blocks
// before it all fit the budget is dense, so a budget of the prompt's length equals
// `full` token for token.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "engine/pruning/registry.h"
#include "engine/pruning/strategy.h"
#include "model/model.h"

namespace ps {

struct CritiPrefillParams {
  int segment_size = 512;            // query rows per segment (a multiple of block_size)
  int block_size = 32;               // keys per block
  int budget = 1024;                 // keys chosen per segment (whole blocks, rounded up)
  int dense_prefix = 4096;           // segments starting before this many prompt tokens are dense
  float fusion_prev_weight = 0.25f;  // the paper's equation weights the previous layer 0.75
};

// The registry's defaults: the paper's settings (they do not depend on the model).
std::unique_ptr<StrategyParams> CritiPrefillDefaults(const ModelConfig& config, const CalibrationPtr& calibration);

// Criticality of key blocks for one query segment and KV head, before the softmax:
// q_rep holds the segment's representatives (2 rows of `head_dim` per query head of
// the group: max, min), k_rep each block's (max row, then min row). For block b:
// max over its two rows k of the mean over q_rep's rows q of q·k (unscaled).
std::vector<float> BlockCriticality(std::span<const float> q_rep, std::span<const float> k_rep, int head_dim);

class CritiPrefill : public PruningStrategy {
 public:
  explicit CritiPrefill(const CritiPrefillParams& params) : params_(params) {}

  std::string_view name() const override { return "critiprefill"; }
  std::unique_ptr<PruningStrategy> Fork() const override { return std::make_unique<CritiPrefill>(*this); }
  void SelectKv(int layer, const LayerAttention& att, SeqContext& ctx, KvSelection* selection) override;

 private:
  // Segment i's fused block scores for one KV head at layer `layer`, into fused_, from
  // every segment's query representatives ([segment][max, min][n_heads * head_dim]).
  void ScoreSegment(int layer, const AttentionShape& shape, const float* q_reps, int64_t segment, int kv_head);

  CritiPrefillParams params_;
  std::vector<int32_t> bounds_;            // row runs to reduce
  std::vector<float> k_rep_;               // [n_kv_heads][blocks][max, min][head_dim] of the current layer
  std::vector<std::vector<float>> fused_;  // [segment * n_kv_heads + kv_head]: fused scores of its blocks
};

}  // namespace ps
