// CUDA RMSNorm against the CPU reference: fresh random inputs, poisoned outputs, tolerance 1e-5
// for f32 and 1e-2 for bf16 (DESIGN.md); dw checked in f32 (accumulated) and in the param dtype
// (overwritten); the backward is run twice to check that dw is bit-identical run to run.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kernels/norm/rmsnorm.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

using testing::ExpectClose;
using testing::Poisoned;
using testing::Upload;

Buffer Host(DType dt, std::vector<int64_t> shape) {
  return Buffer::ForTensor(dt, std::move(shape), Device::Cpu()).value();
}

TEST(RmsNormGpuTest, MatchesCpuReference) {
  SY_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  const Stream gpu{Device::Cuda(0), nullptr};
  const Stream cpu = Stream::Cpu();
  const float eps = 1e-6f;
  // 1536 and 2048: the warp-per-row backward with 6 and 8 vectors per lane (bf16; 2048's 64 KB of
  // dw partials past the default shared memory); 4096: the block-per-row backward.
  for (int64_t h_n : {64, 128, 129, 256, 1000, 1536, 2048, 4096}) {
    for (int64_t t_n : {1, 37, 4096}) {
      for (DType dt : {DType::kBF16, DType::kF32}) {
        const double tol = dt == DType::kBF16 ? 1e-2 : 1e-5;
        std::printf("RMSNorm T=%lld H=%lld %s\n", (long long)t_n, (long long)h_n, DTypeName(dt));
        Buffer x = Host(dt, {t_n, h_n}), w = Host(dt, {h_n}), dy = Host(dt, {t_n, h_n});
        testing::FillRandom(x.View(), rng, 2.0f);
        testing::FillRandom(w.View(), rng);
        testing::FillRandom(dy.View(), rng);
        Buffer dw32 = Host(DType::kF32, {h_n});
        testing::FillRandom(dw32.View(), rng);
        Buffer d_x = Upload(x), d_w = Upload(w), d_dy = Upload(dy), d_dw32 = Upload(dw32);

        Buffer y = Host(dt, {t_n, h_n}), rstd = Host(DType::kF32, {t_n});
        Buffer dx = Host(dt, {t_n, h_n}), dwp = Host(dt, {h_n});
        ASSERT_TRUE(RmsNormForward(cpu, x.View(), w.View(), eps, y.View(), rstd.View()).ok());
        ASSERT_TRUE(RmsNormBackward(cpu, dy.View(), x.View(), w.View(), rstd.View(), dx.View(),
                                    dw32.View(), true, Tensor())
                        .ok());
        ASSERT_TRUE(RmsNormBackward(cpu, dy.View(), x.View(), w.View(), rstd.View(), dx.View(),
                                    dwp.View(), false, Tensor())
                        .ok());

        Buffer d_y = Poisoned(dt, {t_n, h_n}), d_rstd = Poisoned(DType::kF32, {t_n});
        Buffer d_dx = Poisoned(dt, {t_n, h_n}), d_dwp = Poisoned(dt, {h_n});
        Buffer ws = Poisoned(DType::kU8, {RmsNormBackwardWorkspaceBytes(t_n, h_n)});
        ASSERT_TRUE(
            RmsNormForward(gpu, d_x.View(), d_w.View(), eps, d_y.View(), d_rstd.View()).ok());
        ASSERT_TRUE(RmsNormBackward(gpu, d_dy.View(), d_x.View(), d_w.View(), d_rstd.View(),
                                    d_dx.View(), d_dw32.View(), true, ws.View())
                        .ok());
        ASSERT_TRUE(RmsNormBackward(gpu, d_dy.View(), d_x.View(), d_w.View(), d_rstd.View(),
                                    d_dx.View(), d_dwp.View(), false, ws.View())
                        .ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ExpectClose(d_y.View(), y.View(), tol, "forward y");
        ExpectClose(d_rstd.View(), rstd.View(), dt == DType::kBF16 ? 1e-2 : 1e-5, "forward rstd");
        ExpectClose(d_dx.View(), dx.View(), tol, "backward dx");
        ExpectClose(d_dw32.View(), dw32.View(), dt == DType::kBF16 ? 1e-2 : 1e-5,
                    "backward dw f32 (+=)");
        ExpectClose(d_dwp.View(), dwp.View(), tol, "backward dw param (=)");

        // dx aliasing dy (and y aliasing x) gives the same results.
        Buffer d_inplace = Upload(dy), d_dw_scratch = Poisoned(DType::kF32, {h_n});
        ASSERT_TRUE(RmsNormBackward(gpu, d_inplace.View(), d_x.View(), d_w.View(), d_rstd.View(),
                                    d_inplace.View(), d_dw_scratch.View(), false, ws.View())
                        .ok());
        Buffer d_y_inplace = Upload(x);
        ASSERT_TRUE(RmsNormForward(gpu, d_y_inplace.View(), d_w.View(), eps, d_y_inplace.View(),
                                   d_rstd.View())
                        .ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ExpectClose(d_inplace.View(), dx.View(), tol, "backward dx in place");
        ExpectClose(d_y_inplace.View(), y.View(), tol, "forward y in place");

        // Determinism: a second overwrite run gives bit-identical dw.
        const std::vector<float> first = testing::ToFloatVector(d_dwp.View());
        ASSERT_TRUE(FillBytes(d_dwp.View(), 0xFF).ok());
        ASSERT_TRUE(RmsNormBackward(gpu, d_dy.View(), d_x.View(), d_w.View(), d_rstd.View(),
                                    d_dx.View(), d_dwp.View(), false, ws.View())
                        .ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> second = testing::ToFloatVector(d_dwp.View());
        EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(float)))
            << "dw differs between two identical runs";

        // accumulate_dx: dx += the gradient (the residual stream's), against the CPU's dx +=.
        Buffer acc = Host(dt, {t_n, h_n}), dw_cpu = Host(DType::kF32, {h_n});
        testing::FillRandom(acc.View(), rng);
        Buffer d_acc = Upload(acc);
        ASSERT_TRUE(RmsNormBackward(cpu, dy.View(), x.View(), w.View(), rstd.View(), acc.View(),
                                    dw_cpu.View(), false, Tensor(), /*accumulate_dx=*/true)
                        .ok());
        ASSERT_TRUE(RmsNormBackward(gpu, d_dy.View(), d_x.View(), d_w.View(), d_rstd.View(),
                                    d_acc.View(), d_dw_scratch.View(), false, ws.View(),
                                    /*accumulate_dx=*/true)
                        .ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ExpectClose(d_acc.View(), acc.View(), tol, "backward dx += (accumulate_dx)");
        EXPECT_FALSE(RmsNormBackward(gpu, d_dy.View(), d_x.View(), d_w.View(), d_rstd.View(),
                                     d_dy.View(), d_dw_scratch.View(), false, ws.View(),
                                     /*accumulate_dx=*/true)
                         .ok())
            << "accumulate_dx with dx aliasing dy must be rejected";
      }
    }
  }
}

TEST(RmsNormGpuTest, RejectsSmallWorkspace) {
  SY_REQUIRE_GPU();
  const Stream gpu{Device::Cuda(0), nullptr};
  Buffer x = Poisoned(DType::kBF16, {8, 64}), w = Poisoned(DType::kBF16, {64});
  Buffer r = Poisoned(DType::kF32, {8}), dw = Poisoned(DType::kF32, {64});
  Buffer ws = Poisoned(DType::kU8, {RmsNormBackwardWorkspaceBytes(8, 64) - 1});
  EXPECT_EQ(RmsNormBackward(gpu, x.View(), x.View(), w.View(), r.View(), x.View(), dw.View(), false,
                            ws.View())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace switchyard::kernels
