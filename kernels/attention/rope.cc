// Validation, device dispatch and the CPU reference of RoPE.
#include "kernels/attention/rope.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace switchyard::kernels {
namespace {

absl::Status CheckRope(const Stream& stream, absl::string_view op, const Tensor& x, int64_t seq_len,
                       float rotary_base, const Tensor& out, RopeCp cp) {
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&x, &out}));
  const bool dtype_ok = x.dtype == DType::kBF16 || x.dtype == DType::kF32 ||
                        (!stream.is_cuda() && x.dtype == DType::kF64);
  if (x.rank() != 3 || !dtype_ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": x must be [T, heads, D] of bf16/f32 (f64 on the CPU), got ", x.DebugString()));
  }
  if (out.shape != x.shape || out.dtype != x.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": out must match x ", x.DebugString(), ", got ", out.DebugString()));
  }
  return internal::CheckRopeParams(op, x.dim(2), seq_len, rotary_base, cp);
}

// CPU reference; sign = +1 forward, -1 backward. cos/sin are rounded to fp32 (as on CUDA) unless
// the tensors are f64, where the fp64 values are used so that rotations are orthogonal to fp64.
absl::Status RopeCpu(const Tensor& x, int64_t seq_len, float rotary_base, double sign,
                     const Tensor& out, RopeCp cp) {
  const int64_t t_n = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2;
  std::vector<float> inv_freq(half);
  internal::RopeInvFreq(d, rotary_base, inv_freq.data());
  std::vector<double> c(half), s(half);
  for (int64_t t = 0; t < t_n; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = internal::RopeAngle(t, seq_len, cp, inv_freq[i]);
      c[i] = std::cos(a);
      s[i] = std::sin(a);
      if (x.dtype != DType::kF64) {
        c[i] = static_cast<float>(c[i]);
        s[i] = static_cast<float>(s[i]);
      }
      s[i] *= sign;
    }
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = (t * heads + h) * d;
      for (int64_t i = 0; i < half; ++i) {
        const double a = LoadAsDouble(x, base + i), b = LoadAsDouble(x, base + half + i);
        StoreFromDouble(out, base + i, a * c[i] - b * s[i]);
        StoreFromDouble(out, base + half + i, b * c[i] + a * s[i]);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

absl::Status CheckRopeParams(absl::string_view op, int64_t d, int64_t seq_len, float rotary_base,
                             RopeCp cp) {
  if (d < 2 || d % 2 != 0 || d > kMaxRopeHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": head dim D (", d, ") must be even and in [2, ", kMaxRopeHeadDim, "]"));
  }
  if (cp.size < 1 || cp.rank < 0 || cp.rank >= cp.size) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": cp.rank (", cp.rank, ") must be in [0, cp.size ", cp.size, ")"));
  }
  if (seq_len < 1 || seq_len > kMaxRopeSeqLen / cp.size) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": seq_len (", seq_len, ") x cp.size (",
                                                   cp.size, ") must be in [1, 2^24]"));
  }
  if (cp.size > 1 && seq_len % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": seq_len (", seq_len, ") must be even with cp.size ", cp.size,
                     " (each rank holds two chunks of the sequence)"));
  }
  if (!(rotary_base > 0.0f) || !std::isfinite(rotary_base)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": rotary_base (", rotary_base, ") must be finite and > 0"));
  }
  return absl::OkStatus();
}

}  // namespace internal

absl::Status RopeForward(const Stream& stream, const Tensor& x, int64_t seq_len, float rotary_base,
                         const Tensor& out, RopeCp cp) {
  SY_RETURN_IF_ERROR(CheckRope(stream, "RopeForward", x, seq_len, rotary_base, out, cp));
  if (stream.is_cuda()) return internal::RopeCuda(stream, x, seq_len, rotary_base, 1.0f, out, cp);
  return RopeCpu(x, seq_len, rotary_base, 1.0, out, cp);
}

absl::Status RopeBackward(const Stream& stream, const Tensor& dout, int64_t seq_len,
                          float rotary_base, const Tensor& dx, RopeCp cp) {
  SY_RETURN_IF_ERROR(CheckRope(stream, "RopeBackward", dout, seq_len, rotary_base, dx, cp));
  if (stream.is_cuda()) {
    return internal::RopeCuda(stream, dout, seq_len, rotary_base, -1.0f, dx, cp);
  }
  return RopeCpu(dout, seq_len, rotary_base, -1.0, dx, cp);
}

}  // namespace switchyard::kernels
