// CPU reference GEMM against a naive fp64 triple loop, and shape validation.
#include "kernels/gemm/gemm.h"

#include <gtest/gtest.h>

#include <random>

#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

TEST(GemmCpuTest, MatchesNaiveFp64ForAllTransposes) {
  std::mt19937_64 rng(7);
  const int64_t m = 13, n = 9, k = 17;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      std::vector<float> a(m * k), b(k * n), c(m * n, 123.0f);
      Tensor ta_t(DType::kF32, ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k},
                  Device::Cpu(), a.data());
      Tensor tb_t(DType::kF32, tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n},
                  Device::Cpu(), b.data());
      Tensor tc(DType::kF32, {m, n}, Device::Cpu(), c.data());
      testing::FillRandom(ta_t, rng);
      testing::FillRandom(tb_t, rng);
      std::vector<float> c0(m * n);
      Tensor tc0(DType::kF32, {m, n}, Device::Cpu(), c0.data());
      testing::FillRandom(tc0, rng);
      c = c0;
      ASSERT_TRUE(Gemm(Stream::Cpu(), ta_t, ta, tb_t, tb, tc, 0.5f, 2.0f).ok());
      std::vector<float> ref(m * n);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p)
            s += double(a[ta ? p * m + i : i * k + p]) * b[tb ? j * k + p : p * n + j];
          ref[i * n + j] = static_cast<float>(0.5 * s + 2.0 * c0[i * n + j]);
        }
      const double err = testing::RelativeError(c, ref);
      std::printf("gemm cpu %ldx%ldx%ld ta=%d tb=%d rel err %.3g (tol 1e-6)\n", m, n, k, ta, tb,
                  err);
      EXPECT_LT(err, 1e-6);
    }
  }
}

TEST(GemmCpuTest, RejectsMismatchedShapes) {
  std::vector<float> a(6), b(6), c(4);
  Tensor ta(DType::kF32, {2, 3}, Device::Cpu(), a.data());
  Tensor tb(DType::kF32, {2, 3}, Device::Cpu(), b.data());
  Tensor tc(DType::kF32, {2, 2}, Device::Cpu(), c.data());
  absl::Status s = Gemm(Stream::Cpu(), ta, false, tb, false, tc);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("shapes do not agree"), absl::string_view::npos) << s;
  EXPECT_TRUE(Gemm(Stream::Cpu(), ta, false, tb, true, tc).ok());
}

}  // namespace
}  // namespace switchyard::kernels
