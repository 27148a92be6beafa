// File: kernels/optim/grad_norm.h
//
// Global gradient L2 norm and the clip coefficient, computed on the device with no host
// synchronisation (Megatron's clip_grad_norm_: clip_coeff = max_norm / (total_norm + 1e-6),
// applied when < 1). The coefficient stays in device memory; AdamW reads it through its
// `scale_device` argument, so clipping costs no extra pass over the gradients.
//
// Distributed use: GradSquaredNorm over each local gradient buffer (accumulate = true after the
// first), all-reduce the f32 [1] sum of squares over the model-parallel/data-parallel group that
// shares the gradients, then ClipCoefficient.
//
// Determinism: the reduction order is a function of N only (fixed grid, per-thread fp64 sums in
// grid-stride order, fixed-shape tree in shared memory, then one block over the partials in
// index order), so the same gradients give bit-identical results run to run.
#ifndef SWITCHYARD_KERNELS_OPTIM_GRAD_NORM_H_
#define SWITCHYARD_KERNELS_OPTIM_GRAD_NORM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/tensor.h"

namespace switchyard::kernels {

// Elements of the f64 workspace GradSquaredNorm needs on CUDA (the per-block partial sums).
constexpr int64_t kGradNormWorkspace = 1024;

// sum_sq[0] = (accumulate ? sum_sq[0] : 0) + sum_i grads[i]^2, accumulated in fp64, stored f32.
//   grads      [N] (any rank) f32 or bf16 (CPU: also f64)
//   workspace  f64 [kGradNormWorkspace] on CUDA, scratch; ignored on the CPU (may be empty)
//   sum_sq     f32 [1]
// All on the stream's device. No allocation, no host sync; graph-capturable.
absl::Status GradSquaredNorm(const Stream& stream, const Tensor& grads, const Tensor& workspace,
                             const Tensor& sum_sq, bool accumulate = false);

// From a sum of squares: norm[0] = sqrt(sum_sq[0]);
// coef[0] = min(1, max_norm / (norm + 1e-6)) if max_norm > 0, else 1 (clipping disabled,
// Megatron's clip_grad = 0). A NaN/Inf norm gives coef 1 and the norm reports it, so the trainer
// can detect it and skip the step. sum_sq, norm, coef: f32 [1] on the stream's device; norm
// may alias sum_sq.
absl::Status ClipCoefficient(const Stream& stream, const Tensor& sum_sq, float max_norm,
                             const Tensor& norm, const Tensor& coef);

namespace internal {
absl::Status GradSquaredNormCuda(const Stream& stream, const Tensor& grads, const Tensor& workspace,
                                 const Tensor& sum_sq, bool accumulate);
absl::Status ClipCoefficientCuda(const Stream& stream, const Tensor& sum_sq, float max_norm,
                                 const Tensor& norm, const Tensor& coef);
}  // namespace internal

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_OPTIM_GRAD_NORM_H_
