#include "kernels/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

namespace ps::cuda {
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(std::string(what) + ": " + cudaGetErrorString(e));
}

#define PS_CUDA_RETURN_IF_ERROR(expr)                       \
  do {                                                      \
    cudaError_t ps_err_ = (expr);                           \
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

}  // namespace

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

absl::Status Gemm(const float* x, const float* w, float* y, int m, int n, int k) {
  DeviceBuffer dx, dw, dy;
  if (absl::Status s = Upload(dx, x, size_t(m) * k); !s.ok()) return s;
  if (absl::Status s = Upload(dw, w, size_t(n) * k); !s.ok()) return s;
  if (absl::Status s = dy.Alloc(size_t(m) * n * sizeof(float)); !s.ok()) return s;
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasCreate failed");
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major y = x w^T is column-major y^T = w x^T.
  const cublasStatus_t st =
      cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, dw.f(), k, dx.f(), k, &beta, dy.f(), n);
  cublasDestroy(h);
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
