// The machine's own ceilings, measured the way the kernels run: dependent-free
// multiply-add loops at the active CPU level (FP32 FMA; the int8 dot products the packed
// kernels use; BF16 dot products where the CPU has them) and a streaming read, on a
// given number of threads. The benchmarks print their figures as shares of these.
#pragma once

#include <string>

namespace ps::bench {

struct MachinePeak {
  std::string isa;              // the CPU level the loops ran at (kernels/cpu/cpu_isa.h)
  double fp32_flops = 0;        // FP32 fused multiply-adds, 2 FLOP each
  double int8_ops = 0;          // u8 x s8 products summed as the packed kernels do, 2 OP each
  double bf16_flops = 0;        // BF16 dot products (0 where the CPU has none)
  double read_bytes_per_s = 0;  // streaming read of a buffer far larger than the caches
};

MachinePeak MeasureMachinePeak(int threads);

// Each ceiling the higher of two readings. A shared machine's readings swing (a neighbour
// busy on the memory or the cores for a while: 30-50% on the VMs this is measured on),
// and a low reading would overstate every share taken of it: benchmarks read the
// ceilings again after each figure and keep the highest.
MachinePeak Higher(const MachinePeak& a, const MachinePeak& b);

}  // namespace ps::bench
