// CPU reference of the elementwise ops: closed forms, and a finite-difference check of the gate.
#include "kernels/elementwise/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

TEST(ElementwiseCpuTest, CastRoundsToNearestEvenAndAxpbyCombines) {
  std::vector<float> src = {1.0f, 1.00390625f, -2.5f, 3.1f};
  std::vector<BF16> mid(4);
  std::vector<float> back(4);
  Tensor s(DType::kF32, {4}, Device::Cpu(), src.data());
  Tensor m(DType::kBF16, {4}, Device::Cpu(), mid.data());
  Tensor b(DType::kF32, {4}, Device::Cpu(), back.data());
  ASSERT_TRUE(Cast(Stream::Cpu(), s, m).ok());
  ASSERT_TRUE(Cast(Stream::Cpu(), m, b).ok());
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 1.0f);  // halfway between 1 and 1+2^-7 rounds to even
  EXPECT_EQ(back[2], -2.5f);
  EXPECT_NEAR(back[3], 3.1f, 3.1f / 128);
  std::vector<float> out(4);
  Tensor o(DType::kF32, {4}, Device::Cpu(), out.data());
  ASSERT_TRUE(Axpby(Stream::Cpu(), 2.0f, s, -1.0f, b, o).ok());
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(out[i], 2 * src[i] - back[i]);
  std::vector<float> bad(3);
  Tensor wrong(DType::kF32, {3}, Device::Cpu(), bad.data());
  EXPECT_EQ(Axpby(Stream::Cpu(), 1, s, 1, wrong, o).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ElementwiseCpuTest, FillNormalHasUnitMomentsAndIsSeeded) {
  std::vector<float> a(200000), b(200000);
  Tensor ta(DType::kF32, {200000}, Device::Cpu(), a.data());
  Tensor tb(DType::kF32, {200000}, Device::Cpu(), b.data());
  ASSERT_TRUE(FillNormal(Stream::Cpu(), ta, 42, 2.0f).ok());
  ASSERT_TRUE(FillNormal(Stream::Cpu(), tb, 43, 2.0f).ok());
  double m = 0, v = 0;
  for (float x : a) m += x;
  m /= a.size();
  for (float x : a) v += (x - m) * (x - m);
  v /= a.size();
  std::printf("FillNormal std 2: mean %.4f var %.4f\n", m, v);
  EXPECT_NEAR(m, 0.0, 0.03);
  EXPECT_NEAR(v, 4.0, 0.1);
  EXPECT_NE(a, b);
  // A slice filled with an offset equals the same elements of the whole tensor.
  std::vector<float> part(1000);
  Tensor tp(DType::kF32, {1000}, Device::Cpu(), part.data());
  ASSERT_TRUE(FillNormal(Stream::Cpu(), tp, 42, 2.0f, /*offset=*/12345).ok());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(part[i], a[12345 + i]) << i;
}

TEST(ElementwiseCpuTest, AddColumnSumsAccumulates) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6}, out = {10, 20, 30};
  ASSERT_TRUE(AddColumnSums(Stream::Cpu(), Tensor(DType::kF32, {2, 3}, Device::Cpu(), x.data()),
                            Tensor(DType::kF32, {3}, Device::Cpu(), out.data()))
                  .ok());
  EXPECT_EQ(out, (std::vector<float>{15, 27, 39}));
}

TEST(ElementwiseCpuTest, SigmoidGateBackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(3);
  const int64_t t_n = 5, h_n = 7;
  std::vector<double> y(t_n * h_n), g(t_n), dout(t_n * h_n), out(t_n * h_n), dy(t_n * h_n), dg(t_n);
  Tensor ty(DType::kF64, {t_n, h_n}, Device::Cpu(), y.data());
  Tensor tg(DType::kF64, {t_n}, Device::Cpu(), g.data());
  Tensor tdout(DType::kF64, {t_n, h_n}, Device::Cpu(), dout.data());
  Tensor tout(DType::kF64, {t_n, h_n}, Device::Cpu(), out.data());
  Tensor tdy(DType::kF64, {t_n, h_n}, Device::Cpu(), dy.data());
  Tensor tdg(DType::kF64, {t_n}, Device::Cpu(), dg.data());
  testing::FillRandom(ty, rng);
  testing::FillRandom(tg, rng);
  testing::FillRandom(tdout, rng);
  ASSERT_TRUE(SigmoidGateBackward(Stream::Cpu(), tdout, ty, tg, tdy, tdg).ok());
  auto loss = [&]() {
    EXPECT_TRUE(SigmoidGateForward(Stream::Cpu(), ty, tg, tout).ok());
    double l = 0;
    for (int64_t i = 0; i < t_n * h_n; ++i) l += out[i] * dout[i];
    return l;
  };
  const double eps = 1e-6;
  double max_err = 0;
  for (int64_t i = 0; i < t_n * h_n; ++i) {
    const double keep = y[i];
    y[i] = keep + eps;
    const double lp = loss();
    y[i] = keep - eps;
    const double lm = loss();
    y[i] = keep;
    max_err = std::max(max_err, std::abs((lp - lm) / (2 * eps) - dy[i]));
  }
  for (int64_t t = 0; t < t_n; ++t) {
    const double keep = g[t];
    g[t] = keep + eps;
    const double lp = loss();
    g[t] = keep - eps;
    const double lm = loss();
    g[t] = keep;
    max_err = std::max(max_err, std::abs((lp - lm) / (2 * eps) - dg[t]));
  }
  std::printf("sigmoid gate fp64 finite-difference max abs err %.3g (tol 1e-7)\n", max_err);
  EXPECT_LT(max_err, 1e-7);
}

}  // namespace
}  // namespace switchyard::kernels
