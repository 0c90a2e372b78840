// Rotary position embedding, computed as ggml does (float accumulation of the
// per-pair frequency) so logits match the llama.cpp references closely.
#pragma once

#include <cstdint>
#include <vector>

namespace ps {

struct RopeParams {
  int n_dims = 0;             // rotated dimensions per head (<= head_dim)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;    // 1 / linear scaling factor
  bool neox = false;          // pairs (i, i + n_dims/2) instead of (2i, 2i+1)
  std::vector<float> freq_factors;  // per pair divisor (LLaMA-3 scaling); empty = none
};

// Fills cos_sin[2*i], cos_sin[2*i+1] with cos and sin of pair i's angle at `pos`.
void RopeCache(const RopeParams& p, int32_t pos, float* cos_sin);

// Rotates `n_heads` heads of `head_dim` floats (contiguous) in place.
void RopeApply(const RopeParams& p, const float* cos_sin, float* x, int n_heads, int head_dim);

}  // namespace ps
