// CPU tests of AdamW and the gradient norm: hand-computed values for one step, a naive fp64
// PyTorch-style AdamW over several steps, bf16 param rounding, the norm and clip coefficient.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/optim/adamw.h"
#include "kernels/optim/grad_norm.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

Buffer Host(DType dt, int64_t n) { return Buffer::ForTensor(dt, {n}, Device::Cpu()).value(); }

Buffer HostFrom(DType dt, const std::vector<double>& v) {
  Buffer b = Host(dt, static_cast<int64_t>(v.size()));
  for (size_t i = 0; i < v.size(); ++i) StoreFromDouble(b.View(), i, v[i]);
  return b;
}

std::vector<double> Values(const Buffer& b) {
  std::vector<double> v(b.View().numel());
  for (size_t i = 0; i < v.size(); ++i) v[i] = LoadAsDouble(b.View(), i);
  return v;
}

// torch.optim.AdamW (single tensor, amsgrad off) written out step by step, in fp64.
struct NaiveAdamW {
  std::vector<double> p, m, v;
  void Step(const AdamWHyperParams& hp, const std::vector<double>& grad, double scale) {
    const double bc1 = 1.0 - std::pow(hp.beta1, hp.step);
    const double bc2 = 1.0 - std::pow(hp.beta2, hp.step);
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = grad[i] * scale;
      p[i] *= 1.0 - hp.lr * hp.weight_decay;
      m[i] += (g - m[i]) * (1.0 - hp.beta1);  // exp_avg.lerp_(grad, 1 - beta1)
      v[i] = v[i] * hp.beta2 + (1.0 - hp.beta2) * g * g;
      const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + hp.eps;
      p[i] -= hp.lr / bc1 * m[i] / denom;
    }
  }
};

TEST(AdamWTest, OneStepHandComputed) {
  // Step 1 from zero moments: m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps).
  AdamWHyperParams hp{0.1, 0.9, 0.999, 1e-8, 0.01, 1};
  Buffer master = HostFrom(DType::kF64, {1.0, -2.0, 0.5});
  Buffer grads = HostFrom(DType::kF64, {0.05, -0.1, 0.0});
  Buffer m = HostFrom(DType::kF64, {0, 0, 0}), v = HostFrom(DType::kF64, {0, 0, 0});
  Buffer p = Host(DType::kF64, 3);
  // grad_scale 2: g = {0.1, -0.2, 0}.
  ASSERT_TRUE(AdamW(Stream::Cpu(), hp, grads.View(), 2.0f, nullptr, master.View(), m.View(),
                    v.View(), p.View())
                  .ok());
  const std::vector<double> want = {1.0 * 0.999 - 0.1 * 0.1 / (0.1 + 1e-8),
                                    -2.0 * 0.999 + 0.1 * 0.2 / (0.2 + 1e-8), 0.5 * 0.999};
  const std::vector<double> got = Values(master), got_p = Values(p);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-14) << i;
    EXPECT_EQ(got_p[i], got[i]) << i;
  }
  EXPECT_NEAR(Values(m)[0], 0.1 * 0.1, 1e-16);
  EXPECT_NEAR(Values(v)[1], 0.001 * 0.04, 1e-18);
  std::printf("one step: master %.12f %.12f %.12f\n", got[0], got[1], got[2]);
}

TEST(AdamWTest, MatchesNaiveOverSeveralSteps) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal;
  const int64_t n = 257;
  for (DType dt : {DType::kF64, DType::kF32}) {
    NaiveAdamW ref;
    std::vector<double> init(n);
    for (double& x : init) x = normal(rng);
    ref.p = init;
    ref.m.assign(n, 0.0);
    ref.v.assign(n, 0.0);
    Buffer master = HostFrom(dt, init), m = HostFrom(dt, ref.m), v = HostFrom(dt, ref.v);
    Buffer p = Host(dt, n);
    Buffer scale = HostFrom(DType::kF32, {0.75});
    double max_err = 0;
    for (int64_t step = 1; step <= 6; ++step) {
      AdamWHyperParams hp{1e-3 * step, 0.9, 0.95, 1e-8, 0.1, step};
      std::vector<double> g(n);
      for (double& x : g) x = normal(rng) * 0.01;
      if (dt == DType::kF32) {
        for (double& x : g) x = static_cast<float>(x);
      }
      Buffer grads = HostFrom(dt, g);
      const Tensor s = scale.View();
      ASSERT_TRUE(AdamW(Stream::Cpu(), hp, grads.View(), 2.0f, &s, master.View(), m.View(),
                        v.View(), p.View())
                      .ok());
      ref.Step(hp, g, 2.0 * 0.75);
      const std::vector<double> got = Values(master);
      for (int64_t i = 0; i < n; ++i) {
        max_err = std::max(max_err, std::abs(got[i] - ref.p[i]) / (std::abs(ref.p[i]) + 1e-3));
      }
    }
    const double tol = dt == DType::kF64 ? 1e-12 : 1e-5;
    std::printf("AdamW %s N=%ld, 6 steps: max rel err vs naive fp64 %.3g (tol %.0e)\n",
                DTypeName(dt), static_cast<long>(n), max_err, tol);
    EXPECT_LT(max_err, tol);
  }
}

TEST(AdamWTest, Bf16ParamsAreTheRoundedMaster) {
  std::mt19937_64 rng(std::random_device{}());
  const int64_t n = 4099;
  Buffer master = Host(DType::kF32, n), m = Host(DType::kF32, n), v = Host(DType::kF32, n);
  Buffer grads = Host(DType::kBF16, n), p = Host(DType::kBF16, n);
  testing::FillRandom(master.View(), rng);
  testing::FillRandom(m.View(), rng, 0.01f);
  testing::FillRandom(v.View(), rng, 0.01f);
  for (int64_t i = 0; i < n; ++i) v.View().as<float>()[i] = std::abs(v.View().as<float>()[i]);
  testing::FillRandom(grads.View(), rng);
  ASSERT_TRUE(AdamW(Stream::Cpu(), AdamWHyperParams{1e-2, 0.9, 0.999, 1e-8, 0.01, 3}, grads.View(),
                    1.0f, nullptr, master.View(), m.View(), v.View(), p.View())
                  .ok());
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    mismatches += p.View().as<BF16>()[i].bits != BF16::FromFloat(master.View().as<float>()[i]).bits;
  }
  std::printf("bf16 params: %ld of %ld differ from bf16(master)\n", static_cast<long>(mismatches),
              static_cast<long>(n));
  EXPECT_EQ(mismatches, 0);
}

TEST(AdamWTest, RejectsBadArguments) {
  Buffer a = Host(DType::kF32, 4), b = Host(DType::kF32, 4), c = Host(DType::kF32, 4);
  Buffer g = Host(DType::kF32, 4), p = Host(DType::kBF16, 4), short_p = Host(DType::kBF16, 3);
  Buffer i32 = Host(DType::kI32, 4);
  const Stream cpu = Stream::Cpu();
  AdamWHyperParams hp;
  EXPECT_TRUE(AdamW(cpu, hp, g.View(), 1, nullptr, a.View(), b.View(), c.View(), p.View()).ok());
  hp.step = 0;
  EXPECT_EQ(AdamW(cpu, hp, g.View(), 1, nullptr, a.View(), b.View(), c.View(), p.View()).code(),
            absl::StatusCode::kInvalidArgument);
  hp.step = 1;
  EXPECT_EQ(
      AdamW(cpu, hp, g.View(), 1, nullptr, a.View(), b.View(), c.View(), short_p.View()).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AdamW(cpu, hp, i32.View(), 1, nullptr, a.View(), b.View(), c.View(), p.View()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AdamW(cpu, hp, g.View(), 1, nullptr, a.View(), p.View(), c.View(), p.View()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AdamW(cpu, hp, g.View(), 1, nullptr, a.View(), b.View(), c.View(), a.View()).code(),
            absl::StatusCode::kInvalidArgument);
  Buffer two_buf = Host(DType::kF32, 2);
  const Tensor bad_scale = two_buf.View();
  EXPECT_EQ(AdamW(cpu, hp, g.View(), 1, &bad_scale, a.View(), b.View(), c.View(), p.View()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GradNormTest, MatchesNaiveAndClips) {
  std::mt19937_64 rng(std::random_device{}());
  const Stream cpu = Stream::Cpu();
  Buffer sum_sq = Host(DType::kF32, 1), norm = Host(DType::kF32, 1), coef = Host(DType::kF32, 1);
  const Tensor none;
  double naive = 0;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Buffer g = Host(dt, 10007);
    testing::FillRandom(g.View(), rng);
    for (double x : Values(g)) naive += x * x;
    ASSERT_TRUE(GradSquaredNorm(cpu, g.View(), none, sum_sq.View(), dt != DType::kF32).ok());
  }
  ASSERT_TRUE(ClipCoefficient(cpu, sum_sq.View(), 1.0f, norm.View(), coef.View()).ok());
  const double got = norm.View().as<float>()[0];
  const double rel = std::abs(got - std::sqrt(naive)) / std::sqrt(naive);
  std::printf(
      "grad norm (f32 + bf16 buffers, accumulated): %.7g vs naive %.7g, rel err %.3g "
      "(tol 1e-6)\n",
      got, std::sqrt(naive), rel);
  EXPECT_LT(rel, 1e-6);
  EXPECT_FLOAT_EQ(coef.View().as<float>()[0], static_cast<float>(1.0 / (got + 1e-6)));

  sum_sq.View().as<float>()[0] = 25.0f;  // norm 5
  ASSERT_TRUE(ClipCoefficient(cpu, sum_sq.View(), 10.0f, norm.View(), coef.View()).ok());
  EXPECT_EQ(norm.View().as<float>()[0], 5.0f);
  EXPECT_EQ(coef.View().as<float>()[0], 1.0f);  // below max_norm: no clipping
  ASSERT_TRUE(ClipCoefficient(cpu, sum_sq.View(), 0.0f, norm.View(), coef.View()).ok());
  EXPECT_EQ(coef.View().as<float>()[0], 1.0f);  // clip_grad 0 disables clipping
  ASSERT_TRUE(ClipCoefficient(cpu, sum_sq.View(), 2.0f, norm.View(), coef.View()).ok());
  EXPECT_FLOAT_EQ(coef.View().as<float>()[0], 2.0f / (5.0f + 1e-6f));
}

TEST(GradNormTest, ClippedAdamWEqualsScaledGradients) {
  // AdamW reading the device coefficient == AdamW on gradients scaled by hand.
  std::mt19937_64 rng(std::random_device{}());
  const int64_t n = 513;
  const Stream cpu = Stream::Cpu();
  Buffer g = Host(DType::kF64, n), gs = Host(DType::kF64, n);
  testing::FillRandom(g.View(), rng);
  Buffer sum_sq = Host(DType::kF32, 1), norm = Host(DType::kF32, 1), coef = Host(DType::kF32, 1);
  ASSERT_TRUE(GradSquaredNorm(cpu, g.View(), Tensor(), sum_sq.View()).ok());
  ASSERT_TRUE(ClipCoefficient(cpu, sum_sq.View(), 1.0f, norm.View(), coef.View()).ok());
  const double c = coef.View().as<float>()[0];
  ASSERT_LT(c, 1.0);
  for (int64_t i = 0; i < n; ++i) StoreFromDouble(gs.View(), i, LoadAsDouble(g.View(), i) * c);
  Buffer m1 = Host(DType::kF64, n), v1 = Host(DType::kF64, n), w1 = Host(DType::kF64, n);
  Buffer m2 = Host(DType::kF64, n), v2 = Host(DType::kF64, n), w2 = Host(DType::kF64, n);
  Buffer p1 = Host(DType::kF64, n), p2 = Host(DType::kF64, n);
  testing::FillRandom(w1.View(), rng);
  ASSERT_TRUE(CopyTensor(w1.View(), w2.View()).ok());
  for (Buffer* b : {&m1, &v1, &m2, &v2}) ASSERT_TRUE(FillBytes(b->View(), 0).ok());
  AdamWHyperParams hp{1e-2, 0.9, 0.999, 1e-8, 0.0, 1};
  const Tensor coef_t = coef.View();
  for (int64_t step = 1; step <= 3; ++step) {
    hp.step = step;
    ASSERT_TRUE(
        AdamW(cpu, hp, g.View(), 1.0f, &coef_t, w1.View(), m1.View(), v1.View(), p1.View()).ok());
    ASSERT_TRUE(
        AdamW(cpu, hp, gs.View(), 1.0f, nullptr, w2.View(), m2.View(), v2.View(), p2.View()).ok());
  }
  const std::vector<double> a = Values(w1), b = Values(w2);
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(a[i], b[i], 1e-12) << i;
}

}  // namespace
}  // namespace switchyard::kernels
