// CPU weighted SwiGLU against a naive fp64 formula, a central finite-difference check of the
// backward (dh and dprobs), the valid-row contract (garbage rows past the count are never
// touched), the unweighted variant, and argument validation.
#include "kernels/moe/swiglu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace switchyard::kernels {
namespace {

Tensor T64(std::vector<double>& v, std::vector<int64_t> shape) {
  return Tensor(DType::kF64, std::move(shape), Device::Cpu(), v.data());
}
std::vector<double> Random(std::mt19937_64& rng, int64_t n, double scale = 1.5) {
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}

double NaiveSwiglu(double g, double l) { return g / (1.0 + std::exp(-g)) * l; }

// L = sum_{r < rows, j} w[r, j] * a[r, j]; the derivative the backward must reproduce.
double Loss(std::vector<double> h, std::vector<double> p, const std::vector<double>& w,
            int64_t rows, int64_t f) {
  double l = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < f; ++j)
      l += w[r * f + j] * NaiveSwiglu(h[r * 2 * f + j], h[r * 2 * f + f + j]) * p[r];
  return l;
}

TEST(SwigluCpuTest, ForwardMatchesNaiveOnValidRowsOnly) {
  std::mt19937_64 rng(11);
  const int64_t n = 12, f = 5;
  std::vector<int32_t> counts = {3, 0, 4};  // 7 valid rows; rows 7..11 are garbage
  std::vector<double> h = Random(rng, n * 2 * f), p = Random(rng, n, 0.3);
  for (int64_t i = 7 * 2 * f; i < n * 2 * f; ++i) h[i] = NAN;
  std::vector<double> a(n * f, -7.0);
  Tensor tc(DType::kI32, {3}, Device::Cpu(), counts.data());
  ASSERT_TRUE(
      SwigluForward(Stream::Cpu(), T64(h, {n, 2 * f}), T64(p, {n}), tc, T64(a, {n, f})).ok());
  double err = 0;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < f; ++j) {
      if (r >= 7) {
        EXPECT_EQ(a[r * f + j], -7.0) << "row past the count was written";
        continue;
      }
      const double ref = NaiveSwiglu(h[r * 2 * f + j], h[r * 2 * f + f + j]) * p[r];
      err = std::max(err, std::abs(a[r * f + j] - ref));
    }
  std::printf("swiglu fwd cpu N=%ld F=%ld valid=7: max err %.3g (tol 1e-14)\n", n, f, err);
  EXPECT_LT(err, 1e-14);

  // Unweighted (shared expert): all N rows, p = 1.
  std::vector<double> h2 = Random(rng, n * 2 * f), a2(n * f);
  ASSERT_TRUE(
      SwigluForward(Stream::Cpu(), T64(h2, {n, 2 * f}), Tensor(), Tensor(), T64(a2, {n, f})).ok());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < f; ++j)
      EXPECT_NEAR(a2[r * f + j], NaiveSwiglu(h2[r * 2 * f + j], h2[r * 2 * f + f + j]), 1e-14);
}

TEST(SwigluCpuTest, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(13);
  const int64_t n = 6, f = 7, rows = 5;
  std::vector<double> h = Random(rng, n * 2 * f), p = Random(rng, n, 0.4), w = Random(rng, n * f);
  for (int64_t i = rows * 2 * f; i < n * 2 * f; ++i) h[i] = NAN;  // garbage row
  std::vector<int32_t> total = {rows};
  Tensor tc(DType::kI32, {1}, Device::Cpu(), total.data());
  std::vector<double> dh(n * 2 * f, -3.0), dp(n, -3.0);
  ASSERT_TRUE(SwigluBackward(Stream::Cpu(), T64(w, {n, f}), T64(h, {n, 2 * f}), T64(p, {n}), tc,
                             T64(dh, {n, 2 * f}), T64(dp, {n}))
                  .ok());
  const double eps = 1e-6;
  double err_h = 0, err_p = 0, scale = 0;
  for (int64_t i = 0; i < rows * 2 * f; ++i) {
    std::vector<double> hp = h, hm = h;
    hp[i] += eps;
    hm[i] -= eps;
    const double fd = (Loss(hp, p, w, rows, f) - Loss(hm, p, w, rows, f)) / (2 * eps);
    err_h = std::max(err_h, std::abs(fd - dh[i]));
    scale = std::max(scale, std::abs(fd));
  }
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> pp = p, pm = p;
    pp[r] += eps;
    pm[r] -= eps;
    const double fd = (Loss(h, pp, w, rows, f) - Loss(h, pm, w, rows, f)) / (2 * eps);
    err_p = std::max(err_p, std::abs(fd - dp[r]));
  }
  std::printf("swiglu bwd cpu N=%ld F=%ld: FD max err dh %.3g dprobs %.3g (scale %.3g, tol 1e-7)\n",
              n, f, err_h, err_p, scale);
  EXPECT_LT(err_h, 1e-7);
  EXPECT_LT(err_p, 1e-7);
  EXPECT_EQ(dp[n - 1], -3.0);
  for (int64_t i = rows * 2 * f; i < n * 2 * f; ++i) EXPECT_EQ(dh[i], -3.0);

  // Closed form, weighted and unweighted: dh = swiglu'(h)^T (da * p).
  std::vector<double> dh1(n * 2 * f);
  ASSERT_TRUE(SwigluBackward(Stream::Cpu(), T64(w, {n, f}), T64(h, {n, 2 * f}), Tensor(), tc,
                             T64(dh1, {n, 2 * f}), Tensor())
                  .ok());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < 2 * f; ++j)
      EXPECT_NEAR(dh1[r * 2 * f + j] * p[r], dh[r * 2 * f + j], 1e-14);
}

TEST(SwigluCpuTest, BackwardWorksInF32AndBf16) {
  std::mt19937_64 rng(17);
  const int64_t n = 4, f = 16;
  std::vector<double> h = Random(rng, n * 2 * f), da = Random(rng, n * f), p = Random(rng, n);
  std::vector<double> ref_dh(n * 2 * f), ref_dp(n);
  ASSERT_TRUE(SwigluBackward(Stream::Cpu(), T64(da, {n, f}), T64(h, {n, 2 * f}), T64(p, {n}),
                             Tensor(), T64(ref_dh, {n, 2 * f}), T64(ref_dp, {n}))
                  .ok());
  std::vector<BF16> hb(n * 2 * f), dab(n * f), dhb(n * 2 * f);
  std::vector<float> pf(n), dpf(n);
  for (size_t i = 0; i < hb.size(); ++i) hb[i] = BF16::FromFloat(h[i]);
  for (size_t i = 0; i < dab.size(); ++i) dab[i] = BF16::FromFloat(da[i]);
  for (int64_t i = 0; i < n; ++i) pf[i] = static_cast<float>(p[i]);
  ASSERT_TRUE(SwigluBackward(Stream::Cpu(), Tensor(DType::kBF16, {n, f}, Device::Cpu(), dab.data()),
                             Tensor(DType::kBF16, {n, 2 * f}, Device::Cpu(), hb.data()),
                             Tensor(DType::kF32, {n}, Device::Cpu(), pf.data()), Tensor(),
                             Tensor(DType::kBF16, {n, 2 * f}, Device::Cpu(), dhb.data()),
                             Tensor(DType::kF32, {n}, Device::Cpu(), dpf.data()))
                  .ok());
  double num = 0, den = 0;
  for (size_t i = 0; i < dhb.size(); ++i) {
    num += std::pow(dhb[i].ToFloat() - ref_dh[i], 2);
    den += ref_dh[i] * ref_dh[i];
  }
  std::printf("swiglu bwd cpu bf16 vs f64: rel err %.3g (tol 2e-2, bf16 inputs)\n",
              std::sqrt(num / den));
  EXPECT_LT(std::sqrt(num / den), 2e-2);
}

TEST(SwigluCpuTest, RejectsBadInput) {
  std::vector<double> h(4 * 6), a(4 * 3), p(4), dh(4 * 6), dp(4);
  std::vector<int32_t> counts = {2, 3};  // sums to 5 > 4 rows
  Tensor tc(DType::kI32, {2}, Device::Cpu(), counts.data());
  absl::Status s = SwigluForward(Stream::Cpu(), T64(h, {4, 6}), T64(p, {4}), tc, T64(a, {4, 3}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("row_counts sum to 5"), absl::string_view::npos) << s;
  counts = {-1, 0};
  s = SwigluForward(Stream::Cpu(), T64(h, {4, 6}), T64(p, {4}), tc, T64(a, {4, 3}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = SwigluForward(Stream::Cpu(), T64(h, {4, 5}), T64(p, {4}), Tensor(), T64(a, {4, 3}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("even last dimension"), absl::string_view::npos) << s;
  s = SwigluForward(Stream::Cpu(), T64(h, {4, 6}), T64(p, {4}), Tensor(), T64(a, {3, 4}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = SwigluBackward(Stream::Cpu(), T64(a, {4, 3}), T64(h, {4, 6}), Tensor(), Tensor(),
                     T64(dh, {4, 6}), T64(dp, {4}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dprobs given without probs"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace switchyard::kernels
