// CPU reference for Gemm: fp64 accumulation, any of f32/f64/bf16 storage.
#include "common/tensor.h"
#include "kernels/gemm/gemm.h"

namespace switchyard::kernels::internal {
namespace {

double Load(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32:
      return t.as<float>()[i];
    case DType::kF64:
      return t.as<double>()[i];
    case DType::kBF16:
      return t.as<BF16>()[i].ToFloat();
    default:
      return 0;
  }
}

void Store(const Tensor& t, int64_t i, double v) {
  switch (t.dtype) {
    case DType::kF32:
      t.as<float>()[i] = static_cast<float>(v);
      break;
    case DType::kF64:
      t.as<double>()[i] = v;
      break;
    case DType::kBF16:
      t.as<BF16>()[i] = BF16::FromFloat(static_cast<float>(v));
      break;
    default:
      break;
  }
}

}  // namespace

absl::Status GemmCpu(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                     float alpha, float beta, int64_t m, int64_t n, int64_t k) {
  std::vector<double> row(n);
  for (int64_t i = 0; i < m; ++i) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int64_t p = 0; p < k; ++p) {
      const double av = Load(a, trans_a ? p * m + i : i * k + p);
      if (av == 0) continue;
      for (int64_t j = 0; j < n; ++j) row[j] += av * Load(b, trans_b ? j * k + p : p * n + j);
    }
    for (int64_t j = 0; j < n; ++j) {
      const double prev = beta == 0.0f ? 0.0 : beta * Load(c, i * n + j);
      Store(c, i * n + j, alpha * row[j] + prev);
    }
  }
  return absl::OkStatus();
}

}  // namespace switchyard::kernels::internal
