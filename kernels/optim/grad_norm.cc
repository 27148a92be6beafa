// Validation, device dispatch and the CPU reference of the gradient norm and clip coefficient.
#include "kernels/optim/grad_norm.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace switchyard::kernels {

absl::Status GradSquaredNorm(const Stream& stream, const Tensor& grads, const Tensor& workspace,
                             const Tensor& sum_sq, bool accumulate) {
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&grads, &sum_sq}));
  SY_RETURN_IF_ERROR(CheckTensor(sum_sq, "GradSquaredNorm.sum_sq", DType::kF32, {1}));
  const DType g = grads.dtype;
  if (!(g == DType::kF32 || g == DType::kBF16 || (g == DType::kF64 && !stream.is_cuda()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("GradSquaredNorm: grads must be f32 or bf16 (f64 also on the CPU), got ",
                     grads.DebugString()));
  }
  if (stream.is_cuda()) {
    SY_RETURN_IF_ERROR(CheckDevice(stream, {&workspace}));
    SY_RETURN_IF_ERROR(
        CheckTensor(workspace, "GradSquaredNorm.workspace", DType::kF64, {kGradNormWorkspace}));
    return internal::GradSquaredNormCuda(stream, grads, workspace, sum_sq, accumulate);
  }
  double s = 0.0;
  for (int64_t i = 0; i < grads.numel(); ++i) {
    const double x = LoadAsDouble(grads, i);
    s += x * x;
  }
  float* out = sum_sq.as<float>();
  out[0] = static_cast<float>((accumulate ? static_cast<double>(out[0]) : 0.0) + s);
  return absl::OkStatus();
}

absl::Status ClipCoefficient(const Stream& stream, const Tensor& sum_sq, float max_norm,
                             const Tensor& norm, const Tensor& coef) {
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&sum_sq, &norm, &coef}));
  SY_RETURN_IF_ERROR(CheckTensor(sum_sq, "ClipCoefficient.sum_sq", DType::kF32, {1}));
  SY_RETURN_IF_ERROR(CheckTensor(norm, "ClipCoefficient.norm", DType::kF32, {1}));
  SY_RETURN_IF_ERROR(CheckTensor(coef, "ClipCoefficient.coef", DType::kF32, {1}));
  if (stream.is_cuda()) return internal::ClipCoefficientCuda(stream, sum_sq, max_norm, norm, coef);
  const float n = std::sqrt(sum_sq.as<float>()[0]);
  const float c = max_norm / (n + 1e-6f);
  norm.as<float>()[0] = n;
  coef.as<float>()[0] = (max_norm > 0.0f && c < 1.0f) ? c : 1.0f;
  return absl::OkStatus();
}

}  // namespace switchyard::kernels
