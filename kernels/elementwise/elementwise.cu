// CUDA path of the elementwise ops: grid-stride loops, fp32 math; the gate backward reduces
// each row with one block in a fixed order (deterministic).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/elementwise/elementwise.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

__device__ __forceinline__ float LoadF(const void* p, DType dt, int64_t i) {
  return dt == DType::kBF16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i])
                            : static_cast<const float*>(p)[i];
}

__device__ __forceinline__ void StoreF(void* p, DType dt, int64_t i, float v) {
  if (dt == DType::kBF16) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

__global__ void AxpbyKernel(float alpha, const void* a, DType at, float beta, const void* b,
                            DType bt, void* out, DType ot, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float bv = beta == 0.0f ? 0.0f : beta * LoadF(b, bt, i);
    StoreF(out, ot, i, alpha * LoadF(a, at, i) + bv);
  }
}

__global__ void GateForwardKernel(const void* y, DType dt, const float* g, void* out, int64_t h_n) {
  const int64_t t = blockIdx.x;
  const float s = 1.0f / (1.0f + __expf(-g[t]));
  for (int64_t h = threadIdx.x; h < h_n; h += blockDim.x) {
    StoreF(out, dt, t * h_n + h, LoadF(y, dt, t * h_n + h) * s);
  }
}

__global__ void FillNormalKernel(void* p, DType dt, int64_t n, uint64_t seed, float std,
                                 uint64_t offset) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    StoreF(p, dt, i, std * HashNormal(seed, offset + static_cast<uint64_t>(i)));
  }
}

__global__ void AddColumnSumsKernel(const float* x, float* out, int64_t rows, int64_t cols) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= cols) return;
  float s = out[j];
  for (int64_t i = 0; i < rows; ++i) s += x[i * cols + j];
  out[j] = s;
}

constexpr int kGateThreads = 256;

__global__ void GateBackwardKernel(const void* dout, const void* y, DType dt, const float* g,
                                   void* dy, float* dg, int64_t h_n) {
  __shared__ float partial[kGateThreads];
  const int64_t t = blockIdx.x;
  const float s = 1.0f / (1.0f + __expf(-g[t]));
  float dot = 0.0f;
  for (int64_t h = threadIdx.x; h < h_n; h += kGateThreads) {
    const float d = LoadF(dout, dt, t * h_n + h);
    dot += d * LoadF(y, dt, t * h_n + h);
    StoreF(dy, dt, t * h_n + h, d * s);
  }
  partial[threadIdx.x] = dot;
  __syncthreads();
  for (int stride = kGateThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) dg[t] = s * (1.0f - s) * partial[0];
}

int Blocks(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<int>(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

cudaStream_t S(const Stream& s) { return s.cuda_stream; }

}  // namespace

absl::Status CastCuda(const Stream& stream, const Tensor& src, const Tensor& dst) {
  if (src.numel() == 0) return absl::OkStatus();
  AxpbyKernel<<<Blocks(src.numel()), 256, 0, S(stream)>>>(
      1.0f, src.data, src.dtype, 0.0f, nullptr, src.dtype, dst.data, dst.dtype, src.numel());
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status AxpbyCuda(const Stream& stream, float alpha, const Tensor& a, float beta,
                       const Tensor& b, const Tensor& out) {
  if (a.numel() == 0) return absl::OkStatus();
  AxpbyKernel<<<Blocks(a.numel()), 256, 0, S(stream)>>>(alpha, a.data, a.dtype, beta, b.data,
                                                        b.dtype, out.data, out.dtype, a.numel());
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status FillNormalCuda(const Stream& stream, const Tensor& t, uint64_t seed, float std,
                            uint64_t offset) {
  if (t.numel() == 0) return absl::OkStatus();
  FillNormalKernel<<<Blocks(t.numel()), 256, 0, S(stream)>>>(t.data, t.dtype, t.numel(), seed, std,
                                                             offset);
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status AddColumnSumsCuda(const Stream& stream, const Tensor& x, const Tensor& out) {
  if (x.dim(1) == 0) return absl::OkStatus();
  AddColumnSumsKernel<<<static_cast<unsigned>((x.dim(1) + 255) / 256), 256, 0, S(stream)>>>(
      x.as<float>(), out.as<float>(), x.dim(0), x.dim(1));
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status SigmoidGateForwardCuda(const Stream& stream, const Tensor& y, const Tensor& g,
                                    const Tensor& out) {
  if (y.numel() == 0) return absl::OkStatus();
  GateForwardKernel<<<static_cast<unsigned>(y.dim(0)), 256, 0, S(stream)>>>(
      y.data, y.dtype, g.as<float>(), out.data, y.dim(1));
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status SigmoidGateBackwardCuda(const Stream& stream, const Tensor& dout, const Tensor& y,
                                     const Tensor& g, const Tensor& dy, const Tensor& dg) {
  if (y.numel() == 0) return absl::OkStatus();
  GateBackwardKernel<<<static_cast<unsigned>(y.dim(0)), kGateThreads, 0, S(stream)>>>(
      dout.data, y.data, y.dtype, g.as<float>(), dy.data, dg.as<float>(), y.dim(1));
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace switchyard::kernels::internal
