// File: kernels/attention/rope_device.cuh
//
// Device-side pieces of RoPE (rope.h) shared by the .cu files that rotate q/k rows (rope.cu, and
// the fused QK-norm + RoPE of qk_norm_rope.cu): the inverse-frequency table passed by value, the
// per-token cos/sin, and the rotation of one pair with explicit roundings, so that both kernels
// give the same bits for the same row.
#ifndef SWITCHYARD_KERNELS_ATTENTION_ROPE_DEVICE_CUH_
#define SWITCHYARD_KERNELS_ATTENTION_ROPE_DEVICE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention/rope.h"

namespace switchyard::kernels::internal {

// Passed by value as a kernel parameter (1 KB), so the device sees the host's exact table.
struct InvFreqTable {
  float v[kMaxRopeHeadDim / 2];
};

// cos and sign·sin of theta(t, i): fp64 sincos of the fp32 angle, rounded to fp32 (the CPU
// reference's values).
__device__ __forceinline__ void RopeCosSin(int64_t t, int64_t seq_len, RopeCp cp, float inv_freq,
                                           float sign, float* c, float* s) {
  const float a = RopeAngle(t, seq_len, cp, inv_freq);
  double sd, cd;
  sincos(static_cast<double>(a), &sd, &cd);
  *c = static_cast<float>(cd);
  *s = sign * static_cast<float>(sd);
}

// The rotation of the pair (xa, xb) = (x[i], x[i + D/2]) in fp32, without contraction:
//   oa = xa·c − xb·s,  ob = xb·c + xa·s.
__device__ __forceinline__ void RotatePair(float xa, float xb, float c, float s, float* oa,
                                           float* ob) {
  *oa = __fsub_rn(__fmul_rn(xa, c), __fmul_rn(xb, s));
  *ob = __fadd_rn(__fmul_rn(xb, c), __fmul_rn(xa, s));
}

}  // namespace switchyard::kernels::internal

#endif  // SWITCHYARD_KERNELS_ATTENTION_ROPE_DEVICE_CUH_
