#include "kernels/gemm/gemm.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace switchyard::kernels {

absl::Status Gemm(const Stream& stream, const Tensor& a, bool trans_a, const Tensor& b,
                  bool trans_b, const Tensor& c, float alpha, float beta) {
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&a, &b, &c}));
  if (a.rank() != 2 || b.rank() != 2 || c.rank() != 2) {
    return absl::InvalidArgumentError("Gemm: A, B and C must be 2-D");
  }
  const int64_t m = trans_a ? a.dim(1) : a.dim(0);
  const int64_t k = trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = trans_b ? b.dim(1) : b.dim(0);
  const int64_t n = trans_b ? b.dim(0) : b.dim(1);
  if (k != kb || c.dim(0) != m || c.dim(1) != n) {
    return absl::InvalidArgumentError(absl::StrCat("Gemm: shapes do not agree: A ", a.DebugString(),
                                                   trans_a ? "^T" : "", ", B ", b.DebugString(),
                                                   trans_b ? "^T" : "", ", C ", c.DebugString()));
  }
  if (a.dtype != b.dtype) return absl::InvalidArgumentError("Gemm: A and B dtypes differ");
  if (c.dtype != DType::kF32 && c.dtype != a.dtype) {
    return absl::InvalidArgumentError("Gemm: C must be f32 or the input dtype");
  }
  if (stream.is_cuda())
    return internal::GemmCuda(stream, a, trans_a, b, trans_b, c, alpha, beta, m, n, k);
  return internal::GemmCpu(a, trans_a, b, trans_b, c, alpha, beta, m, n, k);
}

}  // namespace switchyard::kernels
