// Rotary position embedding, computed as ggml does (float accumulation of the
// per-pair frequency) so logits match the llama.cpp references closely.
#pragma once

#include <cstdint>
#include "kernels/types.h"

namespace ps {

// Fills cos_sin[2*i], cos_sin[2*i+1] with cos and sin of pair i's angle at `pos`.
void RopeCache(const RopeParams& p, int32_t pos, float* cos_sin);

// Fills cos_sin as RopeCache does with the mean over positions [0, positions) of each pair's
// cos and sin (summed in doubles): RopeApply with it gives the mean of a fixed vector's
// rotations over those positions, the rotation being linear in them.
void RopeMeanCache(const RopeParams& p, int32_t positions, float* cos_sin);

// Rotates `n_heads` heads of `head_dim` floats (contiguous) in place.
void RopeApply(const RopeParams& p, const float* cos_sin, float* x, int n_heads, int head_dim);

}  // namespace ps
