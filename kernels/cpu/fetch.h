// Software prefetches that the compiler keeps: asm statements asking for the cache line
// at an address, into L1 (prefetcht0) or only into L2 (prefetcht1). GCC 12 deleted loops of
// _mm_prefetch calls as if they did nothing (the AVX-512 decode value passes had no
// prefetch instruction left from 2026-12-01 to 12-02; with them back, ps_bench_attention's
// decode at 8,192 keys on a Zen 4: Qwen2.5-0.5B's shape 245 -> 213 us a layer, LLaMA-3-8B's
// 1,943 -> 1,474). Every software prefetch of the CPU kernels goes through these. The
// address goes in as a register, never dereferenced: one past a buffer's end is fine (a
// prefetch does not fault), and the compiler need not think the statement reads memory (as
// a memory operand, "m", it made GCC store the small-batch BF16 tile's accumulators to the
// stack at every step: that pass ran at half its speed).
#pragma once

namespace ps {

inline void FetchLineL1(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht0 (%0)" : : "r"(p));
#else
  __builtin_prefetch(p, 0, 3);
#endif
}

inline void FetchLineL2(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht1 (%0)" : : "r"(p));
#else
  __builtin_prefetch(p, 0, 2);
#endif
}

}  // namespace ps
