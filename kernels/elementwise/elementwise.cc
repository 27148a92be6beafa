// Validation, device dispatch and the CPU reference of the elementwise ops.
#include "kernels/elementwise/elementwise.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace switchyard::kernels {
namespace {

bool IsFloat(DType d) { return d == DType::kF32 || d == DType::kF64 || d == DType::kBF16; }

absl::Status CheckFloat(const Stream& stream, absl::string_view op,
                        std::initializer_list<const Tensor*> ts) {
  SY_RETURN_IF_ERROR(CheckDevice(stream, ts));
  for (const Tensor* t : ts) {
    if (!IsFloat(t->dtype) || (stream.is_cuda() && t->dtype == DType::kF64)) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": unsupported dtype ", t->DebugString(),
                                                     " on ", stream.device.ToString()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckGate(const Tensor& y, const Tensor& g, const Tensor& out, absl::string_view op) {
  if (y.rank() != 2 || out.shape != y.shape || g.rank() != 1 || g.dim(0) != y.dim(0) ||
      out.dtype != y.dtype || g.dtype == DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": expected y/out [T, H] of one dtype and g [T] f32, got y ",
                     y.DebugString(), ", g ", g.DebugString(), ", out ", out.DebugString()));
  }
  return absl::OkStatus();
}

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

absl::Status Cast(const Stream& stream, const Tensor& src, const Tensor& dst) {
  SY_RETURN_IF_ERROR(CheckFloat(stream, "Cast", {&src, &dst}));
  if (src.numel() != dst.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Cast: element counts differ: ", src.DebugString(), " -> ", dst.DebugString()));
  }
  if (stream.is_cuda()) return internal::CastCuda(stream, src, dst);
  for (int64_t i = 0; i < src.numel(); ++i) StoreFromDouble(dst, i, LoadAsDouble(src, i));
  return absl::OkStatus();
}

absl::Status Axpby(const Stream& stream, float alpha, const Tensor& a, float beta, const Tensor& b,
                   const Tensor& out) {
  SY_RETURN_IF_ERROR(CheckFloat(stream, "Axpby", {&a, &b, &out}));
  if (a.shape != b.shape || a.shape != out.shape) {
    return absl::InvalidArgumentError(absl::StrCat("Axpby: shapes differ: ", a.DebugString(), ", ",
                                                   b.DebugString(), ", ", out.DebugString()));
  }
  if (stream.is_cuda()) return internal::AxpbyCuda(stream, alpha, a, beta, b, out);
  for (int64_t i = 0; i < a.numel(); ++i) {
    StoreFromDouble(out, i,
                    static_cast<double>(alpha) * LoadAsDouble(a, i) +
                        static_cast<double>(beta) * LoadAsDouble(b, i));
  }
  return absl::OkStatus();
}

absl::Status FillNormal(const Stream& stream, const Tensor& t, uint64_t seed, float std,
                        uint64_t offset) {
  SY_RETURN_IF_ERROR(CheckFloat(stream, "FillNormal", {&t}));
  if (stream.is_cuda()) return internal::FillNormalCuda(stream, t, seed, std, offset);
  for (int64_t i = 0; i < t.numel(); ++i)
    StoreFromDouble(t, i, std * internal::HashNormal(seed, offset + static_cast<uint64_t>(i)));
  return absl::OkStatus();
}

absl::Status AddColumnSums(const Stream& stream, const Tensor& x, const Tensor& out) {
  SY_RETURN_IF_ERROR(CheckFloat(stream, "AddColumnSums", {&x, &out}));
  if (x.rank() != 2 || out.rank() != 1 || out.dim(0) != x.dim(1) || x.dtype != out.dtype ||
      x.dtype == DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("AddColumnSums: expected x [B, E] and out [E] "
                     "of one f32/f64 dtype, got ",
                     x.DebugString(), ", ", out.DebugString()));
  }
  if (stream.is_cuda()) return internal::AddColumnSumsCuda(stream, x, out);
  for (int64_t j = 0; j < x.dim(1); ++j) {
    double s = LoadAsDouble(out, j);
    for (int64_t i = 0; i < x.dim(0); ++i) s += LoadAsDouble(x, i * x.dim(1) + j);
    StoreFromDouble(out, j, s);
  }
  return absl::OkStatus();
}

absl::Status SigmoidGateForward(const Stream& stream, const Tensor& y, const Tensor& g,
                                const Tensor& out) {
  SY_RETURN_IF_ERROR(CheckFloat(stream, "SigmoidGateForward", {&y, &g, &out}));
  SY_RETURN_IF_ERROR(CheckGate(y, g, out, "SigmoidGateForward"));
  if (stream.is_cuda()) return internal::SigmoidGateForwardCuda(stream, y, g, out);
  const int64_t t_n = y.dim(0), h_n = y.dim(1);
  for (int64_t t = 0; t < t_n; ++t) {
    const double s = Sigmoid(LoadAsDouble(g, t));
    for (int64_t h = 0; h < h_n; ++h)
      StoreFromDouble(out, t * h_n + h, LoadAsDouble(y, t * h_n + h) * s);
  }
  return absl::OkStatus();
}

absl::Status SigmoidGateBackward(const Stream& stream, const Tensor& dout, const Tensor& y,
                                 const Tensor& g, const Tensor& dy, const Tensor& dg) {
  SY_RETURN_IF_ERROR(CheckFloat(stream, "SigmoidGateBackward", {&dout, &y, &g, &dy, &dg}));
  SY_RETURN_IF_ERROR(CheckGate(y, g, dout, "SigmoidGateBackward"));
  SY_RETURN_IF_ERROR(CheckGate(y, dg, dy, "SigmoidGateBackward"));
  if (stream.is_cuda()) return internal::SigmoidGateBackwardCuda(stream, dout, y, g, dy, dg);
  const int64_t t_n = y.dim(0), h_n = y.dim(1);
  for (int64_t t = 0; t < t_n; ++t) {
    const double s = Sigmoid(LoadAsDouble(g, t));
    double dot = 0;
    for (int64_t h = 0; h < h_n; ++h) {
      const double d = LoadAsDouble(dout, t * h_n + h);
      dot += d * LoadAsDouble(y, t * h_n + h);
      StoreFromDouble(dy, t * h_n + h, d * s);
    }
    StoreFromDouble(dg, t, s * (1.0 - s) * dot);
  }
  return absl::OkStatus();
}

}  // namespace switchyard::kernels
