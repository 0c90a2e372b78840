// Attention with scores shared across layers (PoD, engine/pruning/strategy.h
// SharedScores) for one sequence's query rows at one layer, over its whole KV: per
// KV head ordinary attention, or a proximal part with the layer's own scores and a
// distant part with the base layer's, merged by their log-sum-exps.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "engine/pruning/strategy.h"
#include "kernels/backend.h"
#include "memory/kv_cache.h"

namespace ps {

struct SharedAttentionArgs {
  int64_t seq = 0;
  int layer = 0;
  AttentionShape shape;
  const float* q = nullptr;  // the layer's queries, [n_q, n_heads * head_dim], q_stride apart
  const int32_t* q_pos = nullptr;
  int64_t n_q = 0;
  int64_t q_stride = 0;
  float* out = nullptr;  // [n_q, n_heads * head_dim], out_stride apart
  int64_t out_stride = 0;
};

absl::Status SharedAttention(Backend& backend, KvCache& kv, const SharedScores& share, const SharedAttentionArgs& a);

// PoD's gate: the weight of the proximal part, 1 / (1 + exp(lse_d - lse_p)) (1 when
// there are no distant keys, lse_d = -inf).
float ProximalGate(float lse_p, float lse_d);

// For n rows of `heads` heads of `hd` values: o_p = g o_p + (1 - g) o_d with g the
// gate of the row and head (rows p_stride / d_stride apart; the log-sum-exps
// [n, heads], lse_stride apart).
void MergeByGate(int64_t n, int heads, int hd, float* o_p, int64_t p_stride, const float* o_d, int64_t d_stride,
                 const float* lse_p, const float* lse_d, int64_t lse_stride);

}  // namespace ps
