// Validation, device dispatch and the fp64 CPU reference of AdamW.
#include "kernels/optim/adamw.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace switchyard::kernels {
namespace {

bool IsFloat(DType d) { return d == DType::kF32 || d == DType::kF64 || d == DType::kBF16; }

absl::Status CheckAdamW(const Stream& stream, const AdamWHyperParams& hp, const Tensor& grads,
                        const Tensor* scale_device, const Tensor& master, const Tensor& exp_avg,
                        const Tensor& exp_avg_sq, const Tensor& params) {
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&grads, &master, &exp_avg, &exp_avg_sq, &params}));
  const bool cuda = stream.is_cuda();
  const int64_t n = master.numel();
  for (const Tensor* t : {&grads, &exp_avg, &exp_avg_sq, &params}) {
    if (t->numel() != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AdamW: element counts differ: master ", master.DebugString(), " vs ", t->DebugString()));
    }
  }
  const bool master_ok = cuda ? master.dtype == DType::kF32
                              : (master.dtype == DType::kF32 || master.dtype == DType::kF64);
  if (!master_ok || exp_avg.dtype != master.dtype || exp_avg_sq.dtype != master.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AdamW: master, exp_avg, exp_avg_sq must share one dtype, f32 (f64 also on the CPU), got ",
        master.DebugString(), ", ", exp_avg.DebugString(), ", ", exp_avg_sq.DebugString()));
  }
  for (const Tensor* t : {&grads, &params}) {
    if (!IsFloat(t->dtype) || (cuda && t->dtype == DType::kF64)) {
      return absl::InvalidArgumentError(absl::StrCat("AdamW: grads/params must be f32 or bf16",
                                                     cuda ? "" : " or f64", ", got ",
                                                     t->DebugString()));
    }
  }
  if (n > 0 && params.data == master.data) {
    return absl::InvalidArgumentError("AdamW: params must not alias master");
  }
  if (scale_device != nullptr) {
    SY_RETURN_IF_ERROR(CheckTensor(*scale_device, "AdamW.scale_device", DType::kF32, {1}));
    SY_RETURN_IF_ERROR(CheckDevice(stream, {scale_device}));
  }
  if (hp.step < 1) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW: step (", hp.step, ") must be >= 1"));
  }
  if (!(hp.beta1 >= 0.0 && hp.beta1 < 1.0) || !(hp.beta2 >= 0.0 && hp.beta2 < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW: beta1 (", hp.beta1, ") and beta2 (", hp.beta2, ") must be in [0, 1)"));
  }
  if (!(hp.eps > 0.0) || !(hp.lr >= 0.0) || !(hp.weight_decay >= 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW: need eps > 0, lr >= 0, weight_decay >= 0, got eps ", hp.eps, ", lr ",
                     hp.lr, ", weight_decay ", hp.weight_decay));
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {
AdamWCoefficients MakeAdamWCoefficients(const AdamWHyperParams& hp, float grad_scale) {
  const double step = static_cast<double>(hp.step);
  AdamWCoefficients c;
  c.beta1 = static_cast<float>(hp.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - hp.beta1);
  c.beta2 = static_cast<float>(hp.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - hp.beta2);
  c.eps = static_cast<float>(hp.eps);
  c.decay = static_cast<float>(1.0 - hp.lr * hp.weight_decay);
  c.step_size = static_cast<float>(hp.lr / (1.0 - std::pow(hp.beta1, step)));
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(hp.beta2, step)));
  c.grad_scale = grad_scale;
  return c;
}
}  // namespace internal

absl::Status AdamW(const Stream& stream, const AdamWHyperParams& hp, const Tensor& grads,
                   float grad_scale, const Tensor* scale_device, const Tensor& master,
                   const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& params) {
  SY_RETURN_IF_ERROR(
      CheckAdamW(stream, hp, grads, scale_device, master, exp_avg, exp_avg_sq, params));
  if (stream.is_cuda()) {
    return internal::AdamWCuda(stream, internal::MakeAdamWCoefficients(hp, grad_scale), grads,
                               scale_device ? scale_device->as<float>() : nullptr, master, exp_avg,
                               exp_avg_sq, params);
  }
  const double step = static_cast<double>(hp.step);
  const double scale =
      static_cast<double>(grad_scale) * (scale_device ? scale_device->as<float>()[0] : 1.0);
  const double bc1 = 1.0 - std::pow(hp.beta1, step);
  const double sqrt_bc2 = std::sqrt(1.0 - std::pow(hp.beta2, step));
  const double decay = 1.0 - hp.lr * hp.weight_decay;
  for (int64_t i = 0; i < master.numel(); ++i) {
    const double g = LoadAsDouble(grads, i) * scale;
    const double m = hp.beta1 * LoadAsDouble(exp_avg, i) + (1.0 - hp.beta1) * g;
    const double v = hp.beta2 * LoadAsDouble(exp_avg_sq, i) + (1.0 - hp.beta2) * g * g;
    const double p =
        LoadAsDouble(master, i) * decay - (hp.lr / bc1) * m / (std::sqrt(v) / sqrt_bc2 + hp.eps);
    StoreFromDouble(exp_avg, i, m);
    StoreFromDouble(exp_avg_sq, i, v);
    StoreFromDouble(master, i, p);
    // Round from the stored master, so params are exactly the master's rounding (as on CUDA).
    StoreFromDouble(params, i, LoadAsDouble(master, i));
  }
  return absl::OkStatus();
}

}  // namespace switchyard::kernels
