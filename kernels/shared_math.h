// Math both backends compute, as inline functions the CPU kernels and the CUDA
// kernels (nvcc: __host__ __device__) share, so that both follow one definition
// and the CPU tests cover it. C++17 (CUDA sources include it).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define PS_HD __host__ __device__
#else
#define PS_HD
#endif

namespace ps {

// RoPE: the angle of pair i at a position, from theta = pos * theta_scale^i
// (theta_scale = freq_base^(-2 / n_dims), the product taken one factor at a time, as
// llama.cpp does), the pair's frequency factor (LLaMA-3 scaling; 1 without) and the
// linear scale.
PS_HD inline float RopeAngle(float theta, float freq_factor, float freq_scale) {
  return freq_scale * (theta / freq_factor);
}

// The two elements pair i of a head rotates: (i, i + half) in NeoX order, else (2i, 2i + 1).
PS_HD inline void RopePair(bool neox, int i, int half, int* a, int* b) {
  *a = neox ? i : 2 * i;
  *b = neox ? i + half : 2 * i + 1;
}

// Rotates (x0, x1) by the angle whose cosine and sine are c and s.
PS_HD inline void RopeRotate(float c, float s, float* x0, float* x1) {
  const float a = *x0, b = *x1;
  *x0 = a * c - b * s;
  *x1 = a * s + b * c;
}

// Whether a query at q_pos sees a key at key_pos: causally, and by a position window
// (PositionWindow; part 0: all keys; 1: the proximal ones, the first `sinks` positions and the
// `recent` newest up to the query's own; 2: the others, the distant ones).
PS_HD inline bool WindowSees(int part, int32_t sinks, int32_t recent, int32_t key_pos, int32_t q_pos) {
  if (key_pos > q_pos) return false;
  if (part == 0) return true;
  const bool proximal = key_pos < sinks || key_pos > q_pos - recent;
  return proximal == (part == 1);
}

// The gate of a two-part attention: the weight of the proximal part, 1 / (1 + exp(lse_d - lse_p))
// from the two parts' log-sum-exps (1 when there are no distant keys, lse_d = -inf).
PS_HD inline float ProximalGate(float lse_p, float lse_d) { return 1.0f / (1.0f + expf(lse_d - lse_p)); }

}  // namespace ps
