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
#include "common/model/parallel_state.h"
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

// ---- Dense + expert instances with one global norm (megatron_moe.md §2.4, §5) ----
//
// W = 4, EP = 2 (TP = CP = PP = ETP = 1): dense DP x CP = 4 (kDataContext), expert EDP = 2
// (kExpertData, {0, 2} and {1, 3}), EP groups {0, 1} and {2, 3}; all from ParallelLayout and made
// with GlooCommunicator::CreateSubgroup. Each EP rank holds its own experts (ne elements, its own
// init); every rank has its own dense and expert gradients. Per step the ranks AllGather all
// gradients over the world and each computes the single-process reference on the CPU:
//   dense  g = (sum over the 4 ranks) * 1/4,
//   expert g[ep] = (sum over the 2 ranks of EDP group ep) * 1/4   (1/size(DP x CP), not 1/EDP),
//   total_sq = |g_dense|^2 + sum_ep |g[ep]|^2 (fp64, rounded once), ClipCoefficient, then the
//   plain kernels::AdamW launches (split at the decay boundaries) over the whole buffers.
// Tolerance: rel 1e-6 (floor 0.5, as above) on params, squared norms, the norm and the clip
// coefficient. The differences are float reduction order only: the dense 4-term sums may be
// added in another order by Gloo's ReduceScatter (a few ulp), the expert 2-term sums are exact
// (fp32 addition is commutative), and the distributed squared norms add f32 per-shard partials
// (each rounded from fp64) where the reference rounds one fp64 sum: ~1e-7 relative; Adam then
// moves each parameter by ~1e-7 of its update (observed: norm 1.1e-7, params equal). A wrong scale
// (1/EDP) doubles the expert norm (caught by the norm checks: tried); a wrong group or a missing EP
// sum changes the clip coefficient.
constexpr int64_t kDenseN = 1001, kDenseDecay = 700;   // padded 1004 over 4, boundary in shard 2
constexpr int64_t kExpertN = 333, kExpertDecay = 200;  // padded 334 over 2, boundary in shard 1

std::vector<float> ExpertGrads(int64_t padded, int rank, int step) {
  std::vector<float> g = RandomVector(kExpertN, 2000003ull * step + 104729ull * rank + 5, 1.0f);
  g.resize(padded, 0.0f);
  return g;
}

// Plain AdamW over a whole buffer, two launches split at decay_end.
bool RefAdamW(std::vector<float>& g, std::vector<float>& coef, int64_t decay_end,
              std::vector<float>& master, std::vector<float>& m, std::vector<float>& v,
              std::vector<float>& params, double lr, int step) {
  const int64_t n = static_cast<int64_t>(master.size());
  const Tensor c = View(coef);
  for (int group = 0; group < 2; ++group) {
    const int64_t lo = group == 0 ? 0 : decay_end, hi = group == 0 ? decay_end : n;
    if (hi == lo) continue;
    kernels::AdamWHyperParams hp = Hp();
    hp.lr = lr;
    hp.step = step;
    hp.weight_decay = group == 0 ? hp.weight_decay : 0.0;
    auto sl = [&](std::vector<float>& x) {
      return Tensor(DType::kF32, {hi - lo}, Device::Cpu(), x.data() + lo);
    };
    if (!kernels::AdamW(Stream::Cpu(), hp, sl(g), 1.0f, &c, sl(master), sl(m), sl(v), sl(params))
             .ok()) {
      return false;
    }
  }
  return true;
}

int DenseExpertChild(const std::string& dir, int rank) {
  constexpr int kWorld = 4;
  ParallelDims dims;
  dims.world_size = kWorld;
  dims.expert_model_parallel_size = 2;
  absl::StatusOr<ParallelLayout> layout = ParallelLayout::Create(dims);
  SY_CHILD_OK(layout.status());
  SY_CHILD_CHECK(layout->dp() * layout->cp() == 4 && layout->edp() == 2 && layout->ep() == 2);
  comm::GlooOptions options;
  options.timeout = absl::Seconds(15);
  std::shared_ptr<comm::KvStore> store = comm::testing::OpenFileStore(dir);
  SY_CHILD_CHECK(store != nullptr);
  absl::StatusOr<std::unique_ptr<comm::GlooCommunicator>> world =
      comm::GlooCommunicator::Create(store, rank, kWorld, options, "world");
  SY_CHILD_OK(world.status());
  auto dense_group =
      (*world)->CreateSubgroup(layout->Group(ParallelGroup::kDataContext, rank), "dpcp");
  SY_CHILD_OK(dense_group.status());
  auto edp_group = (*world)->CreateSubgroup(layout->Group(ParallelGroup::kExpertData, rank), "edp");
  SY_CHILD_OK(edp_group.status());
  auto ep_group = (*world)->CreateSubgroup(layout->Group(ParallelGroup::kExpert, rank), "ep");
  SY_CHILD_OK(ep_group.status());
  SY_CHILD_CHECK((*dense_group)->size() == 4 && (*edp_group)->size() == 2);
  const int my_ep = layout->ExpertCoordOf(rank).ep;

  const int64_t pd = PaddedSize(kDenseN, 4), pe = PaddedSize(kExpertN, 2);
  std::vector<float> dense_init = RandomVector(kDenseN, 42, 0.5f);
  std::vector<float> expert_init[2] = {RandomVector(kExpertN, 100, 0.5f),
                                       RandomVector(kExpertN, 101, 0.5f)};
  const float scale = 1.0f / static_cast<float>(layout->dp() * layout->cp());
  auto dense = DistributedAdamW::Create(dense_group->get(), Device::Cpu(), kDenseN, kDenseDecay,
                                        View(dense_init), Hp());
  SY_CHILD_OK(dense.status());
  auto expert = DistributedAdamW::Create(edp_group->get(), Device::Cpu(), kExpertN, kExpertDecay,
                                         View(expert_init[my_ep]), Hp(), scale);
  SY_CHILD_OK(expert.status());
  SY_CHILD_CHECK((*dense)->grad_scale() == 0.25f && (*expert)->grad_scale() == 0.25f);

  // The reference state (dense, and this rank's EP experts).
  std::vector<float> rd_master = dense_init, rd_m(kDenseN, 0.0f), rd_v(kDenseN, 0.0f);
  std::vector<float> re_master = expert_init[my_ep], re_m(kExpertN, 0.0f), re_v(kExpertN, 0.0f);
  std::vector<float> rd_params(kDenseN), re_params(kExpertN);
  std::vector<float> params_d(pd, -1.0f), params_e(pe, -1.0f);
  double worst = 0, worst_norm = 0;
  int clipped = 0;
  for (int step = 1; step <= kSteps; ++step) {
    std::vector<float> gd = Grads(kDenseN, pd, rank, step), ge = ExpertGrads(pe, rank, step);
    const double lr = 1e-2 * step;
    const float clip = step % 2 == 1 ? 5.0f : 0.0f;  // the total norm is ~18

    absl::StatusOr<float> sq_d = (*dense)->PrepareStep(Stream::Cpu(), View(gd));
    SY_CHILD_OK(sq_d.status());
    absl::StatusOr<float> sq_e = (*expert)->PrepareStep(Stream::Cpu(), View(ge));
    SY_CHILD_OK(sq_e.status());
    std::vector<float> sq_e_all = {*sq_e};  // + the other EP ranks' experts
    SY_CHILD_OK((*ep_group)->AllReduce(View(sq_e_all), View(sq_e_all), comm::ReduceOp::kSum));
    const float total = *sq_d + sq_e_all[0];
    auto rd = (*dense)->FinishStep(Stream::Cpu(), View(params_d), total, lr, step, clip);
    SY_CHILD_OK(rd.status());
    auto re = (*expert)->FinishStep(Stream::Cpu(), View(params_e), total, lr, step, clip);
    SY_CHILD_OK(re.status());
    SY_CHILD_CHECK(!rd->skipped && !re->skipped);

    // The single-process reference from every rank's gradients.
    std::vector<float> all_d(kWorld * pd), all_e(kWorld * pe);
    SY_CHILD_OK((*world)->AllGather(View(gd), View(all_d)));
    SY_CHILD_OK((*world)->AllGather(View(ge), View(all_e)));
    std::vector<float> ref_gd(kDenseN, 0.0f), ref_ge[2];
    for (int e = 0; e < 2; ++e) ref_ge[e].assign(kExpertN, 0.0f);
    for (int r = 0; r < kWorld; ++r) {
      const int e = layout->ExpertCoordOf(r).ep;
      for (int64_t i = 0; i < kDenseN; ++i) ref_gd[i] += all_d[r * pd + i];
      for (int64_t i = 0; i < kExpertN; ++i) ref_ge[e][i] += all_e[r * pe + i];
    }
    double want_d = 0, want_e = 0;
    for (float& x : ref_gd) {
      x *= 0.25f;
      want_d += double{x} * x;
    }
    for (int e = 0; e < 2; ++e) {
      for (float& x : ref_ge[e]) {
        x *= 0.25f;
        want_e += double{x} * x;
      }
    }
    std::vector<float> sum_sq = {static_cast<float>(want_d + want_e)}, norm(1), coef(1);
    SY_CHILD_OK(
        kernels::ClipCoefficient(Stream::Cpu(), View(sum_sq), clip, View(norm), View(coef)));
    SY_CHILD_CHECK(Close(*sq_d, want_d, kRelTol) && Close(sq_e_all[0], want_e, kRelTol));
    SY_CHILD_CHECK(Close(rd->grad_norm, norm[0], kRelTol) && rd->grad_norm == re->grad_norm);
    SY_CHILD_CHECK(Close(rd->clip_coef, coef[0], kRelTol) && rd->clip_coef == re->clip_coef);
    worst_norm = std::max(worst_norm, std::fabs(double{rd->grad_norm} - norm[0]) / norm[0]);
    if (coef[0] < 1.0f) ++clipped;
    SY_CHILD_CHECK(RefAdamW(ref_gd, coef, kDenseDecay, rd_master, rd_m, rd_v, rd_params, lr, step));
    SY_CHILD_CHECK(
        RefAdamW(ref_ge[my_ep], coef, kExpertDecay, re_master, re_m, re_v, re_params, lr, step));
    auto compare = [&](const std::vector<float>& got, const std::vector<float>& want,
                       const char* what) {
      for (size_t i = 0; i < want.size(); ++i) {
        if (!Close(got[i], want[i], kRelTol)) {
          std::fprintf(stderr, "rank %d step %d: %s params[%zu] = %.9g vs reference %.9g\n", rank,
                       step, what, i, got[i], want[i]);
          return false;
        }
        worst = std::max(worst, double{std::fabs(got[i] - want[i])} /
                                    std::max({std::fabs(got[i]), std::fabs(want[i]), 0.5f}));
      }
      return true;
    };
    SY_CHILD_CHECK(compare(params_d, rd_params, "dense"));
    SY_CHILD_CHECK(compare(params_e, re_params, "expert"));
    for (int64_t i = kDenseN; i < pd; ++i) SY_CHILD_CHECK(params_d[i] == 0.0f);
    for (int64_t i = kExpertN; i < pe; ++i) SY_CHILD_CHECK(params_e[i] == 0.0f);
    SY_CHILD_CHECK(std::fabs(params_e[0] - expert_init[my_ep][0]) > 1e-4);
  }
  SY_CHILD_CHECK(clipped >= 2);
  if (rank == 0) {
    std::printf(
        "W=4 EP=2: dense DP=4 n=%lld, expert EDP=2 n=%lld scale 1/4, %d steps (%d clipped): max "
        "rel param diff %.3g, max rel norm diff %.3g vs the single-process reference, tolerance "
        "%.0e\n",
        static_cast<long long>(kDenseN), static_cast<long long>(kExpertN), kSteps, clipped, worst,
        worst_norm, kRelTol);
  }
  return 0;
}

TEST(DistributedAdamWTest, DenseAndExpertInstancesShareTheGlobalNorm) {
  const std::string dir = comm::testing::UniqueStoreDir("dense_expert");
  std::vector<int> codes = comm::testing::RunProcesses(
      4, absl::Seconds(25), [&](int rank) { return DenseExpertChild(dir, rank); });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(DistributedAdamWTest, FinishStepNeedsPrepareStep) {
  auto comm = comm::SingleRankCommunicator::Create();
  ASSERT_TRUE(comm.ok());
  std::vector<float> master = RandomVector(16, 3, 1.0f), g(16, 1.0f), p(16, 0.0f);
  EXPECT_EQ(DistributedAdamW::Create(comm->get(), Device::Cpu(), 16, 8, View(master), Hp(), 0.0f)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  auto dist = DistributedAdamW::Create(comm->get(), Device::Cpu(), 16, 8, View(master), Hp(), 0.5f);
  ASSERT_TRUE(dist.ok());
  EXPECT_EQ((*dist)->FinishStep(Stream::Cpu(), View(p), 1.0f, 1e-3, 1, 0.0f).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<float> sq = (*dist)->PrepareStep(Stream::Cpu(), View(g));
  ASSERT_TRUE(sq.ok()) << sq.status();
  EXPECT_EQ(*sq, 16 * 0.25f);  // scale 0.5 applied before the norm
  auto r = (*dist)->FinishStep(Stream::Cpu(), View(p), 100.0f, 1e-3, 1, 1.0f);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->grad_norm, 10.0f);  // the given total, not the own norm
  EXPECT_EQ((*dist)->FinishStep(Stream::Cpu(), View(p), 1.0f, 1e-3, 2, 0.0f).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace switchyard::train
