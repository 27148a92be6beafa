// File: kernels/device_convert.cuh
//
// Device-side helpers shared by the CUDA kernels: fp32 <-> storage-type conversion (fp32 math,
// one rounding on store, round-to-nearest-even for bf16) and an aligned vector of V elements for
// 16-byte loads and stores.
#ifndef SWITCHYARD_KERNELS_DEVICE_CONVERT_CUH_
#define SWITCHYARD_KERNELS_DEVICE_CONVERT_CUH_

#include <cuda_bf16.h>

namespace switchyard::kernels {

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_DEVICE_CONVERT_CUH_
