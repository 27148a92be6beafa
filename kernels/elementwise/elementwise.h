// File: kernels/elementwise/elementwise.h
//
// Small elementwise ops the layers compose: dtype casts, sums, and the shared expert's sigmoid
// gate. All math is fp32 on CUDA (fp64 on the CPU) and rounded once to the output dtype.
// Dtypes: f32, f64 (CPU only) and bf16. All tensors of one call live on the stream's device.
// No allocation, no host synchronisation; outputs may alias inputs of the same shape and dtype.
#ifndef SWITCHYARD_KERNELS_ELEMENTWISE_ELEMENTWISE_H_
#define SWITCHYARD_KERNELS_ELEMENTWISE_ELEMENTWISE_H_

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "common/tensor.h"

namespace switchyard::kernels {

// dst = src converted to dst.dtype (same element count).
absl::Status Cast(const Stream& stream, const Tensor& src, const Tensor& dst);

// out = alpha * a + beta * b (same shapes; a, b, out may differ in dtype).
absl::Status Axpby(const Stream& stream, float alpha, const Tensor& a, float beta, const Tensor& b,
                   const Tensor& out);

// t[i] = std * N(0, 1) from a counter-based hash of (seed, offset + i): the same values on the
// CPU and the GPU for a given seed (Box-Muller on two 32-bit hashes). f32, bf16 (f64 on the CPU).
// `offset` fills a slice exactly as the same elements of a larger tensor filled from 0 (a shard of
// an expert-parallel weight initialises as its part of the global weight).
absl::Status FillNormal(const Stream& stream, const Tensor& t, uint64_t seed, float std,
                        uint64_t offset = 0);

// out[j] += sum_i x[i, j] in a fixed order (i ascending). x [B, E], out [E]; f32 (f64 on the CPU).
// Used to accumulate per-sequence expert counts into a global-batch count.
absl::Status AddColumnSums(const Stream& stream, const Tensor& x, const Tensor& out);

// Shared-expert gate (megatron_moe.md §4.4): out[t, :] = y[t, :] * sigmoid(g[t]).
//   y, out [T, H] (one dtype); g [T] f32 (f64 on the CPU) — the gate logit x·w_g.
absl::Status SigmoidGateForward(const Stream& stream, const Tensor& y, const Tensor& g,
                                const Tensor& out);

// Backward of SigmoidGateForward: dy = dout * sigmoid(g);
// dg[t] = sigmoid(g[t]) * (1 - sigmoid(g[t])) * sum_h dout[t, h] * y[t, h] (fixed order).
//   dout, y, dy [T, H]; g, dg [T] (f32; f64 on the CPU). dy may alias dout.
absl::Status SigmoidGateBackward(const Stream& stream, const Tensor& dout, const Tensor& y,
                                 const Tensor& g, const Tensor& dy, const Tensor& dg);

namespace internal {
// The hash behind FillNormal (splitmix64 finaliser), shared by host and device code.
#if defined(__CUDACC__)
__host__ __device__
#endif
    inline float
    HashNormal(uint64_t seed, uint64_t i) {
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const uint64_t r = mix(seed ^ mix(i));
  const float u1 = (static_cast<float>(r >> 40) + 1.0f) * (1.0f / 16777217.0f);  // (0, 1]
  const float u2 = static_cast<float>((r >> 16) & 0xffffffu) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

absl::Status CastCuda(const Stream& stream, const Tensor& src, const Tensor& dst);
absl::Status AxpbyCuda(const Stream& stream, float alpha, const Tensor& a, float beta,
                       const Tensor& b, const Tensor& out);
absl::Status FillNormalCuda(const Stream& stream, const Tensor& t, uint64_t seed, float std,
                            uint64_t offset);
absl::Status AddColumnSumsCuda(const Stream& stream, const Tensor& x, const Tensor& out);
absl::Status SigmoidGateForwardCuda(const Stream& stream, const Tensor& y, const Tensor& g,
                                    const Tensor& out);
absl::Status SigmoidGateBackwardCuda(const Stream& stream, const Tensor& dout, const Tensor& y,
                                     const Tensor& g, const Tensor& dy, const Tensor& dg);
}  // namespace internal

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_ELEMENTWISE_ELEMENTWISE_H_
