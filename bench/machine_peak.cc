#include "bench/machine_peak.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_isa.h"

namespace ps::bench {
namespace {

constexpr int64_t kIters = 20'000'000;  // ~0.1 s a loop on a 2-3 GHz core

// Best seconds of `threads` threads each running fn(its index) once, over 5 tries (a
// neighbour waking up on one core for a moment must not lower the ceiling).
double Seconds(int threads, const std::function<void(int)>& fn) {
  double best = 1e30;
  for (int t = 0; t < 5; ++t) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int i = 1; i < threads; ++i) pool.emplace_back(fn, i);
    fn(0);
    for (std::thread& th : pool) th.join();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Twelve independent accumulators hide the FMA latency on every core this runs on.
#define PS_TWELVE(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

__attribute__((target("avx2,fma"), noinline)) float Fp32Avx2() {
#define PS_DECL(i) __m256 a##i = _mm256_set1_ps(1.0f + (i));
#define PS_STEP(i) a##i = _mm256_fmadd_ps(a##i, b, c);
#define PS_SUM(i) s = _mm256_add_ps(s, a##i);
  const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-4f);
  PS_TWELVE(PS_DECL)
  for (int64_t i = 0; i < kIters; ++i) {
    PS_TWELVE(PS_STEP)
  }
  __m256 s = _mm256_setzero_ps();
  PS_TWELVE(PS_SUM)
  return _mm256_cvtss_f32(s);
#undef PS_DECL
#undef PS_STEP
#undef PS_SUM
}

__attribute__((target("avx512f"), noinline)) float Fp32Avx512() {
#define PS_DECL(i) __m512 a##i = _mm512_set1_ps(1.0f + (i));
#define PS_STEP(i) a##i = _mm512_fmadd_ps(a##i, b, c);
#define PS_SUM(i) s = _mm512_add_ps(s, a##i);
  const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-4f);
  PS_TWELVE(PS_DECL)
  for (int64_t i = 0; i < kIters; ++i) {
    PS_TWELVE(PS_STEP)
  }
  __m512 s = _mm512_setzero_ps();
  PS_TWELVE(PS_SUM)
  float lanes[16];
  _mm512_storeu_ps(lanes, s);  // (GCC 12 warns wrongly on the 512-bit extract intrinsics)
  return lanes[0];
#undef PS_DECL
#undef PS_STEP
#undef PS_SUM
}

// The packed kernels' inner loop: vpmaddubsw into 16-bit accumulators.
__attribute__((target("avx2"), noinline)) int Int8Avx2() {
#define PS_DECL(i) __m256i a##i = _mm256_set1_epi16(i);
#define PS_STEP(i) a##i = _mm256_add_epi16(a##i, _mm256_maddubs_epi16(w, x));
#define PS_SUM(i) s = _mm256_add_epi16(s, a##i);
  __m256i w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(-2);
  PS_TWELVE(PS_DECL)
  for (int64_t i = 0; i < kIters; ++i) {
    PS_TWELVE(PS_STEP)
    asm("" : "+x"(w), "+x"(x));  // new operands each time: nothing to hoist
  }
  __m256i s = _mm256_setzero_si256();
  PS_TWELVE(PS_SUM)
  return _mm256_extract_epi16(s, 0);
#undef PS_DECL
#undef PS_STEP
#undef PS_SUM
}

__attribute__((target("avx512f,avx512bw"), noinline)) int Int8Avx512() {
#define PS_DECL(i) __m512i a##i = _mm512_set1_epi16(i);
#define PS_STEP(i) a##i = _mm512_add_epi16(a##i, _mm512_maddubs_epi16(w, x));
#define PS_SUM(i) s = _mm512_add_epi16(s, a##i);
  __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(-2);
  PS_TWELVE(PS_DECL)
  for (int64_t i = 0; i < kIters; ++i) {
    PS_TWELVE(PS_STEP)
    asm("" : "+v"(w), "+v"(x));
  }
  __m512i s = _mm512_setzero_si512();
  PS_TWELVE(PS_SUM)
  int lanes[16];
  _mm512_storeu_si512(lanes, s);
  return lanes[0];
#undef PS_DECL
#undef PS_STEP
#undef PS_SUM
}

// VNNI: vpdpbusd, four u8 x s8 products into each 32-bit lane.
__attribute__((target("avx512f,avx512vnni"), noinline)) int Int8Vnni() {
#define PS_DECL(i) __m512i a##i = _mm512_set1_epi32(i);
#define PS_STEP(i) a##i = _mm512_dpbusd_epi32(a##i, w, x);
#define PS_SUM(i) s = _mm512_add_epi32(s, a##i);
  __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(-2);
  PS_TWELVE(PS_DECL)
  for (int64_t i = 0; i < kIters; ++i) {
    PS_TWELVE(PS_STEP)
    asm("" : "+v"(w), "+v"(x));
  }
  __m512i s = _mm512_setzero_si512();
  PS_TWELVE(PS_SUM)
  int lanes[16];
  _mm512_storeu_si512(lanes, s);
  return lanes[0];
#undef PS_DECL
#undef PS_STEP
#undef PS_SUM
}

// vdpbf16ps: pairs of BF16 products into each FP32 lane.
__attribute__((target("avx512f,avx512bf16"), noinline)) float Bf16Avx512() {
#define PS_DECL(i) __m512 a##i = _mm512_set1_ps(static_cast<float>(i));
#define PS_STEP(i) a##i = _mm512_dpbf16_ps(a##i, w, x);
#define PS_SUM(i) s = _mm512_add_ps(s, a##i);
  __m512bh w = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
  __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(2e-3f));
  PS_TWELVE(PS_DECL)
  for (int64_t i = 0; i < kIters; ++i) {
    PS_TWELVE(PS_STEP)
    asm("" : "+v"(w), "+v"(x));
  }
  __m512 s = _mm512_setzero_ps();
  PS_TWELVE(PS_SUM)
  float lanes[16];
  _mm512_storeu_ps(lanes, s);  // (GCC 12 warns wrongly on the 512-bit extract intrinsics)
  return lanes[0];
#undef PS_DECL
#undef PS_STEP
#undef PS_SUM
}
#undef PS_TWELVE

// Scalar FP32 multiply-adds (the scalar level's ceiling), four chains.
__attribute__((noinline)) float Fp32Scalar() {
  volatile float seed = 0.999f;
  float a0 = 1, a1 = 2, a2 = 3, a3 = 4;
  const float b = seed, c = 1e-4f;
  for (int64_t i = 0; i < kIters; ++i) {
    a0 = a0 * b + c;
    a1 = a1 * b + c;
    a2 = a2 * b + c;
    a3 = a3 * b + c;
  }
  return a0 + a1 + a2 + a3;
}

// Sums a buffer's 64-bit words (every cache line read once).
uint64_t ReadAll(const uint64_t* p, size_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) s0 += p[i], s1 += p[i + 1], s2 += p[i + 2], s3 += p[i + 3];
  return s0 + s1 + s2 + s3;
}

}  // namespace

MachinePeak MeasureMachinePeak(int threads) {
  const CpuIsa isa = ActiveCpuIsa();
  MachinePeak p;
  p.isa = std::string(CpuIsaName(isa));
  std::vector<float> sink_f(threads);  // results kept, so that no loop is optimised away
  std::vector<int> sink_i(threads);
  const double n = static_cast<double>(kIters) * 12 * threads;
  if (isa >= CpuIsa::kAvx512) {
    p.fp32_flops = n * 16 * 2 / Seconds(threads, [&](int t) { sink_f[t] = Fp32Avx512(); });
  } else if (isa >= CpuIsa::kAvx2) {
    p.fp32_flops = n * 8 * 2 / Seconds(threads, [&](int t) { sink_f[t] = Fp32Avx2(); });
  } else {
    p.fp32_flops =
        static_cast<double>(kIters) * 4 * threads * 2 / Seconds(threads, [&](int t) { sink_f[t] = Fp32Scalar(); });
  }
  // The packed kernels run VNNI (vpdpbusd) at avx512_bf16 and their AVX2 code at avx512
  // (kernels/cpu/packed.h); the ceiling is what each level's widest int8 products reach.
  if (isa >= CpuIsa::kAvx512Bf16) {
    p.int8_ops = n * 64 * 2 / Seconds(threads, [&](int t) { sink_i[t] = Int8Vnni(); });
    p.bf16_flops = n * 32 * 2 / Seconds(threads, [&](int t) { sink_f[t] = Bf16Avx512(); });
  } else if (isa >= CpuIsa::kAvx512) {
    p.int8_ops = n * 64 * 2 / Seconds(threads, [&](int t) { sink_i[t] = Int8Avx512(); });
  } else if (isa >= CpuIsa::kAvx2) {
    p.int8_ops = n * 32 * 2 / Seconds(threads, [&](int t) { sink_i[t] = Int8Avx2(); });
  }
  const size_t words = size_t{1} << 25;  // 256 MiB: far beyond any cache
  std::unique_ptr<uint64_t[]> buf(new uint64_t[words]);
  std::memset(buf.get(), 1, words * sizeof(uint64_t));
  volatile uint64_t sink_u = 0;
  std::vector<uint64_t> sums(threads);
  const double s =
      Seconds(threads, [&](int t) { sums[t] = ReadAll(buf.get() + words / threads * t, words / threads); });
  p.read_bytes_per_s = static_cast<double>(words * sizeof(uint64_t)) / s;
  for (uint64_t v : sums) sink_u = sink_u + v;
  for (int t = 0; t < threads; ++t) sink_u = sink_u + static_cast<uint64_t>(sink_f[t]) + sink_i[t];
  return p;
}

MachinePeak Higher(const MachinePeak& a, const MachinePeak& b) {
  MachinePeak h = a;
  h.fp32_flops = std::max(a.fp32_flops, b.fp32_flops);
  h.int8_ops = std::max(a.int8_ops, b.int8_ops);
  h.bf16_flops = std::max(a.bf16_flops, b.bf16_flops);
  h.read_bytes_per_s = std::max(a.read_bytes_per_s, b.read_bytes_per_s);
  return h;
}

}  // namespace ps::bench
