// CUDA gradient norm: a fixed two-pass reduction (per-block fp64 partials into the workspace,
// then one block sums them in index order) and a one-thread clip-coefficient kernel.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/optim/grad_norm.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ double Sq(float x) { return static_cast<double>(x) * x; }
__device__ __forceinline__ double Sq(__nv_bfloat16 x) { return Sq(__bfloat162float(x)); }

// Fixed-shape tree over kThreads values in shared memory; the result is in s[0].
__device__ void BlockSum(double* s) {
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
    __syncthreads();
  }
}

template <typename G>
__global__ void PartialSumSquaresKernel(const G* __restrict__ grads, int64_t n,
                                        double* __restrict__ partials) {
  __shared__ double s[kThreads];
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads) {
    acc += Sq(grads[i]);
  }
  s[threadIdx.x] = acc;
  __syncthreads();
  BlockSum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s[0];
}

__global__ void FinalSumKernel(const double* __restrict__ partials, int num_partials, float* sum_sq,
                               bool accumulate) {
  __shared__ double s[kThreads];
  double acc = 0.0;
  for (int i = threadIdx.x; i < num_partials; i += kThreads) acc += partials[i];
  s[threadIdx.x] = acc;
  __syncthreads();
  BlockSum(s);
  if (threadIdx.x == 0) {
    const double prev = accumulate ? static_cast<double>(sum_sq[0]) : 0.0;
    sum_sq[0] = static_cast<float>(prev + s[0]);
  }
}

__global__ void ClipCoefficientKernel(const float* sum_sq, float max_norm, float* norm,
                                      float* coef) {
  const float n = sqrtf(sum_sq[0]);
  const float c = max_norm / (n + 1e-6f);
  norm[0] = n;
  coef[0] = (max_norm > 0.0f && c < 1.0f) ? c : 1.0f;
}

cudaStream_t S(const Stream& s) { return s.cuda_stream; }

}  // namespace

absl::Status GradSquaredNormCuda(const Stream& stream, const Tensor& grads, const Tensor& workspace,
                                 const Tensor& sum_sq, bool accumulate) {
  const int64_t n = grads.numel();
  // Four elements per thread before a block is added: the grid, hence the order, depends on n.
  const int64_t want = (n + 4 * kThreads - 1) / (4 * kThreads);
  const int blocks =
      static_cast<int>(want < 1 ? 1 : (want > kGradNormWorkspace ? kGradNormWorkspace : want));
  double* partials = workspace.as<double>();
  if (grads.dtype == DType::kBF16) {
    PartialSumSquaresKernel<__nv_bfloat16>
        <<<blocks, kThreads, 0, S(stream)>>>(grads.as<__nv_bfloat16>(), n, partials);
  } else {
    PartialSumSquaresKernel<float>
        <<<blocks, kThreads, 0, S(stream)>>>(grads.as<float>(), n, partials);
  }
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  FinalSumKernel<<<1, kThreads, 0, S(stream)>>>(partials, blocks, sum_sq.as<float>(), accumulate);
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status ClipCoefficientCuda(const Stream& stream, const Tensor& sum_sq, float max_norm,
                                 const Tensor& norm, const Tensor& coef) {
  ClipCoefficientKernel<<<1, 1, 0, S(stream)>>>(sum_sq.as<float>(), max_norm, norm.as<float>(),
                                                coef.as<float>());
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace switchyard::kernels::internal
