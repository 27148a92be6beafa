// CUDA elementwise ops against the CPU reference: fresh random inputs, poisoned outputs,
// tolerance 1e-5 for f32 outputs and 1e-2 for bf16 (DESIGN.md).
#include <gtest/gtest.h>

#include <random>

#include "kernels/elementwise/elementwise.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

using testing::ExpectClose;
using testing::Poisoned;
using testing::Upload;

Tensor Dev(const Buffer& b) { return b.View(); }

TEST(ElementwiseGpuTest, MatchesCpuReference) {
  SY_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  const Stream gpu{Device::Cuda(0), nullptr};
  for (auto [t_n, h_n] : {std::pair<int64_t, int64_t>{1, 3}, {37, 129}, {2048, 2048}}) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      const double tol = dt == DType::kBF16 ? 1e-2 : 1e-5;
      Buffer y = Buffer::ForTensor(dt, {t_n, h_n}, Device::Cpu()).value();
      Buffer dout = Buffer::ForTensor(dt, {t_n, h_n}, Device::Cpu()).value();
      Buffer g = Buffer::ForTensor(DType::kF32, {t_n}, Device::Cpu()).value();
      testing::FillRandom(y.View(), rng);
      testing::FillRandom(dout.View(), rng);
      testing::FillRandom(g.View(), rng, 2.0f);
      Buffer out = Buffer::ForTensor(dt, {t_n, h_n}, Device::Cpu()).value();
      Buffer dy = Buffer::ForTensor(dt, {t_n, h_n}, Device::Cpu()).value();
      Buffer dg = Buffer::ForTensor(DType::kF32, {t_n}, Device::Cpu()).value();
      Buffer sum = Buffer::ForTensor(DType::kF32, {t_n, h_n}, Device::Cpu()).value();
      ASSERT_TRUE(SigmoidGateForward(Stream::Cpu(), y.View(), g.View(), out.View()).ok());
      ASSERT_TRUE(
          SigmoidGateBackward(Stream::Cpu(), dout.View(), y.View(), g.View(), dy.View(), dg.View())
              .ok());
      ASSERT_TRUE(Axpby(Stream::Cpu(), 0.5f, y.View(), -2.0f, dout.View(), sum.View()).ok());

      Buffer d_y = Upload(y), d_dout = Upload(dout), d_g = Upload(g);
      Buffer d_out = Poisoned(dt, {t_n, h_n}), d_dy = Poisoned(dt, {t_n, h_n});
      Buffer d_dg = Poisoned(DType::kF32, {t_n}), d_sum = Poisoned(DType::kF32, {t_n, h_n});
      Buffer d_cast = Poisoned(DType::kF32, {t_n, h_n});
      ASSERT_TRUE(SigmoidGateForward(gpu, Dev(d_y), Dev(d_g), Dev(d_out)).ok());
      ASSERT_TRUE(
          SigmoidGateBackward(gpu, Dev(d_dout), Dev(d_y), Dev(d_g), Dev(d_dy), Dev(d_dg)).ok());
      ASSERT_TRUE(Axpby(gpu, 0.5f, Dev(d_y), -2.0f, Dev(d_dout), Dev(d_sum)).ok());
      ASSERT_TRUE(Cast(gpu, Dev(d_y), Dev(d_cast)).ok());
      Buffer colsum = Buffer::ForTensor(DType::kF32, {h_n}, Device::Cpu()).value();
      testing::FillRandom(colsum.View(), rng);
      Buffer d_colsum = Upload(colsum);
      ASSERT_TRUE(AddColumnSums(Stream::Cpu(), sum.View(), colsum.View()).ok());
      ASSERT_TRUE(AddColumnSums(gpu, Dev(d_sum), Dev(d_colsum)).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      Buffer rnd = Buffer::ForTensor(dt, {t_n, h_n}, Device::Cpu()).value();
      Buffer d_rnd = Poisoned(dt, {t_n, h_n});
      ASSERT_TRUE(FillNormal(Stream::Cpu(), rnd.View(), 77, 0.5f, 1000003).ok());
      ASSERT_TRUE(FillNormal(gpu, Dev(d_rnd), 77, 0.5f, 1000003).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ExpectClose(Dev(d_rnd), rnd.View(), dt == DType::kBF16 ? 1e-2 : 1e-5, "fill normal");
      ExpectClose(Dev(d_colsum), colsum.View(), 1e-5, "column sums");
      ExpectClose(Dev(d_out), out.View(), tol, "gate forward");
      ExpectClose(Dev(d_dy), dy.View(), tol, "gate backward dy");
      ExpectClose(Dev(d_dg), dg.View(), dt == DType::kBF16 ? 1e-2 : 1e-5, "gate backward dg");
      ExpectClose(Dev(d_sum), sum.View(), 1e-5, "axpby");
      ExpectClose(Dev(d_cast), y.View(), 1e-7, "cast");
    }
  }
}

}  // namespace
}  // namespace switchyard::kernels
