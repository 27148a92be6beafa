// File: kernels/optim/adamw.h
//
// AdamW with fp32 master weights over contiguous buffers: one launch updates every tensor whose
// parameters, gradients and optimizer states live in one flat buffer each (DESIGN.md: "params and
// grads each live in one contiguous buffer per dtype ... one launch for the optimizer").
//
// Math (PyTorch torch.optim.AdamW / Megatron's fused Adam in adam_w_mode), per element, with
// g = grad * grad_scale (the clip coefficient, applied on the fly; the grad buffer is not written):
//   m      = beta1 * m + (1 - beta1) * g
//   v      = beta2 * v + (1 - beta2) * g * g
//   master = master * (1 - lr * weight_decay)                       (decoupled weight decay)
//            - (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
//   param  = master rounded to the param dtype (bf16: round to nearest even)
// The decay uses the master value before this step's Adam update, as PyTorch and Megatron do.
//
// Weight-decay groups: one call applies one weight_decay to the whole range. Lay the flat buffers
// out decay-group first (Megatron's param groups: weights with decay, then biases and norm
// weights without) and make one call per group on sub-views: two launches per step in total.
// This keeps the kernel free of per-element masks and segment tables.
#ifndef SWITCHYARD_KERNELS_OPTIM_ADAMW_H_
#define SWITCHYARD_KERNELS_OPTIM_ADAMW_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/tensor.h"

namespace switchyard::kernels {

struct AdamWHyperParams {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  int64_t step = 1;  // 1-based count of this update, for bias correction (PyTorch's state.step)
};

// One AdamW step over N elements. Tensors (each any rank, N elements, all on the stream's device):
//   grads       f32 or bf16 (CPU: also f64)               read only
//   master      f32 (CPU: f32 or f64)                      updated in place
//   exp_avg     same dtype as master                       updated in place
//   exp_avg_sq  same dtype as master                       updated in place
//   params      bf16 or f32 (CPU: also f64)                written: master rounded once
// grad_scale: host factor on the gradients (1 = none). scale_device: optional (nullptr = none)
// f32 [1] tensor on the stream's device, e.g. ClipCoefficient's output; it is read by the
// kernel, so no host synchronisation is needed; the effective scale is grad_scale *
// scale_device[0]. Preconditions: hp.step >= 1, 0 <= beta1, beta2 < 1, eps > 0, lr >= 0;
// params must not alias master. No allocation; graph-capturable on CUDA (hp changes each step
// enter as kernel arguments). The CPU path computes in fp64 and rounds once per stored value.
absl::Status AdamW(const Stream& stream, const AdamWHyperParams& hp, const Tensor& grads,
                   float grad_scale, const Tensor* scale_device, const Tensor& master,
                   const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& params);

namespace internal {
// Per-step constants derived on the host in fp64 (shared by both paths).
struct AdamWCoefficients {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float decay;         // 1 - lr * weight_decay
  float step_size;     // lr / (1 - beta1^step)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^step)
  float grad_scale;    // host factor
};
AdamWCoefficients MakeAdamWCoefficients(const AdamWHyperParams& hp, float grad_scale);

absl::Status AdamWCuda(const Stream& stream, const AdamWCoefficients& c, const Tensor& grads,
                       const float* scale_device, const Tensor& master, const Tensor& exp_avg,
                       const Tensor& exp_avg_sq, const Tensor& params);
}  // namespace internal

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_OPTIM_ADAMW_H_
