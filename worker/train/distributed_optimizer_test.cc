// File: worker/train/distributed_optimizer_test.cc
//
// DistributedAdamW (ZeRO-1) against ReplicatedAdamW with REAL processes: each multi-rank test
// forks DP children (before any thread exists in the parent), each connects a GlooCommunicator on
// loopback through a FileKvStore in TEST_TMPDIR, runs 5 steps of both optimizers on the same
// master init and its own per-rank gradients (deterministic from a seed), and checks params and
// grad norms; it reports through its exit code.
//
// Tolerance: |a - b| <= 1e-6 * max(|a|, |b|, 0.5) on every parameter (0.5 = the init's std, a
// floor for parameters near zero), rel 1e-6 on the norm and the clip coefficient. Bitwise equality
// is not guaranteed: the two paths differ in float reduction order only (ReduceScatter sums in
// rank order, Gloo's ring AllReduce in ring order; the distributed norm adds dp per-shard f32
// partials, the replicated one sums the whole buffer in fp64 once), so an averaged gradient or
// the clip coefficient may differ by ~1e-7 relative. Adam's update is scale-free per element but
// mixes steps with different clip factors, so the update moves by ~1e-7 of its size; here updates
// reach ~0.3 (lr up to 5e-2 over the bias correction 1 - 0.9^t, times m/sqrt(v) of order 1), so a
// few 1e-8 absolute is expected (observed: <= 7e-8), several times below the bound. A real bug (a
// wrong shard, decay split, mean or clip) moves parameters by ~lr = 1e-2.
#include "worker/train/distributed_optimizer.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/optim/adamw.h"
#include "kernels/optim/grad_norm.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/kv_store.h"
#include "worker/comm/testing/forked_ranks.h"

namespace switchyard::train {
namespace {

constexpr int kSteps = 5;
constexpr double kRelTol = 1e-6;

Tensor View(std::vector<float>& v) {
  return Tensor(DType::kF32, {static_cast<int64_t>(v.size())}, Device::Cpu(), v.data());
}
Tensor Prefix(std::vector<float>& v, int64_t n) {
  return Tensor(DType::kF32, {n}, Device::Cpu(), v.data());
}

std::vector<float> RandomVector(int64_t n, uint64_t seed, float scale) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// This rank's gradients at `step` ([padded], zero padding beyond n).
std::vector<float> Grads(int64_t n, int64_t padded, int rank, int step) {
  std::vector<float> g = RandomVector(n, 1000003ull * step + 7919ull * rank + 17, 1.0f);
  g.resize(padded, 0.0f);
  return g;
}

// |a - b| <= rel * max(|a|, |b|, 0.5) (see the tolerance note at the top).
bool Close(double a, double b, double rel) {
  return std::fabs(a - b) <= rel * std::max({std::fabs(a), std::fabs(b), 0.5});
}

kernels::AdamWHyperParams Hp() {
  kernels::AdamWHyperParams hp;
  hp.beta1 = 0.9;
  hp.beta2 = 0.95;
  hp.eps = 1e-8;
  hp.weight_decay = 0.1;
  return hp;
}

// Clipping alternates between active (below the norm of the mean gradient, ~sqrt(n / dp)) and
// disabled, so both paths of the coefficient are exercised.
float ClipAt(int step, int64_t n) {
  return step % 2 == 1 ? 0.25f * std::sqrt(static_cast<float>(n)) / 4.0f : 0.0f;
}

// One rank: distributed vs replicated for kSteps steps.
int EquivalenceChild(const std::string& dir, int rank, int world, int64_t n, int64_t decay_end) {
  absl::StatusOr<std::unique_ptr<comm::FileKvStore>> store = comm::FileKvStore::Create(dir);
  SY_CHILD_OK(store.status());
  comm::GlooOptions options;
  options.timeout = absl::Seconds(20);
  absl::StatusOr<std::unique_ptr<comm::GlooCommunicator>> made = comm::GlooCommunicator::Create(
      std::shared_ptr<comm::KvStore>(std::move(*store)), rank, world, options, "dp");
  SY_CHILD_OK(made.status());
  comm::Communicator* dp = made->get();

  const int64_t padded = PaddedSize(n, world);
  SY_CHILD_CHECK(padded % world == 0 && padded >= n && padded - n < world);
  std::vector<float> master = RandomVector(n, 42, 0.5f);
  absl::StatusOr<std::unique_ptr<DistributedAdamW>> dist =
      DistributedAdamW::Create(dp, Device::Cpu(), n, decay_end, View(master), Hp());
  SY_CHILD_OK(dist.status());
  absl::StatusOr<std::unique_ptr<ReplicatedAdamW>> repl =
      ReplicatedAdamW::Create(dp, Device::Cpu(), n, decay_end, View(master), Hp());
  SY_CHILD_OK(repl.status());
  SY_CHILD_CHECK((*dist)->shard_size() * world == padded);

  std::vector<float> params_d(padded, -1.0f), params_r(n, -2.0f);
  double worst = 0, worst_norm = 0;
  float worst_d = 0, worst_r = 0;
  int clipped = 0;
  for (int step = 1; step <= kSteps; ++step) {
    std::vector<float> g = Grads(n, padded, rank, step);
    const double lr = 1e-2 * step;
    absl::StatusOr<OptimizerStepResult> rd =
        (*dist)->Step(Stream::Cpu(), View(g), View(params_d), lr, step, ClipAt(step, n));
    SY_CHILD_OK(rd.status());
    absl::StatusOr<OptimizerStepResult> rr =
        (*repl)->Step(Stream::Cpu(), Prefix(g, n), View(params_r), lr, step, ClipAt(step, n));
    SY_CHILD_OK(rr.status());
    SY_CHILD_CHECK(!rd->skipped && !rr->skipped);
    SY_CHILD_CHECK(Close(rd->grad_norm, rr->grad_norm, kRelTol));
    SY_CHILD_CHECK(Close(rd->clip_coef, rr->clip_coef, kRelTol));
    if (rd->clip_coef < 1.0f) ++clipped;
    worst_norm =
        std::max(worst_norm, std::fabs(double{rd->grad_norm} - rr->grad_norm) / rr->grad_norm);
    for (int64_t i = 0; i < n; ++i) {
      if (!Close(params_d[i], params_r[i], kRelTol)) {
        std::fprintf(stderr, "rank %d step %d: params[%lld] = %.9g (distributed) vs %.9g\n", rank,
                     step, static_cast<long long>(i), params_d[i], params_r[i]);
        return 1;
      }
      const double diff =
          double{std::fabs(params_d[i] - params_r[i])} / std::max(std::fabs(params_r[i]), 0.5f);
      if (diff > worst) {
        worst = diff;
        worst_d = params_d[i];
        worst_r = params_r[i];
      }
    }
    for (int64_t i = n; i < padded; ++i) SY_CHILD_CHECK(params_d[i] == 0.0f);
    // The step really moved the parameters (the check above is not vacuous).
    SY_CHILD_CHECK(std::fabs(params_r[0] - master[0]) > 1e-4);
  }
  SY_CHILD_CHECK(clipped >= 2);
  // Decay split inside the shard: the replicated master matches this rank's shard.
  const Tensor shard = (*dist)->master_shard();
  const Tensor full = (*repl)->master();
  for (int64_t i = 0; i < (*dist)->shard_size(); ++i) {
    const int64_t gi = (*dist)->shard_begin() + i;
    const float want = gi < n ? full.as<float>()[gi] : 0.0f;
    SY_CHILD_CHECK(Close(shard.as<float>()[i], want, kRelTol));
  }
  if (rank == 0) {
    std::printf(
        "dp=%d n=%lld padded=%lld shard=%lld decay_end=%lld: %d steps (%d clipped), max rel "
        "param diff %.3g (%.9g vs %.9g), max rel norm diff %.3g, tolerance %.0e\n",
        world, static_cast<long long>(n), static_cast<long long>(padded),
        static_cast<long long>((*dist)->shard_size()), static_cast<long long>(decay_end), kSteps,
        clipped, worst, worst_d, worst_r, worst_norm, kRelTol);
  }
  return 0;
}

void RunEquivalence(int world, int64_t n, int64_t decay_end) {
  const std::string dir = comm::testing::UniqueStoreDir(absl::StrCat("dp", world));
  std::vector<int> codes = comm::testing::RunProcesses(world, absl::Seconds(25), [&](int rank) {
    return EquivalenceChild(dir, rank, world, n, decay_end);
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// Uneven n (padding 1) and the decay boundary inside rank 1's shard [501, 1002).
TEST(DistributedAdamWTest, Dp2MatchesReplicated) { RunEquivalence(2, 1001, 700); }
// Uneven n (padding 3) and the decay boundary inside rank 2's shard [502, 753).
TEST(DistributedAdamWTest, Dp4MatchesReplicated) { RunEquivalence(4, 1001, 700); }
// Even n, boundary exactly on a shard edge (ranks 0-1 all decay, ranks 2-3 none).
TEST(DistributedAdamWTest, Dp4BoundaryOnShardEdge) { RunEquivalence(4, 1024, 512); }
// All decay / no decay at all.
TEST(DistributedAdamWTest, Dp4AllDecay) { RunEquivalence(4, 999, 999); }
TEST(DistributedAdamWTest, Dp2NoDecay) { RunEquivalence(2, 37, 0); }

// One rank: bit-identical to the trainer's path (norm + clip + two AdamW launches).
void SingleRankBitIdentical(DType param_dtype) {
  absl::StatusOr<std::unique_ptr<comm::SingleRankCommunicator>> comm =
      comm::SingleRankCommunicator::Create();
  ASSERT_TRUE(comm.ok()) << comm.status();
  const int64_t n = 777, split = 500;
  std::vector<float> master = RandomVector(n, 5, 0.5f);
  absl::StatusOr<std::unique_ptr<DistributedAdamW>> dist =
      DistributedAdamW::Create(comm->get(), Device::Cpu(), n, split, View(master), Hp());
  ASSERT_TRUE(dist.ok()) << dist.status();
  EXPECT_EQ((*dist)->padded_n(), n);

  // The plain path.
  std::vector<float> ref_master = master, m(n, 0.0f), v(n, 0.0f);
  std::vector<float> ws(2 * kernels::kGradNormWorkspace), sum_sq(1), norm(1), coef(1);
  const size_t esize = DTypeSize(param_dtype);
  std::vector<char> params_d(n * esize), params_r(n * esize);
  const Tensor pd(param_dtype, {n}, Device::Cpu(), params_d.data());
  const Tensor pr(param_dtype, {n}, Device::Cpu(), params_r.data());
  for (int step = 1; step <= kSteps; ++step) {
    std::vector<float> g = Grads(n, n, 0, step);
    const float clip = ClipAt(step, n);
    absl::StatusOr<OptimizerStepResult> rd =
        (*dist)->Step(Stream::Cpu(), View(g), pd, 1e-2, step, clip);
    ASSERT_TRUE(rd.ok()) << rd.status();

    const Stream s = Stream::Cpu();
    const Tensor wst(DType::kF64, {kernels::kGradNormWorkspace}, Device::Cpu(), ws.data());
    ASSERT_TRUE(kernels::GradSquaredNorm(s, View(g), wst, View(sum_sq)).ok());
    ASSERT_TRUE(kernels::ClipCoefficient(s, View(sum_sq), clip, View(norm), View(coef)).ok());
    EXPECT_EQ(rd->grad_norm, norm[0]);
    EXPECT_EQ(rd->clip_coef, coef[0]);
    const Tensor c = View(coef);
    for (int group = 0; group < 2; ++group) {
      const int64_t lo = group == 0 ? 0 : split, hi = group == 0 ? split : n;
      kernels::AdamWHyperParams hp = Hp();
      hp.lr = 1e-2;
      hp.step = step;
      hp.weight_decay = group == 0 ? hp.weight_decay : 0.0;
      auto sl = [&](std::vector<float>& x) {
        return Tensor(DType::kF32, {hi - lo}, Device::Cpu(), x.data() + lo);
      };
      ASSERT_TRUE(kernels::AdamW(
                      s, hp, sl(g), 1.0f, &c, sl(ref_master), sl(m), sl(v),
                      Tensor(param_dtype, {hi - lo}, Device::Cpu(), params_r.data() + lo * esize))
                      .ok());
    }
    ASSERT_EQ(std::memcmp(params_d.data(), params_r.data(), params_d.size()), 0) << "step " << step;
    ASSERT_EQ(std::memcmp((*dist)->master_shard().data, ref_master.data(), n * sizeof(float)), 0);
  }
  std::printf("single rank, %s params: %d steps bit-identical to the plain AdamW path\n",
              param_dtype == DType::kBF16 ? "bf16" : "f32", kSteps);
}

TEST(DistributedAdamWTest, SingleRankBitIdenticalF32) { SingleRankBitIdentical(DType::kF32); }
TEST(DistributedAdamWTest, SingleRankBitIdenticalBf16) { SingleRankBitIdentical(DType::kBF16); }

TEST(DistributedAdamWTest, RejectsBadArguments) {
  auto comm = comm::SingleRankCommunicator::Create();
  ASSERT_TRUE(comm.ok());
  std::vector<float> master(10, 0.0f), small(9, 0.0f);
  EXPECT_EQ(DistributedAdamW::Create(comm->get(), Device::Cpu(), 10, 11, View(master), Hp())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DistributedAdamW::Create(comm->get(), Device::Cpu(), 10, 5, View(small), Hp())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      DistributedAdamW::Create(nullptr, Device::Cpu(), 10, 5, View(master), Hp()).status().code(),
      absl::StatusCode::kInvalidArgument);
  auto dist = DistributedAdamW::Create(comm->get(), Device::Cpu(), 10, 5, View(master), Hp());
  ASSERT_TRUE(dist.ok());
  std::vector<float> g(9), p(10);
  absl::Status s = (*dist)->Step(Stream::Cpu(), View(g), View(p), 1e-3, 1, 1.0f).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("grads"), absl::string_view::npos) << s;
  std::vector<float> g10(10);
  s = (*dist)->Step(Stream::Cpu(), View(g10), View(p), 1e-3, 0, 1.0f).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(PaddedSize(1001, 4), 1004);
  EXPECT_EQ(PaddedSize(1024, 4), 1024);
  EXPECT_EQ(PaddedSize(1, 8), 8);
}

TEST(DistributedAdamWTest, NonFiniteNormSkips) {
  auto comm = comm::SingleRankCommunicator::Create();
  ASSERT_TRUE(comm.ok());
  std::vector<float> master = RandomVector(16, 3, 1.0f);
  auto dist = DistributedAdamW::Create(comm->get(), Device::Cpu(), 16, 8, View(master), Hp());
  ASSERT_TRUE(dist.ok());
  std::vector<float> g(16, 1.0f), p(16, 7.0f);
  g[3] = std::nanf("");
  absl::StatusOr<OptimizerStepResult> r =
      (*dist)->Step(Stream::Cpu(), View(g), View(p), 1e-3, 1, 1.0f);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->skipped);
  for (float x : p) EXPECT_EQ(x, 7.0f);
  EXPECT_EQ(std::memcmp((*dist)->master_shard().data, master.data(), 16 * sizeof(float)), 0);
}

}  // namespace
}  // namespace switchyard::train
