// Rows of F16 or BF16 values (the half-precision KV cache): conversion from and to
// F32, and the dot / axpy products attention needs, with F32 accumulation.
// AVX-512 where the CPU has it, scalar otherwise; conversions are bit-exact with
// base/fp16.h (round to nearest even).
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace ps {

// t is DType::kF16 or DType::kBF16 in all of these.
void HalfToF32(DType t, const uint16_t* x, float* out, int64_t n);
void F32ToHalf(DType t, const float* x, uint16_t* out, int64_t n);
float DotHalf(DType t, const uint16_t* x, const float* y, int64_t n);
void AxpyHalf(DType t, float a, const uint16_t* x, float* y, int64_t n);  // y += a * x

}  // namespace ps
