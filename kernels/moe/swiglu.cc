// Validation and CPU/CUDA dispatch of the weighted SwiGLU (swiglu.h).
#include "kernels/moe/swiglu.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace switchyard::kernels {
namespace {

bool Present(const Tensor& t) { return t.data != nullptr; }

absl::Status Invalid(absl::string_view op, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", msg));
}

absl::Status CheckActivation(const Stream& stream, absl::string_view op, absl::string_view what,
                             const Tensor& t, DType dtype, int64_t rows, int64_t cols) {
  const bool ok_dtype = t.dtype == DType::kBF16 || t.dtype == DType::kF32 ||
                        (!stream.is_cuda() && t.dtype == DType::kF64);
  if (!ok_dtype) {
    return Invalid(
        op, absl::StrCat(what, " must be bf16 or f32 (f64 on the CPU), got ", t.DebugString()));
  }
  return Annotate(CheckTensor(t, what, dtype, {rows, cols}), op);
}

// Checks h ([N, 2F]), probs (empty or [N]) and row_counts (empty or 1-D i32).
absl::Status CheckCommon(const Stream& stream, absl::string_view op, const Tensor& h,
                         const Tensor& probs, const Tensor& row_counts) {
  if (h.rank() != 2 || h.dim(1) % 2 != 0) {
    return Invalid(op,
                   absl::StrCat("h must be [N, 2F] (even last dimension), got ", h.DebugString()));
  }
  SY_RETURN_IF_ERROR(CheckActivation(stream, op, "h", h, h.dtype, -1, -1));
  if (Present(probs)) {
    SY_RETURN_IF_ERROR(Annotate(CheckDevice(stream, {&probs}), op));
    if (probs.dtype == DType::kF64 && stream.is_cuda()) {
      return Invalid(op, absl::StrCat("probs must be f32 on CUDA, got ", probs.DebugString()));
    }
    SY_RETURN_IF_ERROR(
        Annotate(CheckTensor(probs, "probs", probs.dtype == DType::kF64 ? DType::kF64 : DType::kF32,
                             {h.dim(0)}),
                 op));
  }
  if (Present(row_counts)) {
    SY_RETURN_IF_ERROR(Annotate(CheckDevice(stream, {&row_counts}), op));
    SY_RETURN_IF_ERROR(Annotate(CheckTensor(row_counts, "row_counts", DType::kI32, {-1}), op));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SwigluForward(const Stream& stream, const Tensor& h, const Tensor& probs,
                           const Tensor& row_counts, const Tensor& a) {
  constexpr absl::string_view kOp = "SwigluForward";
  SY_RETURN_IF_ERROR(Annotate(CheckDevice(stream, {&h, &a}), kOp));
  SY_RETURN_IF_ERROR(CheckCommon(stream, kOp, h, probs, row_counts));
  SY_RETURN_IF_ERROR(CheckActivation(stream, kOp, "a", a, h.dtype, h.dim(0), h.dim(1) / 2));
  if (stream.is_cuda()) return internal::SwigluForwardCuda(stream, h, probs, row_counts, a);
  return internal::SwigluForwardCpu(h, probs, row_counts, a);
}

absl::Status SwigluBackward(const Stream& stream, const Tensor& da, const Tensor& h,
                            const Tensor& probs, const Tensor& row_counts, const Tensor& dh,
                            const Tensor& dprobs) {
  constexpr absl::string_view kOp = "SwigluBackward";
  SY_RETURN_IF_ERROR(Annotate(CheckDevice(stream, {&da, &h, &dh}), kOp));
  SY_RETURN_IF_ERROR(CheckCommon(stream, kOp, h, probs, row_counts));
  SY_RETURN_IF_ERROR(CheckActivation(stream, kOp, "da", da, h.dtype, h.dim(0), h.dim(1) / 2));
  SY_RETURN_IF_ERROR(CheckActivation(stream, kOp, "dh", dh, h.dtype, h.dim(0), h.dim(1)));
  if (Present(dprobs)) {
    if (!Present(probs)) return Invalid(kOp, "dprobs given without probs (unweighted variant)");
    SY_RETURN_IF_ERROR(Annotate(CheckDevice(stream, {&dprobs}), kOp));
    SY_RETURN_IF_ERROR(Annotate(CheckTensor(dprobs, "dprobs", probs.dtype, {h.dim(0)}), kOp));
  }
  if (stream.is_cuda()) {
    return internal::SwigluBackwardCuda(stream, da, h, probs, row_counts, dh, dprobs);
  }
  return internal::SwigluBackwardCpu(da, h, probs, row_counts, dh, dprobs);
}

}  // namespace switchyard::kernels
