// File: kernels/elementwise/elementwise.h
//
// Small elementwise ops the layers compose: dtype casts, sums, and the shared expert's sigmoid
// gate. All math is fp32 on CUDA (fp64 on the CPU) and rounded once to the output dtype.
// Dtypes: f32, f64 (CPU only) and bf16. All tensors of one call live on the stream's device.
// No allocation, no host synchronisation; outputs may alias inputs of the same shape and dtype.
#ifndef SWITCHYARD_KERNELS_ELEMENTWISE_ELEMENTWISE_H_
#define SWITCHYARD_KERNELS_ELEMENTWISE_ELEMENTWISE_H_

#include "absl/status/status.h"
#include "common/tensor.h"

namespace switchyard::kernels {

// dst = src converted to dst.dtype (same element count).
absl::Status Cast(const Stream& stream, const Tensor& src, const Tensor& dst);

// out = alpha * a + beta * b (same shapes; a, b, out may differ in dtype).
absl::Status Axpby(const Stream& stream, float alpha, const Tensor& a, float beta, const Tensor& b,
                   const Tensor& out);

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
absl::Status CastCuda(const Stream& stream, const Tensor& src, const Tensor& dst);
absl::Status AxpbyCuda(const Stream& stream, float alpha, const Tensor& a, float beta,
                       const Tensor& b, const Tensor& out);
absl::Status AddColumnSumsCuda(const Stream& stream, const Tensor& x, const Tensor& out);
absl::Status SigmoidGateForwardCuda(const Stream& stream, const Tensor& y, const Tensor& g,
                                    const Tensor& out);
absl::Status SigmoidGateBackwardCuda(const Stream& stream, const Tensor& dout, const Tensor& y,
                                     const Tensor& g, const Tensor& dy, const Tensor& dg);
}  // namespace internal

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_ELEMENTWISE_ELEMENTWISE_H_
