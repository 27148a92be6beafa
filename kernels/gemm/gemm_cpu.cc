// CPU reference for Gemm: fp64 accumulation, any of f32/f64/bf16 storage.
#include <algorithm>
#include <vector>

#include "common/tensor.h"
#include "kernels/gemm/gemm.h"

namespace switchyard::kernels::internal {
namespace {

// `t` (f32, f64 or bf16) as doubles, optionally transposed: out[r * cols + c] = t(r, c) where
// t(r, c) is element (c, r) of the stored [cols, rows] matrix when `transposed`.
std::vector<double> ToDoubles(const Tensor& t, bool transposed, int64_t rows, int64_t cols) {
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      out[r * cols + c] = LoadAsDouble(t, transposed ? c * rows + r : r * cols + c);
    }
  }
  return out;
}

}  // namespace

// Row i of C accumulates sum_p A(i, p) * B(p, :) with p ascending (the reference order); B is
// widened to fp64 once, in [k, n] layout, so the inner loop over j is contiguous and vectorises
// without changing any element's summation order.
absl::Status GemmCpu(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                     float alpha, float beta, int64_t m, int64_t n, int64_t k) {
  const std::vector<double> bd = ToDoubles(b, trans_b, k, n);
  std::vector<double> row(n), arow(k);
  for (int64_t i = 0; i < m; ++i) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int64_t p = 0; p < k; ++p) arow[p] = LoadAsDouble(a, trans_a ? p * m + i : i * k + p);
    for (int64_t p = 0; p < k; ++p) {
      const double av = arow[p];
      if (av == 0) continue;
      const double* bp = bd.data() + p * n;
      double* rp = row.data();
      for (int64_t j = 0; j < n; ++j) rp[j] += av * bp[j];
    }
    for (int64_t j = 0; j < n; ++j) {
      const double prev = beta == 0.0f ? 0.0 : beta * LoadAsDouble(c, i * n + j);
      StoreFromDouble(c, i * n + j, alpha * row[j] + prev);
    }
  }
  return absl::OkStatus();
}

}  // namespace switchyard::kernels::internal
