// Elementwise and reduction kernels on F32 rows. Each is compiled for AVX-512,
// AVX2 and baseline x86-64 (GCC target_clones) and dispatched at load time.
#pragma once

#include <cstdint>

namespace ps {

float DotF32(const float* a, const float* b, int64_t n);
// out[j] = DotF32(q, k + j * stride, n) for j < rows (the same arithmetic, one call).
void DotRows(const float* q, const float* k, int64_t stride, int64_t rows, int64_t n, float* out);
// y += a * x
void Axpy(float a, const float* x, float* y, int64_t n);
// y += p[j] * v[j * stride ..] for j < rows, in order (as Axpy calls would).
void AxpyRows(const float* p, const float* v, int64_t stride, int64_t rows, int64_t n, float* y);
// y *= a
void Scale(float a, float* y, int64_t n);
// y += x
void AddInPlace(const float* x, float* y, int64_t n);
// out = x / rms(x) * w
void RmsNorm(const float* x, const float* w, float* out, int64_t n, float eps);
// x = exp(x - max) / sum; returns the sum of exps before normalisation. Entries equal
// to -inf get probability 0.
float SoftmaxInPlace(float* x, int64_t n);
// gate = silu(gate) * up
void SiluMul(float* gate, const float* up, int64_t n);
// x = exp(x), vectorised, relative error below 2e-7 on [-87, 88].
void ExpInPlace(float* x, int64_t n);
float MaxOf(const float* x, int64_t n);
// log(sum(exp(x))), stable (shifted by the maximum), vectorised.
float LogSumExp(const float* x, int64_t n);

}  // namespace ps
