// CPU reference of the weighted SwiGLU (swiglu.h): fp64 math, one rounding to the output dtype.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/moe/swiglu.h"

namespace switchyard::kernels::internal {
namespace {

// Number of valid leading rows: the sum of row_counts (all N rows when it is empty).
absl::Status ValidRows(absl::string_view op, const Tensor& row_counts, int64_t n, int64_t* rows) {
  if (row_counts.data == nullptr) {
    *rows = n;
    return absl::OkStatus();
  }
  int64_t sum = 0;
  for (int64_t i = 0; i < row_counts.numel(); ++i) {
    const int32_t c = row_counts.as<int32_t>()[i];
    if (c < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": row_counts[", i, "] = ", c, " must be >= 0"));
    }
    sum += c;
  }
  if (sum > n) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": row_counts sum to ", sum, ", more than the ", n, " rows of h"));
  }
  *rows = sum;
  return absl::OkStatus();
}

double Sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

}  // namespace

absl::Status SwigluForwardCpu(const Tensor& h, const Tensor& probs, const Tensor& row_counts,
                              const Tensor& a) {
  int64_t rows = 0;
  SY_RETURN_IF_ERROR(ValidRows("SwigluForward", row_counts, h.dim(0), &rows));
  const int64_t f = a.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    const double p = probs.data != nullptr ? LoadAsDouble(probs, r) : 1.0;
    for (int64_t j = 0; j < f; ++j) {
      const double g = LoadAsDouble(h, r * 2 * f + j), l = LoadAsDouble(h, r * 2 * f + f + j);
      StoreFromDouble(a, r * f + j, g * Sigmoid(g) * l * p);
    }
  }
  return absl::OkStatus();
}

absl::Status SwigluBackwardCpu(const Tensor& da, const Tensor& h, const Tensor& probs,
                               const Tensor& row_counts, const Tensor& dh, const Tensor& dprobs) {
  int64_t rows = 0;
  SY_RETURN_IF_ERROR(ValidRows("SwigluBackward", row_counts, h.dim(0), &rows));
  const int64_t f = da.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    const double p = probs.data != nullptr ? LoadAsDouble(probs, r) : 1.0;
    double dot = 0;
    for (int64_t j = 0; j < f; ++j) {
      const double g = LoadAsDouble(h, r * 2 * f + j), l = LoadAsDouble(h, r * 2 * f + f + j);
      const double d = LoadAsDouble(da, r * f + j);
      const double sig = Sigmoid(g), silu = g * sig;
      dot += d * silu * l;
      const double dp = d * p;
      StoreFromDouble(dh, r * 2 * f + j, dp * l * sig * (1.0 + g * (1.0 - sig)));
      StoreFromDouble(dh, r * 2 * f + f + j, dp * silu);
    }
    if (dprobs.data != nullptr) StoreFromDouble(dprobs, r, dot);
  }
  return absl::OkStatus();
}

}  // namespace switchyard::kernels::internal
