#include "kernels/cuda/cuda_kernels.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <string>

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
  PS_CUDA_RETURN_IF_ERROR(cudaMemcpy(d.f(), h, n * sizeof(float), cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

__global__ void RmsNormKernel(const float* x, const float* w, float* out, int n, float eps) {
  const float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  float* o = out + static_cast<int64_t>(blockIdx.x) * n;
  __shared__ float partial[256];
  float ss = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += row[i] * row[i];
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float scale = rsqrtf(partial[0] / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = row[i] * scale * w[i];
}

__global__ void SiluMulKernel(float* gate, const float* up, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const float g = gate[i];
    gate[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

// cuBLAS, loaded when first used rather than linked: libcublasLt's 94 KiB of static
// TLS would otherwise raise the minimum stack of every thread in the process, and
// threads started with a small fixed stack (the metrics server's) fail to start.
struct Cublas {
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t) = nullptr;
  cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const float*,
                          const float*, int, const float*, int, const float*, float*, int) = nullptr;
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
    c.destroy = reinterpret_cast<decltype(c.destroy)>(dlsym(h, "cublasDestroy_v2"));
    c.sgemm = reinterpret_cast<decltype(c.sgemm)>(dlsym(h, "cublasSgemm_v2"));
    if (c.create == nullptr || c.destroy == nullptr || c.sgemm == nullptr)
      c.error = name + " lacks a cuBLAS entry point";
    return c;
  }();
  return lib;
}

}  // namespace

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
  PS_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  return MemoryRegion{.base = static_cast<uint8_t*>(p), .release = [](uint8_t* q) { cudaFree(q); }};
}

absl::StatusOr<MemoryRegion> AllocatePinned(size_t bytes) {
  void* p = nullptr;
  PS_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  return MemoryRegion{.base = static_cast<uint8_t*>(p), .release = [](uint8_t* q) { cudaFreeHost(q); }};
}

absl::Status Gemm(const float* x, const float* w, float* y, int m, int n, int k) {
  DeviceBuffer dx, dw, dy;
  if (absl::Status s = Upload(dx, x, size_t(m) * k); !s.ok()) return s;
  if (absl::Status s = Upload(dw, w, size_t(n) * k); !s.ok()) return s;
  if (absl::Status s = dy.Alloc(size_t(m) * n * sizeof(float)); !s.ok()) return s;
  const Cublas& cublas = LoadCublas();
  if (!cublas.error.empty()) return absl::FailedPreconditionError(cublas.error);
  cublasHandle_t h;
  if (cublas.create(&h) != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasCreate failed");
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major y = x w^T is column-major y^T = w x^T.
  const cublasStatus_t st =
      cublas.sgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, dw.f(), k, dx.f(), k, &beta, dy.f(), n);
  cublas.destroy(h);
  if (st != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasSgemm failed: " + std::to_string(st));
  PS_CUDA_RETURN_IF_ERROR(cudaMemcpy(y, dy.f(), size_t(m) * n * sizeof(float), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status RmsNorm(const float* x, const float* w, float* out, int rows, int n, float eps) {
  DeviceBuffer dx, dw, dout;
  if (absl::Status s = Upload(dx, x, size_t(rows) * n); !s.ok()) return s;
  if (absl::Status s = Upload(dw, w, n); !s.ok()) return s;
  if (absl::Status s = dout.Alloc(size_t(rows) * n * sizeof(float)); !s.ok()) return s;
  RmsNormKernel<<<rows, 256>>>(dx.f(), dw.f(), dout.f(), n, eps);
  PS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  PS_CUDA_RETURN_IF_ERROR(cudaMemcpy(out, dout.f(), size_t(rows) * n * sizeof(float), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status SiluMul(float* gate, const float* up, int64_t n) {
  DeviceBuffer dg, du;
  if (absl::Status s = Upload(dg, gate, n); !s.ok()) return s;
  if (absl::Status s = Upload(du, up, n); !s.ok()) return s;
  SiluMulKernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(dg.f(), du.f(), n);
  PS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  PS_CUDA_RETURN_IF_ERROR(cudaMemcpy(gate, dg.f(), n * sizeof(float), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

}  // namespace ps::cuda
