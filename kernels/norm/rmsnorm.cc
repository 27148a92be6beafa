// Validation, device dispatch and the CPU reference (fp64 math) of RMSNorm.
#include "kernels/norm/rmsnorm.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace switchyard::kernels {
namespace {

bool IsActivationDType(const Stream& stream, DType d) {
  if (stream.is_cuda()) return d == DType::kBF16 || d == DType::kF32;
  return d == DType::kBF16 || d == DType::kF32 || d == DType::kF64;
}

bool IsRstdDType(const Stream& stream, DType d) {
  return d == DType::kF32 || (!stream.is_cuda() && d == DType::kF64);
}

// x [T, H] and w [H] of one activation dtype, `others` [T, H] of that dtype, rstd [T].
absl::Status CheckRows(const Stream& stream, absl::string_view op, const Tensor& x, const Tensor& w,
                       const Tensor& rstd,
                       std::initializer_list<std::pair<const char*, const Tensor*>> others) {
  if (x.rank() != 2 || x.dim(1) < 1 || !IsActivationDType(stream, x.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": x must be [T, H >= 1] of bf16/f32 (f64 on the CPU), got ", x.DebugString()));
  }
  if (w.rank() != 1 || w.dim(0) != x.dim(1) || w.dtype != x.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": w must be [", x.dim(1),
                                                   "] of the dtype of x (", DTypeName(x.dtype),
                                                   "), got ", w.DebugString()));
  }
  if (rstd.rank() != 1 || rstd.dim(0) != x.dim(0) || !IsRstdDType(stream, rstd.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": rstd must be [", x.dim(0), "] f32 (f64 also on the CPU), got ", rstd.DebugString()));
  }
  for (const auto& [name, t] : others) {
    if (t->shape != x.shape || t->dtype != x.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " must match x ",
                                                     x.DebugString(), ", got ", t->DebugString()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t RmsNormBackwardBlocks(int64_t num_tokens) {
  return num_tokens < 1 ? 1 : (num_tokens < 256 ? num_tokens : 256);
}

int64_t RmsNormBackwardWorkspaceBytes(int64_t num_tokens, int64_t hidden) {
  return RmsNormBackwardBlocks(num_tokens) * hidden * static_cast<int64_t>(sizeof(float));
}

absl::Status RmsNormForward(const Stream& stream, const Tensor& x, const Tensor& w, float eps,
                            const Tensor& y, const Tensor& rstd) {
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&x, &w, &y, &rstd}));
  SY_RETURN_IF_ERROR(CheckRows(stream, "RmsNormForward", x, w, rstd, {{"y", &y}}));
  if (!(eps > 0.0f) || !std::isfinite(eps)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RmsNormForward: eps must be finite and > 0, got ", eps));
  }
  if (stream.is_cuda()) return internal::RmsNormForwardCuda(stream, x, w, eps, y, rstd);
  const int64_t t_n = x.dim(0), h_n = x.dim(1);
  for (int64_t t = 0; t < t_n; ++t) {
    double ss = 0;
    for (int64_t h = 0; h < h_n; ++h) {
      const double v = LoadAsDouble(x, t * h_n + h);
      ss += v * v;
    }
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(h_n) + static_cast<double>(eps));
    for (int64_t h = 0; h < h_n; ++h) {
      StoreFromDouble(y, t * h_n + h, LoadAsDouble(x, t * h_n + h) * r * LoadAsDouble(w, h));
    }
    StoreFromDouble(rstd, t, r);
  }
  return absl::OkStatus();
}

absl::Status RmsNormBackward(const Stream& stream, const Tensor& dy, const Tensor& x,
                             const Tensor& w, const Tensor& rstd, const Tensor& dx,
                             const Tensor& dw, bool accumulate_dw, const Tensor& workspace,
                             bool accumulate_dx) {
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&dy, &x, &w, &rstd, &dx, &dw}));
  SY_RETURN_IF_ERROR(CheckRows(stream, "RmsNormBackward", x, w, rstd, {{"dy", &dy}, {"dx", &dx}}));
  if (dw.shape != w.shape || (dw.dtype != DType::kF32 && dw.dtype != w.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("RmsNormBackward: dw must be [", w.dim(0),
                                                   "] f32 or the dtype of w, got ",
                                                   dw.DebugString()));
  }
  if (accumulate_dx && dx.numel() > 0 && dx.data == dy.data) {
    return absl::InvalidArgumentError(
        "RmsNormBackward: with accumulate_dx, dx must not alias dy (dx += the gradient of dy)");
  }
  const int64_t t_n = x.dim(0), h_n = x.dim(1);
  if (stream.is_cuda()) {
    SY_RETURN_IF_ERROR(CheckDevice(stream, {&workspace}));
    const int64_t need = RmsNormBackwardWorkspaceBytes(t_n, h_n);
    if (static_cast<int64_t>(workspace.bytes()) < need) {
      return absl::InvalidArgumentError(
          absl::StrCat("RmsNormBackward: workspace must hold RmsNormBackwardWorkspaceBytes(", t_n,
                       ", ", h_n, ") = ", need, " bytes, got ", workspace.DebugString()));
    }
    return internal::RmsNormBackwardCuda(stream, dy, x, w, rstd, dx, dw, accumulate_dw, workspace,
                                         accumulate_dx);
  }
  std::vector<double> dw_acc(h_n, 0.0);
  for (int64_t t = 0; t < t_n; ++t) {
    const double r = LoadAsDouble(rstd, t);
    double dot = 0;
    for (int64_t h = 0; h < h_n; ++h) {
      dot += LoadAsDouble(dy, t * h_n + h) * LoadAsDouble(w, h) * LoadAsDouble(x, t * h_n + h);
    }
    const double c = r * r * dot / static_cast<double>(h_n);
    for (int64_t h = 0; h < h_n; ++h) {
      const double d = LoadAsDouble(dy, t * h_n + h);
      const double xv = LoadAsDouble(x, t * h_n + h);
      dw_acc[h] += d * xv * r;
      const double g = r * (d * LoadAsDouble(w, h) - xv * c);
      StoreFromDouble(dx, t * h_n + h, accumulate_dx ? LoadAsDouble(dx, t * h_n + h) + g : g);
    }
  }
  for (int64_t h = 0; h < h_n; ++h) {
    StoreFromDouble(dw, h, (accumulate_dw ? LoadAsDouble(dw, h) : 0.0) + dw_acc[h]);
  }
  return absl::OkStatus();
}

}  // namespace switchyard::kernels
