// CPU reference of the fused LM-head cross-entropy against a naive fp64 full-logit softmax
// cross-entropy (value, lse and both gradients), with chunk sizes that do not divide T, ignored
// targets, a finite-difference check in fp64 and argument validation; and the vocabulary-parallel
// mode at TP = 1, 2, 4 (ranks as threads joined by an in-process all-reduce) against the naive
// full-vocabulary cross-entropy.
#include "kernels/loss/cross_entropy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "kernels/loss/thread_all_reduce_testing.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

struct Naive {
  double loss = 0;
  int valid = 0;
  std::vector<double> lse, dh, dw;
};

// Full [T, V] logits in fp64; gradients of dloss * loss_sum.
Naive NaiveCrossEntropy(const std::vector<double>& h, const std::vector<double>& w,
                        const std::vector<int32_t>& tg, int64_t t_n, int64_t h_n, int64_t v_n,
                        double dloss) {
  Naive out;
  out.lse.resize(t_n);
  out.dh.assign(t_n * h_n, 0.0);
  out.dw.assign(v_n * h_n, 0.0);
  std::vector<double> z(t_n * v_n);
  for (int64_t t = 0; t < t_n; ++t)
    for (int64_t v = 0; v < v_n; ++v) {
      double s = 0;
      for (int64_t k = 0; k < h_n; ++k) s += h[t * h_n + k] * w[v * h_n + k];
      z[t * v_n + v] = s;
    }
  for (int64_t t = 0; t < t_n; ++t) {
    double m = -INFINITY;
    for (int64_t v = 0; v < v_n; ++v) m = std::max(m, z[t * v_n + v]);
    double s = 0;
    for (int64_t v = 0; v < v_n; ++v) s += std::exp(z[t * v_n + v] - m);
    out.lse[t] = m + std::log(s);
    if (tg[t] < 0) continue;
    out.loss += out.lse[t] - z[t * v_n + tg[t]];
    ++out.valid;
    for (int64_t v = 0; v < v_n; ++v) {
      const double g = dloss * (std::exp(z[t * v_n + v] - out.lse[t]) - (v == tg[t] ? 1 : 0));
      for (int64_t k = 0; k < h_n; ++k) {
        out.dh[t * h_n + k] += g * w[v * h_n + k];
        out.dw[v * h_n + k] += g * h[t * h_n + k];
      }
    }
  }
  return out;
}

double MaxRelDiff(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / std::max(den, 1e-300);
}

template <typename T>
std::vector<double> ToDouble(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

struct Case {
  int64_t t_n, h_n, v_n, chunk;
};

template <typename T>
void RunAgainstNaive(const Case& c, DType dt, double tol) {
  std::mt19937_64 rng(c.t_n * 1000 + c.chunk);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<T> h(c.t_n * c.h_n), w(c.v_n * c.h_n), dh(c.t_n * c.h_n, T(-7)), dw(c.v_n * c.h_n),
      lse(c.t_n, T(-7)), loss(1, T(-7));
  for (auto& x : h) x = static_cast<T>(normal(rng));
  for (auto& x : w) x = static_cast<T>(normal(rng) * 0.7);
  for (auto& x : dw) x = static_cast<T>(normal(rng));
  const std::vector<T> dw0 = dw;
  std::vector<int32_t> tg(c.t_n);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(c.v_n) - 1);
  for (int64_t t = 0; t < c.t_n; ++t) tg[t] = t % 4 == 1 ? kIgnoreTarget : pick(rng);
  std::vector<int32_t> valid(1, -5);

  auto plan = FusedLinearCrossEntropy::Create(Device::Cpu(), c.t_n + 3, c.h_n, c.v_n, c.chunk);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const Device cpu = Device::Cpu();
  Tensor th(dt, {c.t_n, c.h_n}, cpu, h.data()), tw(dt, {c.v_n, c.h_n}, cpu, w.data());
  Tensor ttg(DType::kI32, {c.t_n}, cpu, tg.data()), tlse(dt, {c.t_n}, cpu, lse.data());
  Tensor tloss(dt, {1}, cpu, loss.data()), tvalid(DType::kI32, {1}, cpu, valid.data());
  Tensor tdh(dt, {c.t_n, c.h_n}, cpu, dh.data()), tdw(dt, {c.v_n, c.h_n}, cpu, dw.data());
  absl::Status st = (*plan)->Forward(Stream::Cpu(), th, tw, ttg, tloss, tvalid, tlse);
  ASSERT_TRUE(st.ok()) << st;
  const int n_valid =
      static_cast<int>(std::count_if(tg.begin(), tg.end(), [](int32_t x) { return x >= 0; }));
  // The same float dloss (1 / num_valid) for the plan and the naive reference.
  const float dloss = 1.0f / static_cast<float>(std::max(1, n_valid));
  const Naive ref = NaiveCrossEntropy(ToDouble(h), ToDouble(w), tg, c.t_n, c.h_n, c.v_n, dloss);
  EXPECT_EQ(valid[0], ref.valid);
  st = (*plan)->Backward(Stream::Cpu(), th, tw, ttg, tlse, dloss, tdh, tdw);
  ASSERT_TRUE(st.ok()) << st;
  std::vector<double> dw_delta(dw.size());
  for (size_t i = 0; i < dw.size(); ++i)
    dw_delta[i] = static_cast<double>(dw[i]) - static_cast<double>(dw0[i]);
  const double loss_err = std::abs(loss[0] - ref.loss) / std::abs(ref.loss);
  const double lse_err = MaxRelDiff(ToDouble(lse), ref.lse);
  const double dh_err = MaxRelDiff(ToDouble(dh), ref.dh);
  const double dw_err = MaxRelDiff(dw_delta, ref.dw);
  std::printf(
      "T=%ld H=%ld V=%ld chunk=%ld %s: loss %.6f (naive %.6f) rel err %.2g, lse %.2g, dh %.2g, "
      "dw %.2g (tol %.0e)\n",
      c.t_n, c.h_n, c.v_n, c.chunk, DTypeName(dt), static_cast<double>(loss[0]), ref.loss, loss_err,
      lse_err, dh_err, dw_err, tol);
  EXPECT_LT(loss_err, tol);
  EXPECT_LT(lse_err, tol);
  EXPECT_LT(dh_err, tol);
  EXPECT_LT(dw_err, tol);
}

TEST(CrossEntropyCpuTest, MatchesNaiveFullLogitsF64) {
  for (Case c : {Case{13, 8, 37, 5}, Case{13, 8, 37, 13}, Case{13, 8, 37, 64}, Case{1, 3, 2, 1},
                 Case{20, 16, 101, 7}}) {
    RunAgainstNaive<double>(c, DType::kF64, 1e-12);
  }
}

TEST(CrossEntropyCpuTest, MatchesNaiveFullLogitsF32) {
  for (Case c : {Case{13, 8, 37, 5}, Case{31, 32, 257, 8}}) {
    RunAgainstNaive<float>(c, DType::kF32, 1e-5);
  }
}

TEST(CrossEntropyCpuTest, AllIgnoredGivesZeroLossAndGradients) {
  const int64_t t_n = 4, h_n = 3, v_n = 5;
  std::vector<float> h(t_n * h_n, 0.5f), w(v_n * h_n, 0.25f), dh(t_n * h_n, 9.0f),
      dw(v_n * h_n, 2.0f), lse(t_n), loss(1, 9.0f);
  std::vector<int32_t> tg(t_n, kIgnoreTarget), valid(1, 9);
  auto plan = FusedLinearCrossEntropy::Create(Device::Cpu(), t_n, h_n, v_n, 3).value();
  const Device cpu = Device::Cpu();
  Tensor th(DType::kF32, {t_n, h_n}, cpu, h.data()), tw(DType::kF32, {v_n, h_n}, cpu, w.data());
  Tensor ttg(DType::kI32, {t_n}, cpu, tg.data()), tlse(DType::kF32, {t_n}, cpu, lse.data());
  ASSERT_TRUE(plan->Forward(Stream::Cpu(), th, tw, ttg, Tensor(DType::kF32, {1}, cpu, loss.data()),
                            Tensor(DType::kI32, {1}, cpu, valid.data()), tlse)
                  .ok());
  EXPECT_EQ(loss[0], 0.0f);
  EXPECT_EQ(valid[0], 0);
  EXPECT_NEAR(lse[0], 0.375 + std::log(5.0), 1e-6);  // uniform logits 0.375: lse = z + log V
  ASSERT_TRUE(plan->Backward(Stream::Cpu(), th, tw, ttg, tlse, 1.0f,
                             Tensor(DType::kF32, {t_n, h_n}, cpu, dh.data()),
                             Tensor(DType::kF32, {v_n, h_n}, cpu, dw.data()))
                  .ok());
  for (float x : dh) EXPECT_EQ(x, 0.0f);
  for (float x : dw) EXPECT_EQ(x, 2.0f);
}

// ForwardBackward gives exactly what Forward then Backward give (the CPU reference runs both).
TEST(CrossEntropyCpuTest, ForwardBackwardEqualsForwardThenBackward) {
  const int64_t t_n = 7, h_n = 6, v_n = 13;
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> h(t_n * h_n), w(v_n * h_n), dw0(v_n * h_n);
  for (float& x : h) x = nd(rng);
  for (float& x : w) x = nd(rng);
  for (float& x : dw0) x = 0.1f * nd(rng);
  std::vector<int32_t> tg = {3, kIgnoreTarget, 0, 12, 5, 5, kIgnoreTarget};
  auto plan = FusedLinearCrossEntropy::Create(Device::Cpu(), t_n, h_n, v_n, 3).value();
  const Device cpu = Device::Cpu();
  Tensor th(DType::kF32, {t_n, h_n}, cpu, h.data()), tw(DType::kF32, {v_n, h_n}, cpu, w.data());
  Tensor ttg(DType::kI32, {t_n}, cpu, tg.data());
  struct Out {
    std::vector<float> lse, loss, dh, dw;
    std::vector<int32_t> valid;
  };
  Out a{std::vector<float>(t_n), {0}, std::vector<float>(t_n * h_n), dw0, {0}}, b = a;
  auto t = [&](std::vector<float>& v, std::vector<int64_t> shape) {
    return Tensor(DType::kF32, std::move(shape), cpu, v.data());
  };
  ASSERT_TRUE(plan->Forward(Stream::Cpu(), th, tw, ttg, t(a.loss, {1}),
                            Tensor(DType::kI32, {1}, cpu, a.valid.data()), t(a.lse, {t_n}))
                  .ok());
  ASSERT_TRUE(plan->Backward(Stream::Cpu(), th, tw, ttg, t(a.lse, {t_n}), 0.2f, t(a.dh, {t_n, h_n}),
                             t(a.dw, {v_n, h_n}))
                  .ok());
  ASSERT_TRUE(plan->ForwardBackward(Stream::Cpu(), th, tw, ttg, 0.2f, t(b.loss, {1}),
                                    Tensor(DType::kI32, {1}, cpu, b.valid.data()), t(b.lse, {t_n}),
                                    t(b.dh, {t_n, h_n}), t(b.dw, {v_n, h_n}))
                  .ok());
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.valid, b.valid);
  EXPECT_EQ(b.valid[0], 5);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_EQ(a.dh, b.dh);
  EXPECT_EQ(a.dw, b.dw);
  EXPECT_NE(b.dw, dw0);
  // Bad gradient output: named, nothing run.
  std::vector<float> small(3);
  absl::Status st = plan->ForwardBackward(Stream::Cpu(), th, tw, ttg, 0.2f, t(b.loss, {1}),
                                          Tensor(DType::kI32, {1}, cpu, b.valid.data()),
                                          t(b.lse, {t_n}), t(small, {3}), t(b.dw, {v_n, h_n}));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("ForwardBackward.dh"), std::string::npos) << st;
  std::printf("ForwardBackward = Forward + Backward on the CPU (loss %.6f over %d tokens); %s\n",
              b.loss[0], b.valid[0], std::string(st.message()).c_str());
}

TEST(CrossEntropyCpuTest, GradientsMatchFiniteDifferences) {
  const int64_t t_n = 5, h_n = 4, v_n = 11;
  std::mt19937_64 rng(11);
  std::vector<double> h(t_n * h_n), w(v_n * h_n), dh(t_n * h_n), dw(v_n * h_n, 0.0), lse(t_n),
      loss(1);
  const Device cpu = Device::Cpu();
  Tensor th(DType::kF64, {t_n, h_n}, cpu, h.data()), tw(DType::kF64, {v_n, h_n}, cpu, w.data());
  testing::FillRandom(th, rng);
  testing::FillRandom(tw, rng);
  std::vector<int32_t> tg = {3, kIgnoreTarget, 0, 10, 7}, valid(1);
  Tensor ttg(DType::kI32, {t_n}, cpu, tg.data()), tlse(DType::kF64, {t_n}, cpu, lse.data());
  Tensor tloss(DType::kF64, {1}, cpu, loss.data()), tvalid(DType::kI32, {1}, cpu, valid.data());
  auto plan = FusedLinearCrossEntropy::Create(cpu, t_n, h_n, v_n, 2).value();
  const float dloss = 0.25f;
  ASSERT_TRUE(plan->Forward(Stream::Cpu(), th, tw, ttg, tloss, tvalid, tlse).ok());
  ASSERT_TRUE(plan->Backward(Stream::Cpu(), th, tw, ttg, tlse, dloss,
                             Tensor(DType::kF64, {t_n, h_n}, cpu, dh.data()),
                             Tensor(DType::kF64, {v_n, h_n}, cpu, dw.data()))
                  .ok());
  auto objective = [&]() {
    EXPECT_TRUE(plan->Forward(Stream::Cpu(), th, tw, ttg, tloss, tvalid, tlse).ok());
    return dloss * loss[0];
  };
  const double eps = 1e-6;
  double worst = 0;
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad) {
    for (size_t i = 0; i < x.size(); ++i) {
      const double x0 = x[i];
      x[i] = x0 + eps;
      const double up = objective();
      x[i] = x0 - eps;
      const double down = objective();
      x[i] = x0;
      const double fd = (up - down) / (2 * eps);
      worst = std::max(worst, std::abs(fd - grad[i]));
      EXPECT_NEAR(fd, grad[i], 1e-7) << "element " << i;
    }
  };
  check(h, dh);
  check(w, dw);
  std::printf("finite differences (fp64, eps %.0e): max abs diff %.2g (tol 1e-7)\n", eps, worst);
  // The ignored token's hidden state gets no gradient.
  for (int64_t k = 0; k < h_n; ++k) EXPECT_EQ(dh[1 * h_n + k], 0.0);
}

TEST(CrossEntropyCpuTest, RejectsBadArguments) {
  EXPECT_EQ(FusedLinearCrossEntropy::Create(Device::Cpu(), 0, 4, 4, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  const int64_t t_n = 3, h_n = 2, v_n = 4;
  auto plan = FusedLinearCrossEntropy::Create(Device::Cpu(), t_n, h_n, v_n, 2).value();
  EXPECT_EQ(plan->chunk_tokens(), 2);
  std::vector<float> h(8 * h_n), w(v_n * h_n), lse(8), loss(1);
  std::vector<double> wd(v_n * h_n);
  std::vector<int32_t> tg = {0, 4, 1, 0, 0, 0, 0, 0}, valid(1);
  const Device cpu = Device::Cpu();
  Tensor th(DType::kF32, {t_n, h_n}, cpu, h.data()), tw(DType::kF32, {v_n, h_n}, cpu, w.data());
  Tensor tloss(DType::kF32, {1}, cpu, loss.data()), tvalid(DType::kI32, {1}, cpu, valid.data());
  Tensor tlse(DType::kF32, {t_n}, cpu, lse.data()), ttg(DType::kI32, {t_n}, cpu, tg.data());
  auto fwd = [&](const Tensor& a, const Tensor& b, const Tensor& t, const Tensor& l) {
    return plan->Forward(Stream::Cpu(), a, b, t, tloss, tvalid, l).code();
  };
  // targets[1] = 4 is out of range.
  EXPECT_EQ(fwd(th, tw, ttg, tlse), absl::StatusCode::kInvalidArgument);
  tg[1] = kIgnoreTarget;
  EXPECT_EQ(fwd(th, tw, ttg, tlse), absl::StatusCode::kOk);
  tg[1] = -2;
  EXPECT_EQ(fwd(th, tw, ttg, tlse), absl::StatusCode::kInvalidArgument);
  tg[1] = 1;
  // T above max_tokens, w of another dtype, wrong hidden size, lse of the wrong length.
  Tensor big(DType::kF32, {8, h_n}, cpu, h.data());
  EXPECT_EQ(fwd(big, tw, Tensor(DType::kI32, {8}, cpu, tg.data()),
                Tensor(DType::kF32, {8}, cpu, lse.data())),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fwd(th, Tensor(DType::kF64, {v_n, h_n}, cpu, wd.data()), ttg, tlse),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      fwd(Tensor(DType::kF32, {2, 3}, cpu, h.data()), tw, Tensor(DType::kI32, {2}, cpu, tg.data()),
          Tensor(DType::kF32, {2}, cpu, lse.data())),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fwd(th, tw, ttg, Tensor(DType::kF32, {2}, cpu, lse.data())),
            absl::StatusCode::kInvalidArgument);
  // dw of an unsupported dtype; a stream on another device than the plan's.
  std::vector<int32_t> bad_dw(v_n * h_n);
  std::vector<float> dh(t_n * h_n);
  EXPECT_EQ(plan->Backward(Stream::Cpu(), th, tw, ttg, tlse, 1.0f,
                           Tensor(DType::kF32, {t_n, h_n}, cpu, dh.data()),
                           Tensor(DType::kI32, {v_n, h_n}, cpu, bad_dw.data()))
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      plan->Forward(Stream{Device::Cuda(0), nullptr}, th, tw, ttg, tloss, tvalid, tlse).code(),
      absl::StatusCode::kInvalidArgument);
}

// Vocabulary-parallel CE at TP ranks (threads) vs the naive full-vocabulary reference: loss, lse
// (every rank), dh (the sum of the ranks' partial sums) and dw (each rank's rows), in f64 with
// chunks that do not divide T and ignored targets, through Forward and ForwardBackward.
void RunVocabParallel(int tp, int64_t t_n, int64_t h_n, int64_t v_n, int64_t chunk) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> h(t_n * h_n), w(v_n * h_n);
  for (auto& x : h) x = normal(rng);
  for (auto& x : w) x = normal(rng) * 0.7;
  std::vector<int32_t> tg(t_n);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(v_n) - 1);
  for (int64_t t = 0; t < t_n; ++t) tg[t] = t % 5 == 2 ? kIgnoreTarget : pick(rng);
  const int n_valid =
      static_cast<int>(std::count_if(tg.begin(), tg.end(), [](int32_t x) { return x >= 0; }));
  const float dloss = 1.0f / static_cast<float>(std::max(1, n_valid));
  const Naive ref = NaiveCrossEntropy(h, w, tg, t_n, h_n, v_n, dloss);

  const int64_t vl = v_n / tp;
  const Device cpu = Device::Cpu();
  constexpr double kPoison = 12345.0;
  struct Out {
    std::vector<double> loss, fb_loss, lse, fb_lse, dh, dw;
    std::vector<int32_t> valid, fb_valid;
    absl::Status st;
  };
  std::vector<Out> out(tp);
  loss_testing::ThreadAllReduce ar(tp);
  std::vector<std::thread> ranks;
  for (int r = 0; r < tp; ++r) {
    ranks.emplace_back([&, r] {
      Out& o = out[r];
      o.loss.assign(1, kPoison);
      o.fb_loss.assign(1, kPoison);
      o.lse.assign(t_n, kPoison);
      o.fb_lse.assign(t_n, kPoison);
      o.dh.assign(t_n * h_n, kPoison);
      o.dw.assign(vl * h_n, 0.0);  // an accumulator
      o.valid.assign(1, -5);
      o.fb_valid.assign(1, -5);
      auto plan = FusedLinearCrossEntropy::Create(cpu, t_n, h_n, vl, chunk);
      if (!plan.ok()) {
        o.st = plan.status();
        return;
      }
      std::vector<double> wr(w.begin() + r * vl * h_n, w.begin() + (r + 1) * vl * h_n);
      VocabShard shard;
      shard.start = r * vl;
      shard.vocab_size = v_n;
      shard.all_reduce = [&, r](const Tensor& t, bool max) { return ar.Run(r, t, max); };
      Tensor th(DType::kF64, {t_n, h_n}, cpu, h.data()), tw(DType::kF64, {vl, h_n}, cpu, wr.data());
      Tensor ttg(DType::kI32, {t_n}, cpu, tg.data());
      auto T1 = [&](std::vector<double>& v) { return Tensor(DType::kF64, {1}, cpu, v.data()); };
      auto TT = [&](std::vector<double>& v) { return Tensor(DType::kF64, {t_n}, cpu, v.data()); };
      o.st =
          (*plan)->VocabParallelForward(Stream::Cpu(), th, tw, ttg, shard, T1(o.loss),
                                        Tensor(DType::kI32, {1}, cpu, o.valid.data()), TT(o.lse));
      if (!o.st.ok()) return;
      o.st = (*plan)->VocabParallelForwardBackward(
          Stream::Cpu(), th, tw, ttg, shard, dloss, T1(o.fb_loss),
          Tensor(DType::kI32, {1}, cpu, o.fb_valid.data()), TT(o.fb_lse),
          Tensor(DType::kF64, {t_n, h_n}, cpu, o.dh.data()),
          Tensor(DType::kF64, {vl, h_n}, cpu, o.dw.data()));
    });
  }
  for (auto& t : ranks) t.join();
  std::vector<double> dh_sum(t_n * h_n, 0.0), dw_all;
  for (int r = 0; r < tp; ++r) {
    const Out& o = out[r];
    ASSERT_TRUE(o.st.ok()) << "rank " << r << ": " << o.st;
    EXPECT_EQ(o.valid[0], ref.valid);
    EXPECT_EQ(o.fb_valid[0], ref.valid);
    // Every rank sees the whole-vocabulary loss and lse.
    EXPECT_NEAR(o.loss[0], ref.loss, 1e-10 * std::abs(ref.loss)) << "rank " << r;
    EXPECT_EQ(o.fb_loss[0], o.loss[0]);
    EXPECT_LT(MaxRelDiff(o.lse, ref.lse), 1e-12) << "rank " << r;
    EXPECT_EQ(o.fb_lse, o.lse);
    for (size_t i = 0; i < dh_sum.size(); ++i) dh_sum[i] += o.dh[i];
    dw_all.insert(dw_all.end(), o.dw.begin(), o.dw.end());
  }
  const double dh_err = MaxRelDiff(dh_sum, ref.dh), dw_err = MaxRelDiff(dw_all, ref.dw);
  std::printf(
      "vocab-parallel TP=%d T=%ld H=%ld V=%ld chunk=%ld: loss %.12f (naive %.12f), dh %.2g, "
      "dw %.2g (tol 1e-10)\n",
      tp, t_n, h_n, v_n, chunk, out[0].loss[0], ref.loss, dh_err, dw_err);
  EXPECT_LT(dh_err, 1e-10);
  EXPECT_LT(dw_err, 1e-10);
}

TEST(CrossEntropyCpuTest, VocabParallelMatchesFullVocabulary) {
  RunVocabParallel(1, 13, 6, 20, 4);
  RunVocabParallel(2, 13, 6, 20, 4);
  RunVocabParallel(4, 17, 8, 36, 5);
  RunVocabParallel(2, 9, 5, 64, 64);  // one chunk
}

TEST(CrossEntropyCpuTest, VocabParallelRejectsBadShards) {
  const int64_t t_n = 3, h_n = 2, vl = 4;
  auto plan = FusedLinearCrossEntropy::Create(Device::Cpu(), t_n, h_n, vl, 2).value();
  std::vector<double> h(t_n * h_n), w(vl * h_n), lse(t_n), loss(1);
  std::vector<int32_t> tg = {0, 7, 1}, valid(1);
  const Device cpu = Device::Cpu();
  Tensor th(DType::kF64, {t_n, h_n}, cpu, h.data()), tw(DType::kF64, {vl, h_n}, cpu, w.data());
  Tensor ttg(DType::kI32, {t_n}, cpu, tg.data()), tlse(DType::kF64, {t_n}, cpu, lse.data());
  Tensor tloss(DType::kF64, {1}, cpu, loss.data()), tvalid(DType::kI32, {1}, cpu, valid.data());
  VocabShard shard{4, 8, [](const Tensor&, bool) { return absl::OkStatus(); }};
  auto fwd = [&] {
    return plan->VocabParallelForward(Stream::Cpu(), th, tw, ttg, shard, tloss, tvalid, tlse);
  };
  EXPECT_EQ(fwd().code(), absl::StatusCode::kOk);  // target 7 is in the whole vocabulary
  tg[1] = 8;
  EXPECT_EQ(fwd().code(), absl::StatusCode::kInvalidArgument);  // outside [0, 8)
  tg[1] = 7;
  shard.start = 5;  // [5, 9) does not fit in [0, 8)
  EXPECT_EQ(fwd().code(), absl::StatusCode::kInvalidArgument);
  shard.start = 4;
  shard.all_reduce = nullptr;
  EXPECT_EQ(fwd().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace switchyard::kernels
