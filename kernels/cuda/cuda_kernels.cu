#include "kernels/cuda/cuda_kernels.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/shared_math.h"

namespace ps::cuda {
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(std::string(what) + ": " + cudaGetErrorString(e));
}

#define PS_CUDA_RETURN_IF_ERROR(expr)                             \
  do {                                                            \
    cudaError_t ps_err_ = (expr);                                 \
    if (ps_err_ != cudaSuccess) return CudaError(ps_err_, #expr); \
  } while (0)

constexpr int kThreads = 256;

unsigned Blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// The launch's error (a bad configuration), if any.
absl::Status Launched(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? absl::OkStatus() : CudaError(e, kernel);
}

// Device buffer released on scope exit.
class DeviceBuffer {
 public:
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  absl::Status Alloc(size_t bytes) {
    PS_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr_, bytes));
    return absl::OkStatus();
  }
  float* f() { return static_cast<float*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

absl::Status Upload(DeviceBuffer& d, const float* h, size_t n) {
  if (absl::Status s = d.Alloc(n * sizeof(float)); !s.ok()) return s;
  PS_CUDA_RETURN_IF_ERROR(cudaMemcpy(d.f(), h, n * sizeof(float), cudaMemcpyDefault));
  return absl::OkStatus();
}

// Sum of v over the block (blockDim.x == kThreads); every thread gets it.
__device__ float BlockSum(float v) {
  __shared__ float partial[kThreads];
  partial[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float sum = partial[0];
  __syncthreads();  // partial is reused by the next call
  return sum;
}

// One block per row: optionally x += delta first, then out = x / rms(x) * w.
__global__ void RmsNormKernel(const float* delta, float* x, const float* w, float* out, int64_t n, float eps) {
  float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  const float* d = delta != nullptr ? delta + static_cast<int64_t>(blockIdx.x) * n : nullptr;
  float* o = out + static_cast<int64_t>(blockIdx.x) * n;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float v = row[i];
    if (d != nullptr) {
      v += d[i];
      row[i] = v;
    }
    ss += v * v;
  }
  const float scale = rsqrtf(BlockSum(ss) / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) o[i] = row[i] * scale * w[i];
}

__global__ void AddKernel(const float* x, float* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}

__global__ void SiluMulKernel(float* gate, const float* up, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const float g = gate[i];
    gate[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void GatherRowsKernel(const float* src, const int32_t* rows, int64_t n_rows, int64_t width, float* dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * width) return;
  const int32_t from = rows[i / width];
  if (from >= 0) dst[i] = src[static_cast<int64_t>(from) * width + i % width];
}

// Block (run, column tile): each thread reduces one column over the run's rows
// (neighbouring threads read neighbouring floats of a row).
__global__ void ReduceRowRunsKernel(const float* x, int64_t width, const int32_t* bounds, bool max_min, float* out) {
  const int64_t run = blockIdx.x, c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= width) return;
  const int64_t begin = bounds[run], end = bounds[run + 1];
  float a = x[begin * width + c], b = a;
  for (int64_t r = begin + 1; r < end; ++r) {
    const float v = x[r * width + c];
    if (max_min) {
      a = fmaxf(a, v);
      b = fminf(b, v);
    } else {
      a += v;
    }
  }
  if (max_min) {
    out[2 * run * width + c] = a;
    out[(2 * run + 1) * width + c] = b;
  } else {
    out[run * width + c] = a;
  }
}

__global__ void MergeByGateKernel(int64_t n, int heads, int hd, float* o_p, int64_t p_stride, const float* o_d,
                                  int64_t d_stride, const float* lse_p, const float* lse_d, int64_t lse_stride) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * heads * hd) return;
  const int64_t i = idx / (static_cast<int64_t>(heads) * hd);
  const int h = static_cast<int>(idx / hd % heads), c = static_cast<int>(idx % hd);
  const float g = ProximalGate(lse_p[i * lse_stride + h], lse_d[i * lse_stride + h]);
  float* p = o_p + i * p_stride + static_cast<int64_t>(h) * hd + c;
  *p = g * *p + (1.0f - g) * o_d[i * d_stride + static_cast<int64_t>(h) * hd + c];
}

// One block per row: the biases, the rotation of every (head, pair) of q and k, then k's
// shift (backend.h's QkvBias).
__global__ void BiasRopeKernel(RopeDevice rope, const int32_t* positions, const float* bq, const float* bk,
                               const float* bv, const float* bk_shift, float* q, float* k, float* v, int n_heads,
                               int n_kv_heads, int head_dim) {
  const int64_t r = blockIdx.x;
  const int qd = n_heads * head_dim, kvd = n_kv_heads * head_dim;
  float* qr = q + r * qd;
  float* kr = k + r * kvd;
  if (bq != nullptr) {
    for (int j = threadIdx.x; j < qd; j += blockDim.x) qr[j] += bq[j];
    for (int j = threadIdx.x; j < kvd; j += blockDim.x) {
      kr[j] += bk[j];
      v[r * kvd + j] += bv[j];
    }
    __syncthreads();
  }
  const int half = rope.n_dims / 2;
  const float pos = static_cast<float>(positions[r]);
  for (int t = threadIdx.x; t < (n_heads + n_kv_heads) * half; t += blockDim.x) {
    const int head = t / half, i = t % half;
    float theta = pos;
    for (int j = 0; j < i; ++j) theta *= rope.theta_scale;  // the CPU's running product
    const float angle = RopeAngle(theta, rope.freq_factors != nullptr ? rope.freq_factors[i] : 1.0f, rope.freq_scale);
    float s = 0, c = 0;
    sincosf(angle, &s, &c);
    float* x = head < n_heads ? qr + head * head_dim : kr + (head - n_heads) * head_dim;
    int a = 0, b = 0;
    RopePair(rope.neox, i, half, &a, &b);
    RopeRotate(c, s, &x[a], &x[b]);
  }
  if (bk_shift != nullptr) {
    __syncthreads();
    for (int j = threadIdx.x; j < kvd; j += blockDim.x) kr[j] += bk_shift[j];
  }
}

__global__ void ToBf16Kernel(const float* x, __nv_bfloat16* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(x[i]);
}

__global__ void EmbedKernel(const void* table, bool bf16, const int32_t* tokens, int64_t n, int64_t cols, float* x) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * cols) return;
  const int64_t at = static_cast<int64_t>(tokens[i / cols]) * cols + i % cols;
  x[i] = bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(table)[at]) : static_cast<const float*>(table)[at];
}

__global__ void StoreKvKernel(DType dtype, int64_t kv_dim, int64_t n, const float* k, const float* v,
                              uint8_t* const* k_dst, uint8_t* const* v_dst) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * kv_dim) return;
  const int64_t r = idx / kv_dim, c = idx % kv_dim;
  if (dtype == DType::kF32) {
    reinterpret_cast<float*>(k_dst[r])[c] = k[idx];
    reinterpret_cast<float*>(v_dst[r])[c] = v[idx];
  } else if (dtype == DType::kF16) {
    reinterpret_cast<__half*>(k_dst[r])[c] = __float2half_rn(k[idx]);
    reinterpret_cast<__half*>(v_dst[r])[c] = __float2half_rn(v[idx]);
  } else {
    reinterpret_cast<__nv_bfloat16*>(k_dst[r])[c] = __float2bfloat16_rn(k[idx]);
    reinterpret_cast<__nv_bfloat16*>(v_dst[r])[c] = __float2bfloat16_rn(v[idx]);
  }
}

// cuBLAS, loaded when first used rather than linked: libcublasLt's 94 KiB of static
// TLS would otherwise raise the minimum stack of every thread in the process, and
// threads started with a small fixed stack (the metrics server's) fail to start.
struct Cublas {
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const float*,
                          const float*, int, const float*, int, const float*, float*, int) = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  cublasHandle_t handle = nullptr;  // one for the process, on the legacy default stream
  std::string error;
};

const Cublas& LoadCublas() {
  static const Cublas lib = [] {
    Cublas c;
    const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      c.error = "cannot load " + name + ": " + dlerror();
      return c;
    }
    c.create = reinterpret_cast<decltype(c.create)>(dlsym(h, "cublasCreate_v2"));
    c.sgemm = reinterpret_cast<decltype(c.sgemm)>(dlsym(h, "cublasSgemm_v2"));
    c.gemm_ex = reinterpret_cast<decltype(c.gemm_ex)>(dlsym(h, "cublasGemmEx"));
    if (c.create == nullptr || c.sgemm == nullptr || c.gemm_ex == nullptr) {
      c.error = name + " lacks a cuBLAS entry point";
    } else if (const cublasStatus_t st = c.create(&c.handle); st != CUBLAS_STATUS_SUCCESS) {
      c.error = "cublasCreate failed: " + std::to_string(st);
    }
    return c;
  }();
  return lib;
}

}  // namespace

int MultiprocessorCount() {
  static const int count = [] {
    int device = 0, n = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      return 1;
    }
    return n > 0 ? n : 1;
  }();
  return count;
}

absl::StatusOr<int64_t> FreeDeviceBytes() {
  size_t free = 0, total = 0;
  PS_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total));
  return static_cast<int64_t>(free);
}

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

absl::Status DeviceAvailable() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess)
    return absl::UnavailableError(std::string("no usable CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(e) +
                                  ")");
  if (n == 0) return absl::UnavailableError("no CUDA device: cudaGetDeviceCount found none");
  return absl::OkStatus();
}

absl::StatusOr<MemoryRegion> AllocateDevice(size_t bytes) {
  void* p = nullptr;
  PS_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes > 0 ? bytes : 1));  // never null: an empty tier is still a tier
  return MemoryRegion{.base = static_cast<uint8_t*>(p), .release = [](uint8_t* q) { cudaFree(q); }};
}

absl::StatusOr<MemoryRegion> AllocatePinned(size_t bytes) {
  void* p = nullptr;
  PS_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, bytes > 0 ? bytes : 1, cudaHostAllocDefault));
  return MemoryRegion{.base = static_cast<uint8_t*>(p), .release = [](uint8_t* q) { cudaFreeHost(q); }};
}

absl::Status Copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return absl::OkStatus();
  PS_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  return absl::OkStatus();
}

absl::Status Synchronize() {
  PS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

StagingRing::~StagingRing() {
  if (!events_.empty()) cudaEventSynchronize(static_cast<cudaEvent_t>(events_.back()));
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  for (void* e : spare_events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  if (pinned_.release) pinned_.release(pinned_.base);
}

absl::Status StagingRing::Retire(size_t n) {
  if (n == 0) return absl::OkStatus();
  const cudaError_t e = cudaEventSynchronize(static_cast<cudaEvent_t>(events_[n - 1]));
  spare_events_.insert(spare_events_.end(), events_.begin(), events_.begin() + static_cast<ptrdiff_t>(n));
  events_.erase(events_.begin(), events_.begin() + static_cast<ptrdiff_t>(n));
  PS_CUDA_RETURN_IF_ERROR(e);
  return absl::OkStatus();
}

absl::Status StagingRing::CopyToDevice(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  constexpr size_t kAlign = 64, kMinCapacity = size_t{4} << 20;
  const size_t need = (bytes + kAlign - 1) / kAlign * kAlign;
  if (need > space_.capacity() / 4) {  // a larger ring, once the copies from this one are done
    if (absl::Status s = Retire(events_.size()); !s.ok()) return s;
    const size_t capacity = std::max(kMinCapacity, 8 * need);
    absl::StatusOr<MemoryRegion> bigger = AllocatePinned(capacity);
    if (!bigger.ok()) return bigger.status();
    if (pinned_.release) pinned_.release(pinned_.base);
    pinned_ = std::move(*bigger);
    space_ = RingSpace(capacity);
  }
  cudaEvent_t event = nullptr;  // to follow the copy (one per allocation of space_)
  if (!spare_events_.empty()) {
    event = static_cast<cudaEvent_t>(spare_events_.back());
    spare_events_.pop_back();
  } else {
    PS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  const RingSpace::Slot slot = space_.Allocate(need);
  events_.push_back(event);
  if (absl::Status s = Retire(slot.retire); !s.ok()) return s;
  std::memcpy(pinned_.base + slot.begin, src, bytes);
  PS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, pinned_.base + slot.begin, bytes, cudaMemcpyHostToDevice, 0));
  PS_CUDA_RETURN_IF_ERROR(cudaEventRecord(event, 0));
  return absl::OkStatus();
}

absl::Status GemmDevice(const float* x, const float* w, float* y, int m, int n, int k) {
  const Cublas& cublas = LoadCublas();
  if (!cublas.error.empty()) return absl::FailedPreconditionError(cublas.error);
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major y = x w^T is column-major y^T = w x^T.
  const cublasStatus_t st =
      cublas.sgemm(cublas.handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, k, x, k, &beta, y, n);
  if (st != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasSgemm failed: " + std::to_string(st));
  return absl::OkStatus();
}

absl::Status GemmBf16Device(const uint16_t* x, const uint16_t* w, float* y, int m, int n, int k) {
  const Cublas& cublas = LoadCublas();
  if (!cublas.error.empty()) return absl::FailedPreconditionError(cublas.error);
  const float alpha = 1.0f, beta = 0.0f;
  // compute-sanitizer's initcheck does not see the stores of cuBLAS's BF16 kernels on
  // Hopper: it reported every read of their outputs (270,720 reads in the tiny-model
  // test on an H100), and none once the output was zeroed first, with the same results.
  // Its phase (scripts/gpu_checks.sh) sets PS_CUDA_ZERO_GEMM_OUTPUT for that memset.
  static const bool zero_output = std::getenv("PS_CUDA_ZERO_GEMM_OUTPUT") != nullptr;
  if (zero_output) PS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(y, 0, sizeof(float) * m * n));
  const cublasStatus_t st =
      cublas.gemm_ex(cublas.handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, k, x, CUDA_R_16BF, k,
                     &beta, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasGemmEx failed: " + std::to_string(st));
  return absl::OkStatus();
}

absl::Status ToBf16Device(const float* x, uint16_t* out, int64_t n) {
  if (n == 0) return absl::OkStatus();
  ToBf16Kernel<<<Blocks(n), kThreads>>>(x, reinterpret_cast<__nv_bfloat16*>(out), n);
  return Launched("ToBf16Kernel");
}

absl::Status EmbedDevice(const void* table, bool bf16, const int32_t* tokens, int64_t n, int64_t cols, float* x) {
  if (n * cols == 0) return absl::OkStatus();
  EmbedKernel<<<Blocks(n * cols), kThreads>>>(table, bf16, tokens, n, cols, x);
  return Launched("EmbedKernel");
}

absl::Status RmsNormDevice(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps) {
  if (rows == 0) return absl::OkStatus();
  // x is only read when there is no delta.
  RmsNormKernel<<<static_cast<unsigned>(rows), kThreads>>>(nullptr, const_cast<float*>(x), w, out, n, eps);
  return Launched("RmsNormKernel");
}

absl::Status AddRmsNormDevice(const float* delta, float* x, const float* w, float* out, int64_t rows, int64_t n,
                              float eps) {
  if (rows == 0) return absl::OkStatus();
  RmsNormKernel<<<static_cast<unsigned>(rows), kThreads>>>(delta, x, w, out, n, eps);
  return Launched("RmsNormKernel (add)");
}

absl::Status AddDevice(const float* x, float* y, int64_t n) {
  if (n == 0) return absl::OkStatus();
  AddKernel<<<Blocks(n), kThreads>>>(x, y, n);
  return Launched("AddKernel");
}

absl::Status SiluMulDevice(float* gate, const float* up, int64_t n) {
  if (n == 0) return absl::OkStatus();
  SiluMulKernel<<<Blocks(n), kThreads>>>(gate, up, n);
  return Launched("SiluMulKernel");
}

absl::Status GatherRowsDevice(const float* src, const int32_t* rows, int64_t n_rows, int64_t width, float* dst) {
  if (n_rows * width == 0) return absl::OkStatus();
  GatherRowsKernel<<<Blocks(n_rows * width), kThreads>>>(src, rows, n_rows, width, dst);
  return Launched("GatherRowsKernel");
}

absl::Status ReduceRowRunsDevice(const float* x, int64_t width, const int32_t* bounds, int64_t runs, bool max_min,
                                 float* out) {
  if (runs == 0 || width == 0) return absl::OkStatus();
  const dim3 grid(static_cast<unsigned>(runs), static_cast<unsigned>((width + kThreads - 1) / kThreads));
  ReduceRowRunsKernel<<<grid, kThreads>>>(x, width, bounds, max_min, out);
  return Launched("ReduceRowRunsKernel");
}

absl::Status MergeByGateDevice(int64_t n, int heads, int hd, float* o_p, int64_t p_stride, const float* o_d,
                               int64_t d_stride, const float* lse_p, const float* lse_d, int64_t lse_stride) {
  const int64_t total = n * heads * hd;
  if (total == 0) return absl::OkStatus();
  MergeByGateKernel<<<Blocks(total), kThreads>>>(n, heads, hd, o_p, p_stride, o_d, d_stride, lse_p, lse_d, lse_stride);
  return Launched("MergeByGateKernel");
}

absl::Status BiasRopeDevice(const RopeDevice& rope, const int32_t* positions, int64_t rows, const float* bq,
                            const float* bk, const float* bv, const float* bk_shift, float* q, float* k, float* v,
                            int n_heads, int n_kv_heads, int head_dim) {
  if (rows == 0) return absl::OkStatus();
  BiasRopeKernel<<<static_cast<unsigned>(rows), kThreads>>>(rope, positions, bq, bk, bv, bk_shift, q, k, v, n_heads,
                                                            n_kv_heads, head_dim);
  return Launched("BiasRopeKernel");
}

absl::Status StoreKvDevice(DType dtype, int64_t kv_dim, int64_t n, const float* k, const float* v,
                           uint8_t* const* k_dst, uint8_t* const* v_dst) {
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError("KV rows must be F32, F16 or BF16");
  }
  if (n * kv_dim == 0) return absl::OkStatus();
  StoreKvKernel<<<Blocks(n * kv_dim), kThreads>>>(dtype, kv_dim, n, k, v, k_dst, v_dst);
  return Launched("StoreKvKernel");
}

absl::Status Gemm(const float* x, const float* w, float* y, int m, int n, int k) {
  DeviceBuffer dx, dw, dy;
  if (absl::Status s = Upload(dx, x, size_t(m) * k); !s.ok()) return s;
  if (absl::Status s = Upload(dw, w, size_t(n) * k); !s.ok()) return s;
  if (absl::Status s = dy.Alloc(size_t(m) * n * sizeof(float)); !s.ok()) return s;
  if (absl::Status s = GemmDevice(dx.f(), dw.f(), dy.f(), m, n, k); !s.ok()) return s;
  return Copy(y, dy.f(), size_t(m) * n * sizeof(float));
}

absl::Status RmsNorm(const float* x, const float* w, float* out, int rows, int n, float eps) {
  DeviceBuffer dx, dw, dout;
  if (absl::Status s = Upload(dx, x, size_t(rows) * n); !s.ok()) return s;
  if (absl::Status s = Upload(dw, w, n); !s.ok()) return s;
  if (absl::Status s = dout.Alloc(size_t(rows) * n * sizeof(float)); !s.ok()) return s;
  if (absl::Status s = RmsNormDevice(dx.f(), dw.f(), dout.f(), rows, n, eps); !s.ok()) return s;
  return Copy(out, dout.f(), size_t(rows) * n * sizeof(float));
}

absl::Status SiluMul(float* gate, const float* up, int64_t n) {
  DeviceBuffer dg, du;
  if (absl::Status s = Upload(dg, gate, n); !s.ok()) return s;
  if (absl::Status s = Upload(du, up, n); !s.ok()) return s;
  if (absl::Status s = SiluMulDevice(dg.f(), du.f(), n); !s.ok()) return s;
  return Copy(gate, dg.f(), n * sizeof(float));
}

}  // namespace ps::cuda
