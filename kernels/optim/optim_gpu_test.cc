// CUDA AdamW and gradient norm against the CPU reference: fresh random inputs and optimizer
// states, poisoned outputs, f32 tolerance 1e-5 (DESIGN.md) for the norm, master and moments, and
// exact bf16 rounding of the params (bits equal to bf16(master); equal to the CPU params wherever
// the CPU and GPU masters agree bit for bit).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/optim/adamw.h"
#include "kernels/optim/grad_norm.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

Buffer Host(DType dt, int64_t n) { return Buffer::ForTensor(dt, {n}, Device::Cpu()).value(); }

Buffer Upload(const Buffer& host) {
  Tensor h = host.View();
  Buffer d = Buffer::ForTensor(h.dtype, h.shape, Device::Cuda(0)).value();
  EXPECT_TRUE(CopyTensor(h, d.View()).ok());
  return d;
}

Buffer Download(const Buffer& dev) {
  Tensor d = dev.View();
  Buffer h = Buffer::ForTensor(d.dtype, d.shape, Device::Cpu()).value();
  EXPECT_TRUE(CopyTensor(d, h.View()).ok());
  return h;
}

Buffer Poisoned(DType dt, int64_t n) {
  Buffer d = Buffer::ForTensor(dt, {n}, Device::Cuda(0)).value();
  EXPECT_TRUE(FillBytes(d.View(), 0xFF).ok());
  return d;
}

void ExpectClose(const Tensor& gpu, const Tensor& cpu, double tol, const char* what) {
  const double err =
      testing::RelativeError(testing::ToFloatVector(gpu), testing::ToFloatVector(cpu));
  std::printf("  %s %s: rel err %.3g (tol %.0e)\n", what, gpu.DebugString().c_str(), err, tol);
  EXPECT_LT(err, tol) << what;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(OptimGpuTest, GradNormIsDeterministicAndMatchesCpu) {
  SY_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  const Stream gpu{Device::Cuda(0), nullptr};
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{10000003}}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      Buffer g = Host(dt, n);
      testing::FillRandom(g.View(), rng);
      Buffer sum_sq = Host(DType::kF32, 1);
      ASSERT_TRUE(GradSquaredNorm(Stream::Cpu(), g.View(), Tensor(), sum_sq.View()).ok());
      Buffer d_g = Upload(g), ws = Poisoned(DType::kF64, kGradNormWorkspace);
      Buffer d_a = Poisoned(DType::kF32, 1), d_b = Poisoned(DType::kF32, 1);
      ASSERT_TRUE(GradSquaredNorm(gpu, d_g.View(), ws.View(), d_a.View()).ok());
      ASSERT_TRUE(FillBytes(ws.View(), 0xFF).ok());
      ASSERT_TRUE(GradSquaredNorm(gpu, d_g.View(), ws.View(), d_b.View()).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::printf("N=%ld %s\n", static_cast<long>(n), DTypeName(dt));
      ExpectClose(d_a.View(), sum_sq.View(), 1e-5, "sum of squares");
      const float a = testing::ToFloatVector(d_a.View())[0];
      const float b = testing::ToFloatVector(d_b.View())[0];
      EXPECT_EQ(Bits(a), Bits(b)) << "two runs differ: " << a << " vs " << b;
    }
  }
}

TEST(OptimGpuTest, ClippedAdamWMatchesCpu) {
  SY_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  const Stream gpu{Device::Cuda(0), nullptr};
  const Stream cpu = Stream::Cpu();
  struct Case {
    int64_t n;
    DType grad, param;
  };
  for (Case c : {Case{1, DType::kF32, DType::kBF16}, Case{1000, DType::kF32, DType::kBF16},
                 Case{1000, DType::kBF16, DType::kF32}, Case{10000003, DType::kBF16, DType::kBF16},
                 Case{10000003, DType::kF32, DType::kBF16}}) {
    const int64_t n = c.n;
    std::printf("N=%ld grads %s params %s\n", static_cast<long>(n), DTypeName(c.grad),
                DTypeName(c.param));
    Buffer master = Host(DType::kF32, n), m = Host(DType::kF32, n), v = Host(DType::kF32, n);
    Buffer grads = Host(c.grad, n), params = Host(c.param, n);
    testing::FillRandom(master.View(), rng);
    testing::FillRandom(m.View(), rng, 0.01f);
    testing::FillRandom(v.View(), rng, 0.01f);
    for (int64_t i = 0; i < n; ++i) v.View().as<float>()[i] = std::abs(v.View().as<float>()[i]);
    testing::FillRandom(grads.View(), rng);
    Buffer d_master = Upload(master), d_m = Upload(m), d_v = Upload(v), d_grads = Upload(grads);
    Buffer d_params = Poisoned(c.param, n), ws = Poisoned(DType::kF64, kGradNormWorkspace);
    Buffer d_sum = Poisoned(DType::kF32, 1), d_norm = Poisoned(DType::kF32, 1);
    Buffer d_coef = Poisoned(DType::kF32, 1);
    Buffer sum = Host(DType::kF32, 1), norm = Host(DType::kF32, 1), coef = Host(DType::kF32, 1);
    const float max_norm = 0.5f * std::sqrt(static_cast<float>(n));  // clipping active
    const Tensor coef_t = coef.View(), d_coef_t = d_coef.View();
    for (int64_t step = 1; step <= 3; ++step) {
      const AdamWHyperParams hp{1e-3 * step, 0.9, 0.95, 1e-8, 0.1, step};
      ASSERT_TRUE(GradSquaredNorm(cpu, grads.View(), Tensor(), sum.View()).ok());
      ASSERT_TRUE(ClipCoefficient(cpu, sum.View(), max_norm, norm.View(), coef.View()).ok());
      ASSERT_TRUE(AdamW(cpu, hp, grads.View(), 1.0f, &coef_t, master.View(), m.View(), v.View(),
                        params.View())
                      .ok());
      ASSERT_TRUE(GradSquaredNorm(gpu, d_grads.View(), ws.View(), d_sum.View()).ok());
      ASSERT_TRUE(ClipCoefficient(gpu, d_sum.View(), max_norm, d_norm.View(), d_coef.View()).ok());
      ASSERT_TRUE(AdamW(gpu, hp, d_grads.View(), 1.0f, &d_coef_t, d_master.View(), d_m.View(),
                        d_v.View(), d_params.View())
                      .ok());
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::printf("  norm cpu %.7g gpu %.7g, coef cpu %.7g\n", norm.View().as<float>()[0],
                testing::ToFloatVector(d_norm.View())[0], coef.View().as<float>()[0]);
    ExpectClose(d_norm.View(), norm.View(), 1e-5, "norm");
    ExpectClose(d_coef.View(), coef.View(), 1e-5, "clip coef");
    ExpectClose(d_master.View(), master.View(), 1e-5, "master");
    ExpectClose(d_m.View(), m.View(), 1e-5, "exp_avg");
    ExpectClose(d_v.View(), v.View(), 1e-5, "exp_avg_sq");
    // bf16: a 1-ulp master difference may cross a rounding boundary; the bitwise checks below
    // are the strict ones.
    ExpectClose(d_params.View(), params.View(), c.param == DType::kBF16 ? 1e-2 : 1e-5, "params");

    Buffer g_master = Download(d_master), g_params = Download(d_params);
    const float* gm = g_master.View().as<float>();
    const float* cm = master.View().as<float>();
    int64_t same_master = 0, not_rounded = 0, differ_where_same = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double gp = LoadAsDouble(g_params.View(), i);
      const double rounded = c.param == DType::kBF16 ? BF16::FromFloat(gm[i]).ToFloat() : gm[i];
      not_rounded += Bits(static_cast<float>(gp)) != Bits(static_cast<float>(rounded));
      if (Bits(gm[i]) == Bits(cm[i])) {
        ++same_master;
        differ_where_same += Bits(static_cast<float>(gp)) !=
                             Bits(static_cast<float>(LoadAsDouble(params.View(), i)));
      }
    }
    std::printf(
        "  params != round(gpu master): %ld; masters bit-equal: %ld of %ld; params "
        "differing there: %ld\n",
        static_cast<long>(not_rounded), static_cast<long>(same_master), static_cast<long>(n),
        static_cast<long>(differ_where_same));
    EXPECT_EQ(not_rounded, 0);
    EXPECT_EQ(differ_where_same, 0);
  }
}

}  // namespace
}  // namespace switchyard::kernels
