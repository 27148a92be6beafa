// CPU reference of GroupedGemm: fp64 accumulation, f32/f64/bf16 storage, the same count clamping
// as the device paths (negative counts are 0; rows past the capacity R are dropped).
#include <algorithm>
#include <vector>

#include "common/tensor.h"
#include "kernels/gemm/grouped_gemm.h"

namespace switchyard::kernels::internal {
namespace {

double Load(DType dtype, const void* base, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kF64:
      return static_cast<const double*>(base)[i];
    case DType::kBF16:
      return static_cast<const BF16*>(base)[i].ToFloat();
    default:
      return 0;
  }
}

void Store(DType dtype, void* base, int64_t i, double v) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      break;
    case DType::kF64:
      static_cast<double*>(base)[i] = v;
      break;
    case DType::kBF16:
      static_cast<BF16*>(base)[i] = BF16::FromFloat(static_cast<float>(v));
      break;
    default:
      break;
  }
}

}  // namespace

// Copies `count` elements starting at element `first` of `base` into doubles.
static void LoadRange(DType dtype, const void* base, int64_t first, int64_t count,
                      std::vector<double>* out) {
  out->resize(count);
  for (int64_t i = 0; i < count; ++i) (*out)[i] = Load(dtype, base, first + i);
}

absl::Status GroupedGemmCpu(const GroupedGemmCall& c) {
  const int64_t k = c.k, n = c.n;
  const DType in = c.in_dtype, out = c.out_dtype;
  // Each group's operands are converted to doubles once so that the loops below stay tight.
  std::vector<double> a, b, acc;
  int64_t off = 0;
  for (int g = 0; g < c.groups; ++g) {
    const int64_t count = std::max<int64_t>(c.tokens_per_group[g], 0);
    const int64_t m = std::min(count, c.rows - off);
    switch (c.op) {
      case GroupedGemmOp::kFprop:  // y[off+i, j] = sum_p x[off+i, p] w[g, p, j]
        if (m == 0) break;
        LoadRange(in, c.a, off * k, m * k, &a);
        LoadRange(in, c.b, g * k * n, k * n, &b);
        acc.resize(n);
        for (int64_t i = 0; i < m; ++i) {
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t p = 0; p < k; ++p) {
            const double xv = a[i * k + p];
            const double* wr = &b[p * n];
            for (int64_t j = 0; j < n; ++j) acc[j] += xv * wr[j];
          }
          for (int64_t j = 0; j < n; ++j) Store(out, c.out, (off + i) * n + j, acc[j]);
        }
        break;
      case GroupedGemmOp::kDgrad:  // dx[off+i, p] = sum_j dy[off+i, j] w[g, p, j]
        if (m == 0) break;
        LoadRange(in, c.a, off * n, m * n, &a);
        LoadRange(in, c.b, g * k * n, k * n, &b);
        for (int64_t i = 0; i < m; ++i) {
          const double* dyr = &a[i * n];
          for (int64_t p = 0; p < k; ++p) {
            const double* wr = &b[p * n];
            double s = 0;
            for (int64_t j = 0; j < n; ++j) s += dyr[j] * wr[j];
            Store(out, c.out, (off + i) * k + p, s);
          }
        }
        break;
      case GroupedGemmOp::kWgrad: {  // dw[g, p, j] (+)= sum_i x[off+i, p] dy[off+i, j]
        LoadRange(in, c.a, off * k, m * k, &a);
        LoadRange(in, c.b, off * n, m * n, &b);
        acc.assign(k * n, 0.0);
        for (int64_t i = 0; i < m; ++i) {
          const double* dyr = &b[i * n];
          for (int64_t p = 0; p < k; ++p) {
            const double xv = a[i * k + p];
            double* accr = &acc[p * n];
            for (int64_t j = 0; j < n; ++j) accr[j] += xv * dyr[j];
          }
        }
        const int64_t base = static_cast<int64_t>(g) * k * n;
        for (int64_t e = 0; e < k * n; ++e) {
          const double prev = c.accumulate ? Load(out, c.out, base + e) : 0.0;
          Store(out, c.out, base + e, prev + acc[e]);
        }
        break;
      }
    }
    off += m;
  }
  return absl::OkStatus();
}

}  // namespace switchyard::kernels::internal
