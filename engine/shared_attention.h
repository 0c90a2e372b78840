// Attention with scores shared across layers (PoD, engine/pruning/strategy.h
// SharedScores) for one sequence's query rows at one layer, over its whole KV: per
// KV head ordinary attention, or a proximal part with the layer's own scores and a
// distant part with the base layer's, merged by their log-sum-exps. Then, with
// share.drop_distant_keys, the keys of the layer that no later query reads are freed
// (PoD's KV saving): for a head scoring its distant keys with another layer's, the
// full pages of keys distant to every position after the newest cached one.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/pruning/strategy.h"
#include "kernels/activations.h"
#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "model/model.h"

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
  // The model's layers, for their keys' shifts (model.h's bk_shift): a part's log-sum-exp
  // over shifted keys is scale x q . shift above the model's own, which differs between
  // the two layers the gate weighs; it is taken back off. Empty: no shifts.
  std::span<const LayerWeights> layers;
};

// Buffers SharedAttention reuses across calls: the parts' log-sum-exps and the
// distant output in activation memory, the base layer's queries staged there, host
// copies, and the pages whose keys are dropped.
struct SharedAttentionScratch {
  Activations lse_p, lse_d, o_d, base_q;
  std::vector<float> host, host_q;
  std::vector<int32_t> pages;
};

// `a.q` and `a.out` are activation memory; the base layer's queries (share.base_q)
// are the strategy's host copies. The gate is ProximalGate (kernels/shared_math.h),
// the merge Backend::MergeByGate.
absl::Status SharedAttention(Backend& backend, KvCache& kv, const SharedScores& share, const SharedAttentionArgs& a,
                             SharedAttentionScratch& scratch);

}  // namespace ps
