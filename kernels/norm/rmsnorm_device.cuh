// File: kernels/norm/rmsnorm_device.cuh
//
// The per-element arithmetic of RMSNorm on the device, written once with explicit roundings (no
// contraction left to the compiler), so that every kernel that normalises a row (rmsnorm.cu's
// kernels and the fused QK-norm + RoPE of kernels/attention/qk_norm_rope.cu) gives the same bits
// for the same row and the same reduction order:
//   forward   ss += x²;  r = 1 / sqrt(ss / H + eps);  y = (x · r) · w
//   backward  dot += (dy · w) · x;  c = (r · r) · dot / H;  dx = r · (dy · w − x · c);
//             dw partial += (dy · x) · r
#ifndef SWITCHYARD_KERNELS_NORM_RMSNORM_DEVICE_CUH_
#define SWITCHYARD_KERNELS_NORM_RMSNORM_DEVICE_CUH_

#include <cuda_runtime.h>

namespace switchyard::kernels::internal {

__device__ __forceinline__ float NormSumSquares(float ss, float x) { return __fmaf_rn(x, x, ss); }

__device__ __forceinline__ float NormRstd(float ss, float h, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, h), eps)));
}

__device__ __forceinline__ float NormOut(float x, float r, float w) {
  return __fmul_rn(__fmul_rn(x, r), w);
}

__device__ __forceinline__ float NormDot(float dot, float dy, float w, float x) {
  return __fmaf_rn(__fmul_rn(dy, w), x, dot);
}

__device__ __forceinline__ float NormGradCoef(float r, float dot, float h) {
  return __fdiv_rn(__fmul_rn(__fmul_rn(r, r), dot), h);
}

__device__ __forceinline__ float NormGradIn(float r, float dy, float w, float x, float c) {
  return __fmul_rn(r, __fsub_rn(__fmul_rn(dy, w), __fmul_rn(x, c)));
}

__device__ __forceinline__ float NormGradWeight(float acc, float dy, float x, float r) {
  return __fmaf_rn(__fmul_rn(dy, x), r, acc);
}

// Sum over the first `lanes` lanes of each group of `lanes` (a power of two, at most 32) by an
// xor butterfly from lanes / 2 down to 1. For a row held by `lanes` lanes it gives the bits of the
// full-warp butterfly in which the other lanes hold 0 (adding 0 is exact).
template <int kLanes>
__device__ __forceinline__ float GroupSum(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace switchyard::kernels::internal

#endif  // SWITCHYARD_KERNELS_NORM_RMSNORM_DEVICE_CUH_
