// CPU reference for Gemm: fp64 accumulation, any of f32/f64/bf16 storage.
#include "common/tensor.h"
#include "kernels/gemm/gemm.h"

namespace switchyard::kernels::internal {
absl::Status GemmCpu(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                     float alpha, float beta, int64_t m, int64_t n, int64_t k) {
  std::vector<double> row(n);
  for (int64_t i = 0; i < m; ++i) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int64_t p = 0; p < k; ++p) {
      const double av = LoadAsDouble(a, trans_a ? p * m + i : i * k + p);
      if (av == 0) continue;
      for (int64_t j = 0; j < n; ++j)
        row[j] += av * LoadAsDouble(b, trans_b ? j * k + p : p * n + j);
    }
    for (int64_t j = 0; j < n; ++j) {
      const double prev = beta == 0.0f ? 0.0 : beta * LoadAsDouble(c, i * n + j);
      StoreFromDouble(c, i * n + j, alpha * row[j] + prev);
    }
  }
  return absl::OkStatus();
}

}  // namespace switchyard::kernels::internal
