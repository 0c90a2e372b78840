#include "kernels/cuda/attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
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

// Block (query row blockIdx.x, head blockIdx.y) of call blockIdx.z.
__global__ void AttentionKernel(const AttentionDeviceArgs* calls) {
  __shared__ float q[kMaxHeadDim];
  __shared__ float acc[kMaxHeadDim];
  __shared__ float p[kThreads];
  __shared__ float scratch[kThreads];
  const AttentionDeviceArgs a = calls[blockIdx.z];
  const int64_t qi = blockIdx.x;
  if (qi >= a.n_q) return;  // a call with fewer query rows than the largest
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

// ---- The tiled kernel: tensor cores (WMMA, F16 or BF16 with F32 accumulation) ----
//
// A thread block takes one KV head and a tile of kTileRows (query row, query head)
// pairs: the heads of the KV head's group for kTileRows / group query rows, so each
// K and V tile loaded into shared memory serves the whole group. It walks the
// selected keys in tiles of kTileKeys: S = Q K^T on the tensor cores into shared
// memory, the online softmax by the warp that owns the rows (masks, position windows,
// the last row's logits), then O += P V on the tensor cores with O in shared memory.
// Q and P are rounded to the KV's type. Four warps, 16 rows each.
constexpr int kTileRows = 64;
constexpr int kTileKeys = 64;
constexpr int kTileThreads = 128;
constexpr int kTiledMaxHeadDim = 128;

// Shared memory of the tiled kernel for a head dimension, in the order laid out:
// Q, K, V (16-bit, rows padded by 8 elements), P (16-bit), S and O (F32, rows
// padded by 4), then per-row maximum and sum, per-row query index and position, and
// per-key position. Every part starts 32-byte aligned, as WMMA's loads need.
__host__ __device__ inline size_t TiledSharedBytes(int hd) {
  return 2 * (3 * kTileRows * (hd + 8) + kTileRows * (kTileKeys + 8)) +
         4 * (kTileRows * (kTileKeys + 4) + kTileRows * (hd + 4)) + 4 * (4 * kTileRows + kTileKeys);
}

template <typename T>
__device__ T FromFloat(float x);
template <>
__device__ __half FromFloat<__half>(float x) {
  return __float2half(x);
}
template <>
__device__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

// Where split z's row for (query row qi, head h) starts in split_out: head_dim floats
// of unnormalised output, then the maximum and the sum.
__device__ inline int64_t SplitRow(const AttentionDeviceArgs& a, int z, int64_t qi, int h) {
  return ((z * a.n_q + qi) * a.n_heads + h) * static_cast<int64_t>(a.head_dim + 2);
}

// Block (query row blockIdx.x, head blockIdx.y) of call blockIdx.z, a thread per output
// column: merges the splits' partial softmaxes into the output, the log-sum-exp and the
// last row's maximum and sum (calls whose keys were not split are done).
__global__ void MergeSplitsKernel(const AttentionDeviceArgs* calls) {
  const AttentionDeviceArgs a = calls[blockIdx.z];
  const int64_t qi = blockIdx.x;
  if (a.splits == 1 || qi >= a.n_q) return;
  const int h = blockIdx.y, c = threadIdx.x, hd = a.head_dim;
  float m = -INFINITY;
  for (int z = 0; z < a.splits; ++z) m = fmaxf(m, a.split_out[SplitRow(a, z, qi, h) + hd]);
  float l = 0.0f, o = 0.0f;
  if (m != -INFINITY) {
    for (int z = 0; z < a.splits; ++z) {
      const float* part = a.split_out + SplitRow(a, z, qi, h);
      if (part[hd] == -INFINITY) continue;  // this split saw no key of the row
      const float w = expf(part[hd] - m);
      l += part[hd + 1] * w;
      o += part[c] * w;
    }
  }
  a.out[qi * a.out_stride + static_cast<int64_t>(h) * hd + c] = l > 0 ? o / l : 0.0f;
  if (c == 0) {
    if (a.lse != nullptr) a.lse[qi * a.lse_stride + h] = l > 0 ? m + logf(l) : -INFINITY;
    if (a.last_logits != nullptr && qi == a.n_q - 1) {
      a.last_norm[2 * h] = m;
      a.last_norm[2 * h + 1] = l;
    }
  }
}

// Block (query tile blockIdx.x, KV head blockIdx.y) of split blockIdx.z % max_splits of
// call blockIdx.z / max_splits.
template <typename T>
__global__ void __launch_bounds__(kTileThreads)
    TiledAttentionKernel(const AttentionDeviceArgs* calls, int group, int max_splits) {
  namespace wmma = nvcuda::wmma;
  extern __shared__ __align__(128) unsigned char smem[];
  const AttentionDeviceArgs a = calls[blockIdx.z / max_splits];
  const int hd = a.head_dim, kp = hd + 8, pp = kTileKeys + 8, sp = kTileKeys + 4, op = hd + 4;
  T* qs = reinterpret_cast<T*>(smem);
  T* ks = qs + kTileRows * kp;
  T* vs = ks + kTileKeys * kp;
  T* ps = vs + kTileKeys * kp;
  float* ss = reinterpret_cast<float*>(ps + kTileRows * pp);
  float* os = ss + kTileRows * sp;
  float* row_m = os + kTileRows * op;
  float* row_l = row_m + kTileRows;
  int* row_q = reinterpret_cast<int*>(row_l + kTileRows);  // the row's query index, -1 for none
  int* row_pos = row_q + kTileRows;
  int* key_pos = row_pos + kTileRows;

  const int split = static_cast<int>(blockIdx.z % max_splits);
  const int kvh = blockIdx.y, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int q_per_tile = kTileRows / group;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * q_per_tile;
  const int64_t q1 = min(a.n_q, q0 + q_per_tile);
  if (q0 >= a.n_q || split >= a.splits) return;  // past this call's tiles or splits
  const float neg_inf = -INFINITY;
  for (int r = tid; r < kTileRows; r += kTileThreads) {
    const int64_t qi = q0 + r / group;
    const bool valid = r < q_per_tile * group && qi < q1;
    row_q[r] = valid ? static_cast<int>(qi) : -1;
    row_pos[r] = valid ? a.q_pos[qi] : INT_MIN;
    row_m[r] = neg_inf;
    row_l[r] = 0.0f;
  }
  for (int i = tid; i < kTileRows * hd; i += kTileThreads) {
    const int r = i / hd, c = i % hd;
    const int64_t qi = q0 + r / group;
    const bool valid = r < q_per_tile * group && qi < q1;
    const int h = kvh * group + r % group;
    qs[r * kp + c] = FromFloat<T>(valid ? a.q[qi * a.q_stride + static_cast<int64_t>(h) * hd + c] : 0.0f);
    os[r * op + c] = 0.0f;
  }
  int32_t max_q_pos = INT_MIN;  // keys past every query of the tile are skipped
  for (int64_t qi = q0; qi < q1; ++qi) max_q_pos = max(max_q_pos, a.q_pos[qi]);
  const int64_t head_block = a.head_blocks > 0 ? kvh * a.head_blocks : 0;
  const int64_t head_col = a.head_blocks > 0 ? 0 : static_cast<int64_t>(kvh) * hd;
  const int pieces = hd / 8;  // 16-byte pieces of a key row
  int tile_no = 0;            // the key tiles in visiting order: split z takes every splits-th from z
  __syncthreads();

  for (int s = 0; s < a.n_segments; ++s) {
    const AttentionSegment seg = a.segments[s];
    if ((seg.kv_head >= 0 && seg.kv_head != kvh) || seg.q_end <= q0 || seg.q_begin >= q1) continue;
    for (int rg = seg.range_begin; rg < seg.range_end; ++rg) {
      const int32_t begin = a.ranges[2 * rg], end = a.ranges[2 * rg + 1];
      for (int32_t t0 = begin; t0 < end; t0 += kTileKeys) {
        if (tile_no++ % a.splits != split) continue;  // another split's tile
        const int cnt = min(kTileKeys, end - t0);
        if (!__syncthreads_or(tid < cnt && a.positions[t0 + tid] <= max_q_pos)) continue;
        // The K and V rows in 16-byte pieces: zeros past the range and for dropped
        // blocks (null: keys no query of this call sees).
        for (int i = tid; i < kTileKeys * pieces; i += kTileThreads) {
          const int jr = i / pieces, c8 = (i % pieces) * 8;
          uint4 kx = make_uint4(0, 0, 0, 0), vx = make_uint4(0, 0, 0, 0);
          if (jr < cnt) {
            const int32_t j = t0 + jr;
            const int64_t at = (j % a.block_rows) * a.stride + head_col + c8;
            const void* kb = a.k_blocks[head_block + j / a.block_rows];
            const void* vb = a.v_blocks[head_block + j / a.block_rows];
            if (kb != nullptr) kx = *reinterpret_cast<const uint4*>(static_cast<const T*>(kb) + at);
            if (vb != nullptr) vx = *reinterpret_cast<const uint4*>(static_cast<const T*>(vb) + at);
          }
          *reinterpret_cast<uint4*>(ks + jr * kp + c8) = kx;
          *reinterpret_cast<uint4*>(vs + jr * kp + c8) = vx;
        }
        if (tid < kTileKeys) key_pos[tid] = tid < cnt ? a.positions[t0 + tid] : INT_MAX;
        __syncthreads();

        // S = Q K^T for the warp's 16 rows.
        {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
          wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
          for (int n0 = 0; n0 < kTileKeys; n0 += 16) {
            wmma::fill_fragment(fc, 0.0f);
            for (int k0 = 0; k0 < hd; k0 += 16) {
              wmma::load_matrix_sync(fa, qs + warp * 16 * kp + k0, kp);
              wmma::load_matrix_sync(fb, ks + n0 * kp + k0, kp);
              wmma::mma_sync(fc, fa, fb, fc);
            }
            wmma::store_matrix_sync(ss + warp * 16 * sp + n0, fc, sp, wmma::mem_row_major);
          }
        }
        __syncwarp();

        // The online softmax of the warp's rows, two keys per lane.
        for (int rr = 0; rr < 16; ++rr) {
          const int r = warp * 16 + rr, qi = row_q[r];
          const bool in_seg = qi >= 0 && qi >= seg.q_begin && qi < seg.q_end;
          const bool last = in_seg && a.last_logits != nullptr && qi == a.n_q - 1;
          const int h = kvh * group + r % group;
          float sc[2];
          for (int e = 0; e < 2; ++e) {
            const int c = lane + 32 * e;
            float x = neg_inf;
            if (in_seg && c < cnt && WindowSees(a.window_part, a.sinks, a.recent, key_pos[c], row_pos[r])) {
              x = ss[r * sp + c] * a.scale;
            }
            if (last && c < cnt) a.last_logits[static_cast<int64_t>(h) * a.n + t0 + c] = x;
            sc[e] = x;
          }
          float mx = fmaxf(sc[0], sc[1]);
          for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
          const float m_old = row_m[r], m_new = fmaxf(m_old, mx);
          float corr = 1.0f, p0 = 0.0f, p1 = 0.0f;
          if (m_new != neg_inf) {
            corr = m_old == neg_inf ? 0.0f : expf(m_old - m_new);
            p0 = sc[0] == neg_inf ? 0.0f : expf(sc[0] - m_new);
            p1 = sc[1] == neg_inf ? 0.0f : expf(sc[1] - m_new);
          }
          float sum = p0 + p1;
          for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
          ps[r * pp + lane] = FromFloat<T>(p0);
          ps[r * pp + lane + 32] = FromFloat<T>(p1);
          if (corr != 1.0f) {
            for (int c = lane; c < hd; c += 32) os[r * op + c] *= corr;
          }
          __syncwarp();  // every lane has read row_m[r]
          if (lane == 0) {
            row_m[r] = m_new;
            row_l[r] = row_l[r] * corr + sum;
          }
        }
        __syncwarp();

        // O += P V for the warp's 16 rows.
        {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
          wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
          for (int n0 = 0; n0 < hd; n0 += 16) {
            wmma::load_matrix_sync(fc, os + warp * 16 * op + n0, op, wmma::mem_row_major);
            for (int k0 = 0; k0 < kTileKeys; k0 += 16) {
              wmma::load_matrix_sync(fa, ps + warp * 16 * pp + k0, pp);
              wmma::load_matrix_sync(fb, vs + k0 * kp + n0, kp);
              wmma::mma_sync(fc, fa, fb, fc);
            }
            wmma::store_matrix_sync(os + warp * 16 * op + n0, fc, op, wmma::mem_row_major);
          }
        }
        __syncthreads();  // K, V and key_pos are rewritten by the next tile
      }
    }
  }

  if (a.splits > 1) {  // this split's unnormalised rows, maxima and sums, for MergeSplitsKernel
    for (int i = tid; i < kTileRows * (hd + 2); i += kTileThreads) {
      const int r = i / (hd + 2), c = i % (hd + 2), qi = row_q[r];
      if (qi < 0) continue;
      const int h = kvh * group + r % group;
      a.split_out[SplitRow(a, split, qi, h) + c] = c < hd ? os[r * op + c] : c == hd ? row_m[r] : row_l[r];
    }
    return;
  }
  for (int i = tid; i < kTileRows * hd; i += kTileThreads) {
    const int r = i / hd, c = i % hd, qi = row_q[r];
    if (qi < 0) continue;
    const int h = kvh * group + r % group;
    const float l = row_l[r];
    a.out[qi * a.out_stride + static_cast<int64_t>(h) * hd + c] = l > 0 ? os[r * op + c] / l : 0.0f;
  }
  for (int r = tid; r < kTileRows; r += kTileThreads) {
    const int qi = row_q[r];
    if (qi < 0) continue;
    const int h = kvh * group + r % group;
    const float m = row_m[r], l = row_l[r];
    if (a.lse != nullptr) a.lse[qi * a.lse_stride + h] = l > 0 ? m + logf(l) : neg_inf;
    if (a.last_logits != nullptr && qi == a.n_q - 1) {
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

// Calls [0, n) (calls on the host, device_calls on the device) on the tiled kernel.
template <typename T>
absl::Status LaunchTiled(const AttentionDeviceArgs* calls, const AttentionDeviceArgs* device_calls, int n) {
  // Above 48 KiB of shared memory a kernel must ask for it, once.
  static const cudaError_t attribute =
      cudaFuncSetAttribute(TiledAttentionKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(TiledSharedBytes(kTiledMaxHeadDim)));
  if (attribute != cudaSuccess) {
    return absl::InternalError(std::string("TiledAttentionKernel shared memory: ") + cudaGetErrorString(attribute));
  }
  const AttentionDeviceArgs& first = calls[0];
  int64_t n_q = 0;
  int max_splits = 1;
  for (int i = 0; i < n; ++i) {
    n_q = std::max(n_q, calls[i].n_q);
    max_splits = std::max(max_splits, calls[i].splits);
  }
  const int group = first.n_heads / first.n_kv_heads;
  const int64_t q_per_tile = kTileRows / group;
  const auto tiles = static_cast<unsigned>((n_q + q_per_tile - 1) / q_per_tile);
  if (tiles == 0 || first.n_heads == 0) return absl::OkStatus();
  TiledAttentionKernel<T><<<dim3(tiles, static_cast<unsigned>(first.n_kv_heads), static_cast<unsigned>(n * max_splits)),
                            kTileThreads, TiledSharedBytes(first.head_dim)>>>(device_calls, group, max_splits);
  if (absl::Status s = Launched("TiledAttentionKernel"); !s.ok() || max_splits == 1) return s;
  MergeSplitsKernel<<<dim3(static_cast<unsigned>(n_q), static_cast<unsigned>(first.n_heads), static_cast<unsigned>(n)),
                      first.head_dim>>>(device_calls);
  return Launched("MergeSplitsKernel");
}

}  // namespace

// Whether the tiled kernel takes a call: 16-bit KV in 16-byte aligned rows, a head
// dimension of a multiple of 16 up to 128, whole GQA groups of at most a tile, and
// $PS_CUDA_ATTENTION not "naive" (which keeps every call on the first kernel: for
// comparisons on a GPU).
bool TiledApplies(const AttentionDeviceArgs& a) {
  static const bool naive = [] {
    const char* env = std::getenv("PS_CUDA_ATTENTION");
    return env != nullptr && std::strcmp(env, "naive") == 0;
  }();
  return !naive && (a.dtype == DType::kF16 || a.dtype == DType::kBF16) && a.head_dim % 16 == 0 &&
         a.head_dim <= kTiledMaxHeadDim && a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0 &&
         a.n_heads / a.n_kv_heads <= kTileRows && a.stride % 8 == 0 && a.rows_aligned16;
}

int64_t TiledBlocks(const AttentionDeviceArgs& a) {
  if (!TiledApplies(a)) return 0;
  const int64_t q_per_tile = kTileRows / (a.n_heads / a.n_kv_heads);
  return (a.n_q + q_per_tile - 1) / q_per_tile * a.n_kv_heads;
}

int AttentionSplits(const AttentionDeviceArgs& a, int64_t batch_blocks, int multiprocessors) {
  if (!TiledApplies(a) || a.n_q == 0) return 1;
  const int64_t key_tiles = (a.n + kTileKeys - 1) / kTileKeys;
  if (batch_blocks >= multiprocessors || key_tiles < 8) return 1;
  // About two thread blocks per multiprocessor, each with four key tiles or more.
  return static_cast<int>(std::min<int64_t>(
      {(2 * multiprocessors + batch_blocks - 1) / std::max<int64_t>(batch_blocks, 1), key_tiles / 4, 32}));
}

absl::Status AttentionDevice(const AttentionDeviceArgs* calls, const AttentionDeviceArgs* device_calls, int n) {
  int tiled = 0;  // the calls the tiled kernel takes come first
  for (int i = 0; i < n; ++i) {
    const AttentionDeviceArgs& a = calls[i];
    if (a.head_dim > kMaxHeadDim) {
      return absl::InvalidArgumentError("head_dim " + std::to_string(a.head_dim) + " above " +
                                        std::to_string(kMaxHeadDim));
    }
    if (a.n_heads != calls[0].n_heads || a.n_kv_heads != calls[0].n_kv_heads || a.head_dim != calls[0].head_dim ||
        a.dtype != calls[0].dtype) {
      return absl::InvalidArgumentError("attention calls run together must share their shape and KV type");
    }
    const bool t = TiledApplies(a);
    if (t && tiled < i) return absl::InvalidArgumentError("the tiled kernel's attention calls must come first");
    tiled += t ? 1 : 0;
    if (a.splits < 1 || (a.splits > 1 && (a.split_out == nullptr || !t))) {
      return absl::InvalidArgumentError("attention splits need the tiled kernel and split_out");
    }
  }
  // A grid has at most 65,535 blocks along z (calls times splits): larger batches in parts.
  constexpr int kMaxZ = 65535;
  for (int i = 0; i < tiled;) {
    int count = 0, splits = 1;
    while (i + count < tiled && (count + 1) * std::max(splits, calls[i + count].splits) <= kMaxZ) {
      splits = std::max(splits, calls[i + count].splits);
      ++count;
    }
    const absl::Status s = calls[0].dtype == DType::kF16
                               ? LaunchTiled<__half>(calls + i, device_calls + i, count)
                               : LaunchTiled<__nv_bfloat16>(calls + i, device_calls + i, count);
    if (!s.ok()) return s;
    i += count;
  }
  for (int i = tiled; i < n; i += kMaxZ) {
    const int count = std::min(kMaxZ, n - i);
    int64_t n_q = 0;
    for (int j = i; j < i + count; ++j) n_q = std::max(n_q, calls[j].n_q);
    if (n_q == 0 || calls[i].n_heads == 0) continue;
    AttentionKernel<<<dim3(static_cast<unsigned>(n_q), static_cast<unsigned>(calls[i].n_heads),
                           static_cast<unsigned>(count)),
                      kThreads>>>(device_calls + i);
    if (absl::Status s = Launched("AttentionKernel"); !s.ok()) return s;
  }
  return absl::OkStatus();
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
