#include "kernels/cuda/attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/shared_math.h"

namespace ps::cuda {
namespace {

constexpr int kThreads = 128;  // threads per (query row, head); keys per tile
constexpr int kMaxHeadDim = 256;

absl::Status Launched(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? absl::OkStatus() : absl::InternalError(std::string(kernel) + ": " + cudaGetErrorString(e));
}

__device__ float Load(DType dtype, const void* base, int64_t i) {
  if (dtype == DType::kF32) return static_cast<const float*>(base)[i];
  if (dtype == DType::kF16) return __half2float(static_cast<const __half*>(base)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}

// The block's reduction of v (max or sum); every thread gets it.
template <bool kMax>
__device__ float BlockReduce(float v, float* scratch) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float o = scratch[threadIdx.x + s];
      scratch[threadIdx.x] = kMax ? fmaxf(scratch[threadIdx.x], o) : scratch[threadIdx.x] + o;
    }
    __syncthreads();
  }
  const float r = scratch[0];
  __syncthreads();
  return r;
}

// Block (query row blockIdx.x, head blockIdx.y).
__global__ void AttentionKernel(AttentionDeviceArgs a) {
  __shared__ float q[kMaxHeadDim];
  __shared__ float acc[kMaxHeadDim];
  __shared__ float p[kThreads];
  __shared__ float scratch[kThreads];
  const int64_t qi = blockIdx.x;
  const int h = blockIdx.y, hd = a.head_dim;
  const int kvh = h / (a.n_heads / a.n_kv_heads);
  const int32_t q_pos = a.q_pos[qi];
  const bool last = a.last_logits != nullptr && qi == a.n_q - 1;
  for (int c = threadIdx.x; c < hd; c += kThreads) {
    q[c] = a.q[qi * a.q_stride + static_cast<int64_t>(h) * hd + c];
    acc[c] = 0.0f;
  }
  __syncthreads();
  const float neg_inf = -INFINITY;
  float m = neg_inf, l = 0.0f;  // the same in every thread (from block reductions)
  // Where the KV head's rows are: blocks of its own, or its columns of shared rows.
  const int64_t head_block = a.head_blocks > 0 ? kvh * a.head_blocks : 0;
  const int64_t head_col = a.head_blocks > 0 ? 0 : static_cast<int64_t>(kvh) * hd;
  for (int s = 0; s < a.n_segments; ++s) {
    const AttentionSegment seg = a.segments[s];
    if (qi < seg.q_begin || qi >= seg.q_end || (seg.kv_head >= 0 && seg.kv_head != kvh)) continue;
    for (int r = seg.range_begin; r < seg.range_end; ++r) {
      const int32_t begin = a.ranges[2 * r], end = a.ranges[2 * r + 1];
      for (int32_t t0 = begin; t0 < end; t0 += kThreads) {
        const int32_t j = t0 + static_cast<int32_t>(threadIdx.x);
        float score = neg_inf;
        if (j < end) {
          if (WindowSees(a.window_part, a.sinks, a.recent, a.positions[j], q_pos)) {
            const void* block = a.k_blocks[head_block + j / a.block_rows];
            const int64_t at = (j % a.block_rows) * a.stride + head_col;
            float dot = 0.0f;
            for (int c = 0; c < hd; ++c) dot += q[c] * Load(a.dtype, block, at + c);
            score = dot * a.scale;
          }
          if (last) a.last_logits[static_cast<int64_t>(h) * a.n + j] = score;
        }
        const float m_new = fmaxf(m, BlockReduce<true>(score, scratch));
        if (m_new == neg_inf) continue;  // nothing visible yet (block-uniform)
        const float corr = m == neg_inf ? 0.0f : expf(m - m_new);
        const float e = score == neg_inf ? 0.0f : expf(score - m_new);
        p[threadIdx.x] = e;
        l = l * corr + BlockReduce<false>(e, scratch);  // its barriers publish p
        m = m_new;
        const int count = min(kThreads, end - t0);
        for (int c = threadIdx.x; c < hd; c += kThreads) {
          float o = acc[c] * corr;
          for (int jj = 0; jj < count; ++jj) {
            if (p[jj] == 0.0f) continue;
            const int32_t row = t0 + jj;
            o += p[jj] * Load(a.dtype, a.v_blocks[head_block + row / a.block_rows],
                              (row % a.block_rows) * a.stride + head_col + c);
          }
          acc[c] = o;
        }
        __syncthreads();  // p is rewritten by the next tile
      }
    }
  }
  float* out = a.out + qi * a.out_stride + static_cast<int64_t>(h) * hd;
  for (int c = threadIdx.x; c < hd; c += kThreads) out[c] = l > 0 ? acc[c] / l : 0.0f;
  if (threadIdx.x == 0) {
    if (a.lse != nullptr) a.lse[qi * a.lse_stride + h] = l > 0 ? m + logf(l) : neg_inf;
    if (last) {
      a.last_norm[2 * h] = m;
      a.last_norm[2 * h + 1] = l;
    }
  }
}

__global__ void FillKernel(float* x, int64_t n, float v) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = v;
}

__global__ void LastQueryStatsKernel(const float* last_logits, const float* last_norm, int n_heads, int64_t n,
                                     float* probs, float* logits) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  float prob = 0.0f, sum = 0.0f;
  for (int h = 0; h < n_heads; ++h) {
    const float x = last_logits[h * n + j], m = last_norm[2 * h], l = last_norm[2 * h + 1];
    sum += x;
    if (l > 0 && x != -INFINITY) prob += expf(x - m) / (l * static_cast<float>(n_heads));
  }
  if (probs != nullptr) probs[j] = prob;
  if (logits != nullptr) logits[j] = sum;
}

unsigned Blocks(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }

}  // namespace

absl::Status AttentionDevice(const AttentionDeviceArgs& a) {
  if (a.head_dim > kMaxHeadDim) {
    return absl::InvalidArgumentError("head_dim " + std::to_string(a.head_dim) + " above " +
                                      std::to_string(kMaxHeadDim));
  }
  if (a.n_q == 0 || a.n_heads == 0) return absl::OkStatus();
  AttentionKernel<<<dim3(static_cast<unsigned>(a.n_q), static_cast<unsigned>(a.n_heads)), kThreads>>>(a);
  return Launched("AttentionKernel");
}

absl::Status FillDevice(float* x, int64_t n, float v) {
  if (n == 0) return absl::OkStatus();
  FillKernel<<<Blocks(n), 256>>>(x, n, v);
  return Launched("FillKernel");
}

absl::Status LastQueryStatsDevice(const float* last_logits, const float* last_norm, int n_heads, int64_t n,
                                  float* probs, float* logits) {
  if (n == 0) return absl::OkStatus();
  LastQueryStatsKernel<<<Blocks(n), 256>>>(last_logits, last_norm, n_heads, n, probs, logits);
  return Launched("LastQueryStatsKernel");
}

}  // namespace ps::cuda
