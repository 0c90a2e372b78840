// AVX2 + FMA (+ F16C) inner loops of the attention kernel for keys and values whose
// head size is a multiple of 8, for all query heads of one GQA group at once (a
// block of keys is read once while it is in L1). Call only when avx2::Available().
#pragma once

#include <cstdint>

namespace ps::avx2 {

// A KV cache's element type to these loops: F32, F16, BF16 or Q8_0 rows (GGUF's
// blocks of 32 int8 values after an fp16 scale; hd a multiple of 32).
enum class KvElem { kF32, kF16, kBF16, kQ8_0 };

// out[h * out_step + r] = scale * (q_h · k_r) for heads h < n_heads (q_h = q + h * hd)
// and rows r < rows (k_r: `stride` elements after k_{r-1}, k_0 at k). Each key
// vector is loaded (and converted) once for up to three heads.
void GroupKeyDots(const float* q, int n_heads, KvElem t, const void* k, int64_t stride, int64_t rows, int hd,
                  float scale, float* out, int64_t out_step);

// out_h[0, hd) += sum_r p[h * p_step + r] * v_r for heads h < n_heads (out_h = out +
// h * hd). Each value vector is loaded (and converted) once for up to four heads.
void GroupValueAxpys(const float* p, int64_t p_step, int n_heads, KvElem t, const void* v, int64_t stride, int64_t rows,
                     int hd, float* out);

// Largest of n values (-inf for n = 0).
float MaxOf(const float* x, int64_t n);

// x = exp(x - m) over n values (entries more than 87.3 below m, -inf included, become
// exactly 0); returns their sum.
float ExpShifted(float* x, int64_t n, float m);

}  // namespace ps::avx2
