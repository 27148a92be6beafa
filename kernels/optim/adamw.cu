// CUDA AdamW: one grid-stride launch over the flat buffers, fp32 math, templated on the grad and
// param dtypes so the inner loop has no dtype branches.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/optim/adamw.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

__device__ __forceinline__ float ToF(float x) { return x; }
__device__ __forceinline__ float ToF(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void Put(float* p, float v) { *p = v; }
__device__ __forceinline__ void Put(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <typename G, typename P>
__global__ void AdamWKernel(AdamWCoefficients c, const G* __restrict__ grads,
                            const float* __restrict__ scale_device, float* __restrict__ master,
                            float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                            P* __restrict__ params, int64_t n) {
  const float scale = scale_device ? c.grad_scale * *scale_device : c.grad_scale;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = ToF(grads[i]) * scale;
    const float m = c.beta1 * exp_avg[i] + c.one_minus_beta1 * g;
    const float v = c.beta2 * exp_avg_sq[i] + c.one_minus_beta2 * g * g;
    const float p = master[i] * c.decay - c.step_size * m / (sqrtf(v) * c.inv_sqrt_bc2 + c.eps);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    master[i] = p;
    Put(&params[i], p);
  }
}

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 8192 ? (b > 0 ? b : 1) : 8192);
}

template <typename G, typename P>
absl::Status Launch(const Stream& stream, const AdamWCoefficients& c, const Tensor& grads,
                    const float* scale_device, const Tensor& master, const Tensor& exp_avg,
                    const Tensor& exp_avg_sq, const Tensor& params) {
  const int64_t n = master.numel();
  AdamWKernel<G, P><<<Blocks(n), kThreads, 0, stream.cuda_stream>>>(
      c, grads.as<G>(), scale_device, master.as<float>(), exp_avg.as<float>(),
      exp_avg_sq.as<float>(), params.as<P>(), n);
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

absl::Status AdamWCuda(const Stream& stream, const AdamWCoefficients& c, const Tensor& grads,
                       const float* scale_device, const Tensor& master, const Tensor& exp_avg,
                       const Tensor& exp_avg_sq, const Tensor& params) {
  if (master.numel() == 0) return absl::OkStatus();
  const bool g_bf16 = grads.dtype == DType::kBF16, p_bf16 = params.dtype == DType::kBF16;
  if (g_bf16 && p_bf16) {
    return Launch<__nv_bfloat16, __nv_bfloat16>(stream, c, grads, scale_device, master, exp_avg,
                                                exp_avg_sq, params);
  }
  if (g_bf16) {
    return Launch<__nv_bfloat16, float>(stream, c, grads, scale_device, master, exp_avg, exp_avg_sq,
                                        params);
  }
  if (p_bf16) {
    return Launch<float, __nv_bfloat16>(stream, c, grads, scale_device, master, exp_avg, exp_avg_sq,
                                        params);
  }
  return Launch<float, float>(stream, c, grads, scale_device, master, exp_avg, exp_avg_sq, params);
}

}  // namespace switchyard::kernels::internal
