// File: kernels/norm/rmsnorm.h
//
// RMSNorm (Llama / Mixtral / Qwen3 "RMSNorm", Megatron-Core `RMSNorm`), forward and backward:
//
//   rstd[t] = 1 / sqrt(mean_h(x[t, h]^2) + eps)
//   y[t, h] = x[t, h] * rstd[t] * w[h]
//
// Backward, with g = dy * w and c[t] = rstd[t]^2 * mean_h(g[t, h] * x[t, h]):
//
//   dx[t, h] = rstd[t] * (g[t, h] - x[t, h] * c[t])
//   dw[h]   (+)= sum_t dy[t, h] * x[t, h] * rstd[t]
//
// Numerics: fp32 math on CUDA (fp64 on the CPU), rounded once to the output dtype. Deliberate
// difference from HF Llama: HF rounds x * rstd to the activation dtype before multiplying by w;
// we do not (one rounding instead of two).
//
// Dtypes: x, y, dy, dx and w share one dtype (the param dtype is the activation dtype): bf16 or
// f32 on CUDA; f32, f64 or bf16 on the CPU. rstd is f32 (the CPU also takes f64). dw is f32 or the
// param dtype. All tensors of one call live on the stream's device.
//
// Determinism: bit-identical results run to run. On CUDA the forward uses one block per row; the
// backward gives each of RmsNormBackwardBlocks(T) blocks a fixed strided set of rows, writes the
// block's dw partial sums [blocks, H] f32 into the caller's workspace, and a second kernel sums
// them over blocks in a fixed order (8 runs of ascending blocks, then the runs in order). No
// atomics, no allocation, no host synchronisation; graph-capturable. Rows whose byte size and
// addresses are multiples of 16 use 16-byte vectors.
#ifndef SWITCHYARD_KERNELS_NORM_RMSNORM_H_
#define SWITCHYARD_KERNELS_NORM_RMSNORM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/tensor.h"

namespace switchyard::kernels {

// Number of row blocks of the CUDA backward (a function of T only, so the partial sums and hence
// dw do not depend on the GPU model): min(T, 256), at least 1.
int64_t RmsNormBackwardBlocks(int64_t num_tokens);

// Bytes of CUDA workspace RmsNormBackward needs: RmsNormBackwardBlocks(T) * H * 4. The CPU path
// needs none.
int64_t RmsNormBackwardWorkspaceBytes(int64_t num_tokens, int64_t hidden);

// y = RMSNorm(x) * w; saves rstd for the backward.
//   x, y [T, H]; w [H]; rstd [T] f32 (CPU: f32 or f64). eps > 0 (Megatron's norm_epsilon).
//   y may alias x.
absl::Status RmsNormForward(const Stream& stream, const Tensor& x, const Tensor& w, float eps,
                            const Tensor& y, const Tensor& rstd);

// Backward of RmsNormForward (formulas in the file comment).
//   dy, x, dx [T, H]; w [H]; rstd [T] as saved by the forward.
//   dx is overwritten and may alias dy; with accumulate_dx = true this call's gradient is added
//   to dx instead (dx += ..., one rounding of the sum: the residual stream's gradient without a
//   separate add pass), and dx must not alias dy.
//   dw [H] f32 or the dtype of w: a gradient buffer. accumulate_dw = true adds this call's
//   contribution to it (dw += ...); false overwrites it.
//   workspace: any dtype, >= RmsNormBackwardWorkspaceBytes(T, H) bytes on the stream's CUDA
//   device; ignored on the CPU (may be an empty Tensor).
absl::Status RmsNormBackward(const Stream& stream, const Tensor& dy, const Tensor& x,
                             const Tensor& w, const Tensor& rstd, const Tensor& dx,
                             const Tensor& dw, bool accumulate_dw, const Tensor& workspace,
                             bool accumulate_dx = false);

namespace internal {
absl::Status RmsNormForwardCuda(const Stream& stream, const Tensor& x, const Tensor& w, float eps,
                                const Tensor& y, const Tensor& rstd);
absl::Status RmsNormBackwardCuda(const Stream& stream, const Tensor& dy, const Tensor& x,
                                 const Tensor& w, const Tensor& rstd, const Tensor& dx,
                                 const Tensor& dw, bool accumulate_dw, const Tensor& workspace,
                                 bool accumulate_dx);
}  // namespace internal

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_NORM_RMSNORM_H_
