// The QK-norm + RoPE op on the CPU: the forward against the formula written out here (norm, then
// rotation by the token's position), the backward against central differences of
// sum(out_q · Gq) + sum(out_k · Gk) in f64 (inputs and weights), and bad arguments refused with
// the field named. The CUDA paths are checked against this one in qk_norm_rope_gpu_test.
#include "kernels/attention/qk_norm_rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

struct Host {
  Buffer pre, w, rstd, out;
};

Host MakeHost(int64_t t_n, int64_t heads, int64_t d, std::mt19937_64& rng) {
  Host h;
  h.pre = Buffer::ForTensor(DType::kF64, {t_n, heads, d}, Device::Cpu()).value();
  h.w = Buffer::ForTensor(DType::kF64, {d}, Device::Cpu()).value();
  h.rstd = Buffer::ForTensor(DType::kF64, {t_n * heads}, Device::Cpu()).value();
  h.out = Buffer::ForTensor(DType::kF64, {t_n, heads, d}, Device::Cpu()).value();
  testing::FillRandom(h.pre.View(), rng);
  testing::FillRandom(h.w.View(), rng);
  return h;
}

QkNormRopeSide Fwd(const Host& h) {
  return {h.pre.View(), h.w.View(), h.out.View(), h.rstd.View()};
}

TEST(QkNormRopeTest, ForwardIsTheNormThenTheRotationAtTheTokensPosition) {
  std::mt19937_64 rng(7);
  const int64_t t_n = 12, s_len = 6, d = 8, half = d / 2;
  const float eps = 1e-5f, base = 100.0f;
  const RopeCp cp{2, 1};  // local token i of rank 1 sits at CpGlobalPosition(i, 6, 2, 1)
  Host q = MakeHost(t_n, 3, d, rng), k = MakeHost(t_n, 1, d, rng);
  ASSERT_TRUE(QkNormRopeForward(Stream::Cpu(), Fwd(q), Fwd(k), eps, s_len, base, cp).ok());
  for (const Host* h : {&q, &k}) {
    const int64_t heads = h->pre.View().dim(1);
    const double* x = h->pre.View().as<double>();
    const double* w = h->w.View().as<double>();
    const double* out = h->out.View().as<double>();
    for (int64_t t = 0; t < t_n; ++t) {
      const double pos = static_cast<double>(CpGlobalPosition(t % s_len, s_len, cp.size, cp.rank));
      for (int64_t hd = 0; hd < heads; ++hd) {
        const double* xr = x + (t * heads + hd) * d;
        double ss = 0;
        for (int64_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
        const double r = 1.0 / std::sqrt(ss / d + eps);
        EXPECT_NEAR(h->rstd.View().as<double>()[t * heads + hd], r, 1e-12 * r);
        for (int64_t i = 0; i < half; ++i) {
          const double inv = 1.0 / std::pow(static_cast<double>(base), 2.0 * i / d);
          const double a = static_cast<float>(static_cast<float>(pos) * static_cast<float>(inv));
          const double ya = xr[i] * r * w[i], yb = xr[half + i] * r * w[half + i];
          const double* o = out + (t * heads + hd) * d;
          EXPECT_NEAR(o[i], ya * std::cos(a) - yb * std::sin(a), 1e-6)
              << t << " " << hd << " " << i;
          EXPECT_NEAR(o[half + i], yb * std::cos(a) + ya * std::sin(a), 1e-6);
        }
      }
    }
  }
}

// sum(out_q · gq) + sum(out_k · gk) at the current inputs.
double Objective(Host& q, Host& k, const std::vector<double>& gq, const std::vector<double>& gk,
                 float eps, int64_t s_len, float base) {
  EXPECT_TRUE(QkNormRopeForward(Stream::Cpu(), Fwd(q), Fwd(k), eps, s_len, base).ok());
  double v = 0;
  for (size_t i = 0; i < gq.size(); ++i) v += q.out.View().as<double>()[i] * gq[i];
  for (size_t i = 0; i < gk.size(); ++i) v += k.out.View().as<double>()[i] * gk[i];
  return v;
}

TEST(QkNormRopeTest, BackwardMatchesCentralDifferences) {
  std::mt19937_64 rng(11);
  const int64_t t_n = 5, s_len = 5, d = 6;
  const float eps = 1e-5f, base = 50.0f;
  Host q = MakeHost(t_n, 2, d, rng), k = MakeHost(t_n, 1, d, rng);
  std::normal_distribution<double> nd;
  std::vector<double> gq(t_n * 2 * d), gk(t_n * d);
  for (double& v : gq) v = nd(rng);
  for (double& v : gk) v = nd(rng);
  ASSERT_TRUE(QkNormRopeForward(Stream::Cpu(), Fwd(q), Fwd(k), eps, s_len, base).ok());
  Buffer dq = Buffer::ForTensor(DType::kF64, {t_n, 2, d}, Device::Cpu()).value();
  Buffer dk = Buffer::ForTensor(DType::kF64, {t_n, 1, d}, Device::Cpu()).value();
  std::copy(gq.begin(), gq.end(), dq.View().as<double>());
  std::copy(gk.begin(), gk.end(), dk.View().as<double>());
  Buffer dwq = Buffer::ForTensor(DType::kF64, {d}, Device::Cpu()).value();
  Buffer dwk = Buffer::ForTensor(DType::kF64, {d}, Device::Cpu()).value();
  for (int64_t i = 0; i < d; ++i) dwq.View().as<double>()[i] = dwk.View().as<double>()[i] = 0.5;
  ASSERT_TRUE(QkNormRopeBackward(Stream::Cpu(),
                                 {q.pre.View(), q.w.View(), q.rstd.View(), dq.View(), dwq.View()},
                                 {k.pre.View(), k.w.View(), k.rstd.View(), dk.View(), dwk.View()},
                                 s_len, base, Tensor())
                  .ok());
  const double h = 1e-6;
  auto check = [&](double* p, double analytic, const std::string& what) {
    const double keep = *p;
    *p = keep + h;
    const double up = Objective(q, k, gq, gk, eps, s_len, base);
    *p = keep - h;
    const double down = Objective(q, k, gq, gk, eps, s_len, base);
    *p = keep;
    EXPECT_NEAR(analytic, (up - down) / (2 * h), 1e-6 * (1 + std::abs(analytic))) << what;
  };
  for (int64_t i = 0; i < t_n * 2 * d; ++i) {
    check(q.pre.View().as<double>() + i, dq.View().as<double>()[i], "q.pre " + std::to_string(i));
  }
  for (int64_t i = 0; i < t_n * d; ++i) {
    check(k.pre.View().as<double>() + i, dk.View().as<double>()[i], "k.pre " + std::to_string(i));
  }
  for (int64_t i = 0; i < d; ++i) {  // dw accumulated onto its 0.5
    check(q.w.View().as<double>() + i, dwq.View().as<double>()[i] - 0.5,
          "q.w " + std::to_string(i));
    check(k.w.View().as<double>() + i, dwk.View().as<double>()[i] - 0.5,
          "k.w " + std::to_string(i));
  }
}

TEST(QkNormRopeTest, BadArgumentsAreRefusedNamingTheField) {
  std::mt19937_64 rng(3);
  Host q = MakeHost(4, 2, 8, rng), k = MakeHost(4, 1, 8, rng), k_d6 = MakeHost(4, 1, 6, rng);
  Buffer w7 = Buffer::ForTensor(DType::kF64, {7}, Device::Cpu()).value();
  Buffer rstd3 = Buffer::ForTensor(DType::kF64, {3}, Device::Cpu()).value();
  const Stream cpu = Stream::Cpu();
  auto expect_error = [](const absl::Status& st, const std::string& needle) {
    EXPECT_FALSE(st.ok()) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st;
  };
  expect_error(QkNormRopeForward(cpu, Fwd(q), Fwd(k_d6), 1e-5f, 4, 1e4f), "k.pre must have");
  expect_error(QkNormRopeForward(cpu, {q.pre.View(), w7.View(), q.out.View(), q.rstd.View()},
                                 Fwd(k), 1e-5f, 4, 1e4f),
               "q.w must be [8]");
  expect_error(
      QkNormRopeForward(cpu, Fwd(q), {k.pre.View(), k.w.View(), k.out.View(), rstd3.View()}, 1e-5f,
                        4, 1e4f),
      "k.rstd must be [T * heads = 4]");
  expect_error(QkNormRopeForward(cpu, {q.pre.View(), q.w.View(), k.out.View(), q.rstd.View()},
                                 Fwd(k), 1e-5f, 4, 1e4f),
               "q.out must match pre");
  expect_error(QkNormRopeForward(cpu, Fwd(q), Fwd(k), 0.0f, 4, 1e4f), "eps must be");
  expect_error(QkNormRopeForward(cpu, Fwd(q), Fwd(k), 1e-5f, 0, 1e4f), "seq_len (0)");
  expect_error(QkNormRopeForward(cpu, Fwd(q), Fwd(k), 1e-5f, 3, 1e4f, RopeCp{2, 0}),
               "must be even with cp.size");
  Buffer dw_f32 = Buffer::ForTensor(DType::kF32, {8}, Device::Cpu()).value();
  Buffer dw_f64 = Buffer::ForTensor(DType::kF64, {8}, Device::Cpu()).value();
  expect_error(
      QkNormRopeBackward(cpu, {q.pre.View(), q.w.View(), q.rstd.View(), q.out.View(), w7.View()},
                         {k.pre.View(), k.w.View(), k.rstd.View(), k.out.View(), dw_f64.View()}, 4,
                         1e4f, Tensor()),
      "q.dw must be [8]");
  expect_error(QkNormRopeBackward(
                   cpu, {q.pre.View(), q.w.View(), q.rstd.View(), q.out.View(), dw_f32.View()},
                   {k.pre.View(), k.w.View(), k.rstd.View(), k.out.View(), dw_f64.View()}, 4, 1e4f,
                   Tensor()),
               "must share a dtype");
  expect_error(QkNormRopeBackward(
                   cpu, {q.pre.View(), q.w.View(), q.rstd.View(), q.out.View(), dw_f64.View()},
                   {k.pre.View(), k.w.View(), k.rstd.View(), k.out.View(), dw_f64.View()}, 4, 1e4f,
                   Tensor()),
               "q.dw and k.dw must be different buffers");
}

TEST(QkNormRopeTest, WorkspaceCoversTheFusedAndTheComposedPath) {
  // Fused: 2 · min(T, 1024) · D floats; composed: the norm's min(T·heads, 256) · D floats.
  EXPECT_EQ(QkNormRopeBackwardWorkspaceBytes(8192, 12, 4, 128), 2 * 1024 * 128 * 4);
  EXPECT_EQ(QkNormRopeBackwardWorkspaceBytes(10, 12, 4, 128), 120 * 128 * 4);
  EXPECT_EQ(QkNormRopeBackwardWorkspaceBytes(3, 1, 1, 64), 2 * 3 * 64 * 4);
}

}  // namespace
}  // namespace switchyard::kernels
