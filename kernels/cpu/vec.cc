#include "kernels/cpu/vec.h"

#include <cmath>
#include <cstring>
#include <limits>

#if !defined(__clang__)
// GCC notes that 64-byte vector values change the ABI of non-AVX-512 clones; none
// crosses a call boundary here.
#if defined(__GNUC__) && !defined(__clang__)  // GCC only: clang knows neither the warnings nor the false positives
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#define PS_CLONES  // ifunc resolvers would run before ThreadSanitizer is initialised
#else
#define PS_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

namespace ps {
namespace {
// Exponential without library calls so that loops using it vectorise: Cephes-style
// range reduction to [-ln2/2, ln2/2] and a degree-6 polynomial.
inline float ExpPoly(float v) {
  v = v < -87.3f ? -87.3f : (v > 88.3f ? 88.3f : v);
  const float r = (v * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(v / ln2)
  const float y = v - r * 0.693359375f + r * 2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * y + 1.3981999507E-3f;
  p = p * y + 8.3334519073E-3f;
  p = p * y + 4.1665795894E-2f;
  p = p * y + 1.6666665459E-1f;
  p = p * y + 5.0000001201E-1f;
  p = p * y * y + y + 1.0f;
  const int32_t bits = (static_cast<int32_t>(r) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}
}  // namespace

namespace {
// The body of DotF32, inlined into each clone's callers. Sixteen partial sums keep
// the loop vectorised without -ffast-math.
// Sixteen floats as one GCC vector (a zmm register in the AVX-512 clone, four xmm
// in the baseline one); unaligned access through the typedef's alignment of 4.
typedef float F32x16 __attribute__((vector_size(64), aligned(4), may_alias));
typedef float F32x8 __attribute__((vector_size(32)));
typedef float F32x4 __attribute__((vector_size(16)));
// A reference, not a value: returning a 64-byte vector by value would depend on the
// clone's ABI (and clang rejects it outside AVX-512 code).
inline const F32x16& At16(const float* p) { return *reinterpret_cast<const F32x16*>(p); }

inline __attribute__((always_inline)) float Dot(const float* a, const float* b, int64_t n) {
  F32x16 acc = {};  // sixteen partial sums keep the loop vectorised without -ffast-math
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc += At16(a + i) * At16(b + i);
  // Pairwise reduction: four dependent adds instead of sixteen.
  const F32x8 s8 = __builtin_shufflevector(acc, acc, 0, 1, 2, 3, 4, 5, 6, 7) +
                   __builtin_shufflevector(acc, acc, 8, 9, 10, 11, 12, 13, 14, 15);
  const F32x4 s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  float s = (s4[0] + s4[2]) + (s4[1] + s4[3]);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}
}  // namespace

PS_CLONES float DotF32(const float* a, const float* b, int64_t n) { return Dot(a, b, n); }

PS_CLONES void DotRows(const float* q, const float* k, int64_t stride, int64_t rows, int64_t n, float* out) {
  for (int64_t j = 0; j < rows; ++j) out[j] = Dot(q, k + j * stride, n);
}

PS_CLONES void Axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

PS_CLONES void AxpyRows(const float* p, const float* v, int64_t stride, int64_t rows, int64_t n, float* y) {
  // Sixteen outputs at a time stay in a register across the rows; every output adds
  // the rows in order, as a sequence of Axpy calls would (rows with p = 0 add zero).
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    F32x16 acc = At16(y + i);
    for (int64_t j = 0; j < rows; ++j) acc += p[j] * At16(v + j * stride + i);
    *reinterpret_cast<F32x16*>(y + i) = acc;
  }
  for (int64_t j = 0; j < rows; ++j) {
    for (int64_t t = i; t < n; ++t) y[t] += p[j] * v[j * stride + t];
  }
}

PS_CLONES void Scale(float a, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

PS_CLONES void AddInPlace(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

PS_CLONES void RmsNorm(const float* x, const float* w, float* out, int64_t n, float eps) {
  // Double, as the reference (llama.cpp ggml_rms_norm) accumulates: each square is exact
  // there, so 8 running sums (vectors, not one chain of dependent adds) change nothing a
  // float result can show.
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += static_cast<double>(x[i + k]) * x[i + k];
  }
  for (; i < n; ++i) acc[0] += static_cast<double>(x[i]) * x[i];
  double ss = 0;
  for (double a : acc) ss += a;
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
}

PS_CLONES float MaxOf(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

PS_CLONES float LogSumExp(const float* x, int64_t n) {
  const float m = MaxOf(x, n);
  if (m == -std::numeric_limits<float>::infinity() || m == std::numeric_limits<float>::infinity()) return m;
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) acc[k] += ExpPoly(x[i + k] - m);
  float sum = 0;
  for (int k = 0; k < 16; ++k) sum += acc[k];
  for (; i < n; ++i) sum += ExpPoly(x[i] - m);
  return m + std::log(sum);
}

PS_CLONES void ExpInPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = ExpPoly(x[i]);
}

PS_CLONES float SoftmaxInPlace(float* x, int64_t n) {
  const float m = MaxOf(x, n);
  float sum = 0;
  if (m == -std::numeric_limits<float>::infinity()) {
    for (int64_t i = 0; i < n; ++i) x[i] = 0;
    return 0;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float d = x[i] - m;
    // Masked entries (-inf) map to exactly zero; ExpPoly alone would clamp them.
    x[i] = d < -87.3f ? 0.0f : ExpPoly(d);
  }
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) acc[k] += x[i + k];
  for (int k = 0; k < 16; ++k) sum += acc[k];
  for (; i < n; ++i) sum += x[i];
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
  return sum;
}

PS_CLONES void SiluMul(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + ExpPoly(-g)) * up[i];
  }
}

}  // namespace ps
