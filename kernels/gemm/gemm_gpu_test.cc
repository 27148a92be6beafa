// cuBLAS bf16 GEMM against the CPU reference on fresh random inputs, outputs poisoned first.
// Tolerance (DESIGN.md): relative L2 error < 1e-2 for bf16 storage.
#include <gtest/gtest.h>

#include <random>

#include "kernels/gemm/gemm.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

struct Shape {
  int64_t m, n, k;
  bool ta, tb;
  DType out;
};

class GemmGpuTest : public ::testing::TestWithParam<Shape> {};

TEST_P(GemmGpuTest, Bf16MatchesCpuReference) {
  SY_REQUIRE_GPU();
  const Shape s = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  auto a_shape = s.ta ? std::vector<int64_t>{s.k, s.m} : std::vector<int64_t>{s.m, s.k};
  auto b_shape = s.tb ? std::vector<int64_t>{s.n, s.k} : std::vector<int64_t>{s.k, s.n};
  auto ha = Buffer::ForTensor(DType::kBF16, a_shape, Device::Cpu()).value();
  auto hb = Buffer::ForTensor(DType::kBF16, b_shape, Device::Cpu()).value();
  auto hc = Buffer::ForTensor(DType::kF32, {s.m, s.n}, Device::Cpu()).value();
  testing::FillRandom(ha.View(), rng);
  testing::FillRandom(hb.View(), rng);
  ASSERT_TRUE(Gemm(Stream::Cpu(), ha.View(), s.ta, hb.View(), s.tb, hc.View()).ok());

  auto da = Buffer::ForTensor(DType::kBF16, a_shape, Device::Cuda(0)).value();
  auto db = Buffer::ForTensor(DType::kBF16, b_shape, Device::Cuda(0)).value();
  auto dc = Buffer::ForTensor(s.out, {s.m, s.n}, Device::Cuda(0)).value();
  ASSERT_TRUE(CopyTensor(ha.View(), da.View()).ok());
  ASSERT_TRUE(CopyTensor(hb.View(), db.View()).ok());
  ASSERT_TRUE(FillBytes(dc.View(), 0xFF).ok());  // NaN poison
  Stream stream{Device::Cuda(0), nullptr};
  absl::Status st = Gemm(stream, da.View(), s.ta, db.View(), s.tb, dc.View());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const double err =
      testing::RelativeError(testing::ToFloatVector(dc.View()), testing::ToFloatVector(hc.View()));
  std::printf("gemm bf16 %ldx%ldx%ld ta=%d tb=%d out=%s: rel err %.3g (tol 1e-2)\n", s.m, s.n, s.k,
              s.ta, s.tb, DTypeName(s.out), err);
  EXPECT_LT(err, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmGpuTest,
                         ::testing::Values(Shape{256, 512, 384, false, false, DType::kF32},
                                           Shape{129, 67, 255, true, false, DType::kBF16},
                                           Shape{64, 300, 128, false, true, DType::kBF16},
                                           Shape{33, 17, 1000, true, true, DType::kF32}));

}  // namespace
}  // namespace switchyard::kernels
