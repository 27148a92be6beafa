// Validation, the fused-or-composed dispatch and the composed path (the CPU reference) of the
// QK-norm + RoPE op.
#include "kernels/attention/qk_norm_rope.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/norm/rmsnorm.h"

namespace switchyard::kernels {
namespace {

// pre [T, heads, D] of bf16/f32 (f64 on the CPU), q and k with one T, D and dtype; w [D] of that
// dtype; rstd [T · heads] f32 (f64 on the CPU); `same` tensors shaped like pre.
absl::Status CheckSide(const Stream& stream, absl::string_view op, absl::string_view side,
                       const Tensor& pre, const Tensor& ref, const Tensor& w, const Tensor& rstd,
                       std::initializer_list<std::pair<const char*, const Tensor*>> same) {
  const bool dtype_ok = pre.dtype == DType::kBF16 || pre.dtype == DType::kF32 ||
                        (!stream.is_cuda() && pre.dtype == DType::kF64);
  if (pre.rank() != 3 || !dtype_ok) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", side,
                                                   ".pre must be [T, heads, D] of bf16/f32 (f64 "
                                                   "on the CPU), got ",
                                                   pre.DebugString()));
  }
  if (pre.dim(0) != ref.dim(0) || pre.dim(2) != ref.dim(2) || pre.dtype != ref.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", side, ".pre must have q.pre's T, D and dtype (", ref.DebugString(),
                     "), got ", pre.DebugString()));
  }
  if (w.rank() != 1 || w.dim(0) != pre.dim(2) || w.dtype != pre.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", side, ".w must be [", pre.dim(2),
                                                   "] of the dtype of pre, got ", w.DebugString()));
  }
  const bool rstd_dtype =
      rstd.dtype == DType::kF32 || (!stream.is_cuda() && rstd.dtype == DType::kF64);
  if (rstd.rank() != 1 || rstd.dim(0) != pre.dim(0) * pre.dim(1) || !rstd_dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", side, ".rstd must be [T * heads = ", pre.dim(0) * pre.dim(1),
                     "] f32 (f64 also on the CPU), got ", rstd.DebugString()));
  }
  for (const auto& [name, t] : same) {
    if (t->shape != pre.shape || t->dtype != pre.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", side, ".", name, " must match pre ",
                                                     pre.DebugString(), ", got ",
                                                     t->DebugString()));
    }
  }
  if (stream.is_cuda() && pre.dim(0) * pre.dim(1) > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", side, ": T * heads must be < 2^31 on CUDA, got ", pre.dim(0) * pre.dim(1)));
  }
  return absl::OkStatus();
}

// The per-head rows of one side as the 2-D tensors the norm takes.
Tensor HeadRows(const Tensor& x) {
  return Tensor(x.dtype, {x.dim(0) * x.dim(1), x.dim(2)}, x.device, x.data);
}

}  // namespace

namespace internal {

int64_t QkNormRopeBackwardBlocks(int64_t num_tokens) {
  return num_tokens < 1 ? 1 : std::min<int64_t>(num_tokens, 1024);
}

}  // namespace internal

int64_t QkNormRopeBackwardWorkspaceBytes(int64_t num_tokens, int64_t q_heads, int64_t kv_heads,
                                         int64_t head_dim) {
  const int64_t fused = 2 * internal::QkNormRopeBackwardBlocks(num_tokens) * head_dim *
                        static_cast<int64_t>(sizeof(float));
  const int64_t composed =
      RmsNormBackwardWorkspaceBytes(num_tokens * std::max(q_heads, kv_heads), head_dim);
  return std::max(fused, composed);
}

absl::Status QkNormRopeForward(const Stream& stream, const QkNormRopeSide& q,
                               const QkNormRopeSide& k, float eps, int64_t seq_len,
                               float rotary_base, RopeCp cp) {
  constexpr absl::string_view kOp = "QkNormRopeForward";
  SY_RETURN_IF_ERROR(
      CheckDevice(stream, {&q.pre, &q.w, &q.out, &q.rstd, &k.pre, &k.w, &k.out, &k.rstd}));
  SY_RETURN_IF_ERROR(CheckSide(stream, kOp, "q", q.pre, q.pre, q.w, q.rstd, {{"out", &q.out}}));
  SY_RETURN_IF_ERROR(CheckSide(stream, kOp, "k", k.pre, q.pre, k.w, k.rstd, {{"out", &k.out}}));
  SY_RETURN_IF_ERROR(internal::CheckRopeParams(kOp, q.pre.dim(2), seq_len, rotary_base, cp));
  if (!(eps > 0.0f) || !std::isfinite(eps)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": eps must be finite and > 0, got ", eps));
  }
  if (stream.is_cuda() &&
      internal::QkNormRopeFusable(
          q.pre, k.pre, {q.pre.data, q.w.data, q.out.data, k.pre.data, k.w.data, k.out.data})) {
    return internal::QkNormRopeForwardCuda(stream, q, k, eps, seq_len, rotary_base, cp);
  }
  for (const QkNormRopeSide* s : {&q, &k}) {
    SY_RETURN_IF_ERROR(
        RmsNormForward(stream, HeadRows(s->pre), s->w, eps, HeadRows(s->out), s->rstd));
    SY_RETURN_IF_ERROR(RopeForward(stream, s->out, seq_len, rotary_base, s->out, cp));
  }
  return absl::OkStatus();
}

absl::Status QkNormRopeBackward(const Stream& stream, const QkNormRopeGradSide& q,
                                const QkNormRopeGradSide& k, int64_t seq_len, float rotary_base,
                                const Tensor& workspace, RopeCp cp) {
  constexpr absl::string_view kOp = "QkNormRopeBackward";
  SY_RETURN_IF_ERROR(CheckDevice(
      stream, {&q.pre, &q.w, &q.rstd, &q.grad, &q.dw, &k.pre, &k.w, &k.rstd, &k.grad, &k.dw}));
  SY_RETURN_IF_ERROR(CheckSide(stream, kOp, "q", q.pre, q.pre, q.w, q.rstd, {{"grad", &q.grad}}));
  SY_RETURN_IF_ERROR(CheckSide(stream, kOp, "k", k.pre, q.pre, k.w, k.rstd, {{"grad", &k.grad}}));
  SY_RETURN_IF_ERROR(internal::CheckRopeParams(kOp, q.pre.dim(2), seq_len, rotary_base, cp));
  for (const QkNormRopeGradSide* s : {&q, &k}) {
    if (s->dw.shape != s->w.shape || (s->dw.dtype != DType::kF32 && s->dw.dtype != s->w.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kOp, ": ", s == &q ? "q" : "k", ".dw must be [", s->w.dim(0),
                       "] f32 or the dtype of w, got ", s->dw.DebugString()));
    }
  }
  if (q.dw.numel() > 0 && q.dw.data == k.dw.data) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": q.dw and k.dw must be different buffers (each side accumulates its own), got ",
        q.dw.DebugString(), " twice"));
  }
  if (q.dw.dtype != k.dw.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": q.dw (", q.dw.DebugString(),
                                                   ") and k.dw (", k.dw.DebugString(),
                                                   ") must share a dtype"));
  }
  if (stream.is_cuda()) {
    SY_RETURN_IF_ERROR(CheckDevice(stream, {&workspace}));
    const int64_t need =
        QkNormRopeBackwardWorkspaceBytes(q.pre.dim(0), q.pre.dim(1), k.pre.dim(1), q.pre.dim(2));
    if (static_cast<int64_t>(workspace.bytes()) < need) {
      return absl::InvalidArgumentError(
          absl::StrCat(kOp, ": workspace must hold QkNormRopeBackwardWorkspaceBytes = ", need,
                       " bytes, got ", workspace.DebugString()));
    }
    if (internal::QkNormRopeFusable(
            q.pre, k.pre, {q.pre.data, q.w.data, q.grad.data, k.pre.data, k.w.data, k.grad.data})) {
      return internal::QkNormRopeBackwardCuda(stream, q, k, seq_len, rotary_base, workspace, cp);
    }
  }
  for (const QkNormRopeGradSide* s : {&q, &k}) {
    SY_RETURN_IF_ERROR(RopeBackward(stream, s->grad, seq_len, rotary_base, s->grad, cp));
    SY_RETURN_IF_ERROR(RmsNormBackward(stream, HeadRows(s->grad), HeadRows(s->pre), s->w, s->rstd,
                                       HeadRows(s->grad), s->dw, /*accumulate_dw=*/true,
                                       workspace));
  }
  return absl::OkStatus();
}

}  // namespace switchyard::kernels
