// CPU reference of RMSNorm: forward against a naive fp64 formula, backward against fp64 finite
// differences (dx and dw), dw accumulate/overwrite, aliasing, and argument errors.
#include "kernels/norm/rmsnorm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

Tensor T64(std::vector<double>& v, std::vector<int64_t> shape) {
  return Tensor(DType::kF64, std::move(shape), Device::Cpu(), v.data());
}

std::vector<double> Random(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}

TEST(RmsNormCpuTest, ForwardMatchesNaiveFormula) {
  std::mt19937_64 rng(1);
  const int64_t t_n = 9, h_n = 33;
  const float eps = 1e-5f;
  std::vector<float> x(t_n * h_n), w(h_n), y(t_n * h_n), rstd(t_n);
  Tensor tx(DType::kF32, {t_n, h_n}, Device::Cpu(), x.data());
  Tensor tw(DType::kF32, {h_n}, Device::Cpu(), w.data());
  testing::FillRandom(tx, rng);
  testing::FillRandom(tw, rng);
  ASSERT_TRUE(RmsNormForward(Stream::Cpu(), tx, tw, eps,
                             Tensor(DType::kF32, {t_n, h_n}, Device::Cpu(), y.data()),
                             Tensor(DType::kF32, {t_n}, Device::Cpu(), rstd.data()))
                  .ok());
  double max_rel = 0;
  for (int64_t t = 0; t < t_n; ++t) {
    double ms = 0;
    for (int64_t h = 0; h < h_n; ++h) ms += double(x[t * h_n + h]) * x[t * h_n + h];
    const double r = 1.0 / std::sqrt(ms / h_n + eps);
    max_rel = std::max(max_rel, std::abs(rstd[t] - r) / r);
    for (int64_t h = 0; h < h_n; ++h) {
      const double ref = double(x[t * h_n + h]) * r * w[h];
      max_rel = std::max(max_rel, std::abs(y[t * h_n + h] - ref) / std::max(1e-3, std::abs(ref)));
    }
  }
  std::printf("RMSNorm forward f32 [%lld, %lld] vs naive fp64: max rel err %.3g (tol 1e-6)\n",
              (long long)t_n, (long long)h_n, max_rel);
  EXPECT_LT(max_rel, 1e-6);
}

TEST(RmsNormCpuTest, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(2);
  const int64_t t_n = 4, h_n = 13;
  const float eps = 1e-3f;  // large enough to matter in the derivative
  std::vector<double> x = Random(t_n * h_n, rng), w = Random(h_n, rng), dy = Random(t_n * h_n, rng);
  std::vector<double> y(t_n * h_n), rstd(t_n), dx(t_n * h_n), dw(h_n, 0.0);
  auto loss = [&]() {
    EXPECT_TRUE(RmsNormForward(Stream::Cpu(), T64(x, {t_n, h_n}), T64(w, {h_n}), eps,
                               T64(y, {t_n, h_n}), T64(rstd, {t_n}))
                    .ok());
    double l = 0;
    for (int64_t i = 0; i < t_n * h_n; ++i) l += y[i] * dy[i];
    return l;
  };
  loss();
  ASSERT_TRUE(RmsNormBackward(Stream::Cpu(), T64(dy, {t_n, h_n}), T64(x, {t_n, h_n}), T64(w, {h_n}),
                              T64(rstd, {t_n}), T64(dx, {t_n, h_n}), T64(dw, {h_n}),
                              /*accumulate_dw=*/false, Tensor())
                  .ok());
  const double step = 1e-6;
  auto fd = [&](double& v) {
    const double keep = v;
    v = keep + step;
    const double lp = loss();
    v = keep - step;
    const double lm = loss();
    v = keep;
    return (lp - lm) / (2 * step);
  };
  double err_dx = 0, err_dw = 0;
  for (int64_t i = 0; i < t_n * h_n; ++i) err_dx = std::max(err_dx, std::abs(fd(x[i]) - dx[i]));
  for (int64_t h = 0; h < h_n; ++h) err_dw = std::max(err_dw, std::abs(fd(w[h]) - dw[h]));
  std::printf(
      "RMSNorm fp64 finite differences [%lld, %lld]: max abs err dx %.3g dw %.3g (tol 1e-7)\n",
      (long long)t_n, (long long)h_n, err_dx, err_dw);
  EXPECT_LT(err_dx, 1e-7);
  EXPECT_LT(err_dw, 1e-7);

  // Accumulate adds to the buffer; dx aliasing dy gives the same dx.
  std::vector<double> dw_acc(h_n, 0.5), dx_alias = dy;
  ASSERT_TRUE(RmsNormBackward(Stream::Cpu(), T64(dx_alias, {t_n, h_n}), T64(x, {t_n, h_n}),
                              T64(w, {h_n}), T64(rstd, {t_n}), T64(dx_alias, {t_n, h_n}),
                              T64(dw_acc, {h_n}), /*accumulate_dw=*/true, Tensor())
                  .ok());
  for (int64_t h = 0; h < h_n; ++h) EXPECT_NEAR(dw_acc[h], 0.5 + dw[h], 1e-12);
  for (int64_t i = 0; i < t_n * h_n; ++i) EXPECT_EQ(dx_alias[i], dx[i]);

  // accumulate_dx adds the gradient to dx (the residual stream's); dx must not alias dy then.
  std::vector<double> dx_acc = Random(t_n * h_n, rng), dw_scratch(h_n);
  const std::vector<double> before = dx_acc;
  ASSERT_TRUE(RmsNormBackward(Stream::Cpu(), T64(dy, {t_n, h_n}), T64(x, {t_n, h_n}), T64(w, {h_n}),
                              T64(rstd, {t_n}), T64(dx_acc, {t_n, h_n}), T64(dw_scratch, {h_n}),
                              false, Tensor(), /*accumulate_dx=*/true)
                  .ok());
  for (int64_t i = 0; i < t_n * h_n; ++i) EXPECT_NEAR(dx_acc[i], before[i] + dx[i], 1e-12);
  std::vector<double> same = dy;
  const absl::Status alias = RmsNormBackward(
      Stream::Cpu(), T64(same, {t_n, h_n}), T64(x, {t_n, h_n}), T64(w, {h_n}), T64(rstd, {t_n}),
      T64(same, {t_n, h_n}), T64(dw_scratch, {h_n}), false, Tensor(), /*accumulate_dx=*/true);
  EXPECT_EQ(alias.code(), absl::StatusCode::kInvalidArgument) << alias;
  EXPECT_NE(alias.message().find("accumulate_dx"), std::string::npos) << alias;
}

TEST(RmsNormCpuTest, ForwardInPlaceMatchesOutOfPlace) {
  std::mt19937_64 rng(3);
  const int64_t t_n = 3, h_n = 8;
  std::vector<double> x = Random(t_n * h_n, rng), w = Random(h_n, rng), y(t_n * h_n), r(t_n);
  ASSERT_TRUE(RmsNormForward(Stream::Cpu(), T64(x, {t_n, h_n}), T64(w, {h_n}), 1e-6f,
                             T64(y, {t_n, h_n}), T64(r, {t_n}))
                  .ok());
  ASSERT_TRUE(RmsNormForward(Stream::Cpu(), T64(x, {t_n, h_n}), T64(w, {h_n}), 1e-6f,
                             T64(x, {t_n, h_n}), T64(r, {t_n}))
                  .ok());
  EXPECT_EQ(x, y);
}

TEST(RmsNormCpuTest, RejectsBadArguments) {
  std::vector<float> x(12), w(4), w3(3), y(12), r(3), r2(2);
  const Device cpu = Device::Cpu();
  Tensor tx(DType::kF32, {3, 4}, cpu, x.data()), tw(DType::kF32, {4}, cpu, w.data());
  Tensor ty(DType::kF32, {3, 4}, cpu, y.data()), tr(DType::kF32, {3}, cpu, r.data());
  EXPECT_EQ(
      RmsNormForward(Stream::Cpu(), tx, Tensor(DType::kF32, {3}, cpu, w3.data()), 1e-5f, ty, tr)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      RmsNormForward(Stream::Cpu(), tx, tw, 1e-5f, ty, Tensor(DType::kF32, {2}, cpu, r2.data()))
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RmsNormForward(Stream::Cpu(), tx, tw, 0.0f, ty, tr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      RmsNormForward(Stream::Cpu(), tx, Tensor(DType::kBF16, {4}, cpu, w.data()), 1e-5f, ty, tr)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RmsNormBackward(Stream::Cpu(), ty, tx, tw, tr, ty,
                            Tensor(DType::kF64, {4}, cpu, w.data()), false, Tensor())
                .code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status s =
      RmsNormBackward(Stream::Cpu(), ty, tx, tw, tr, Tensor(DType::kF32, {4, 3}, cpu, y.data()), tw,
                      false, Tensor());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dx"), absl::string_view::npos) << s;
}

TEST(RmsNormCpuTest, WorkspaceSizeFollowsBlocks) {
  EXPECT_EQ(RmsNormBackwardBlocks(1), 1);
  EXPECT_EQ(RmsNormBackwardBlocks(37), 37);
  EXPECT_EQ(RmsNormBackwardBlocks(4096), 256);
  EXPECT_EQ(RmsNormBackwardWorkspaceBytes(4096, 1000), 256 * 1000 * 4);
}

}  // namespace
}  // namespace switchyard::kernels
