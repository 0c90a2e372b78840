// AVX2 + FMA inner loops of the attention kernel for F32 keys and values whose head
// size is a multiple of 8, for all query heads of one GQA group at once (a block of
// keys is read once while it is in L1). Call only when avx2::Available().
#pragma once

#include <cstdint>

namespace ps::avx2 {

// out[h * out_step + r] = q_h · k_r for heads h < n_heads (q_h = q + h * hd) and rows
// r < rows (k_r = k + r * stride).
void GroupKeyDots(const float* q, int n_heads, const float* k, int64_t stride, int64_t rows, int hd, float* out,
                  int64_t out_step);

// out_h[0, hd) += sum_r p[h * p_step + r] * v_r for heads h < n_heads (out_h = out + h * hd).
void GroupValueAxpys(const float* p, int64_t p_step, int n_heads, const float* v, int64_t stride, int64_t rows, int hd,
                     float* out);

// Largest of n values (-inf for n = 0).
float MaxOf(const float* x, int64_t n);

// x = exp(x - m) over n values (entries more than 87.3 below m, -inf included, become
// exactly 0); returns their sum.
float ExpShifted(float* x, int64_t n, float m);

}  // namespace ps::avx2
