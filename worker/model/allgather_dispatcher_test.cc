// File: worker/model/allgather_dispatcher_test.cc
//
// AllGatherDispatcher with real processes (helpers in testing/ep_fork.h and
// worker/comm/testing/forked_ranks.h): each multi-rank test forks W children (before any thread
// exists in the parent), each connects a GlooCommunicator on loopback through a FileKvStore in
// TEST_TMPDIR, runs two forward + backward micro-batches (the second with other token counts per
// rank) through the six phases and reports through its exit code. Every child generates the WHOLE
// global batch from one seed (drawn by the parent from std::random_device and printed) and compares
// its results with two single-process references:
//   (a) LocalDispatcher on the concatenated global batch (ranks' tokens in rank order): the rows,
//       probs and counts this rank's experts receive, and the expert-side gradient rows, must
//       equal that run's rows for the same global experts, bit for bit and in the same order;
//   (b) LocalDispatcher on this rank's own tokens: d_topk_probs must be equal (each slot has one
//       owner rank, the others add 0); out and dx are summed in two stages (per rank, then the
//       reduce-scatter), so they must agree within 4 * FLT_EPSILON * sum|terms| per element.
// The identity-prob experts make the round trip out[t] = x[t] * (sum of the kept probs), also
// checked against that sum in fp64 with the same bound. Routing is deliberately uneven (some
// experts 5x more likely, some slots dropped, ranks with very different token counts, one rank
// with no token at all) and one expert receives no token from any rank. EP = 1 (a
// SingleRankCommunicator) must be bit-identical to LocalDispatcher.
#include "worker/model/allgather_dispatcher.h"

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/testing/forked_ranks.h"
#include "worker/model/testing/ep_fork.h"

namespace switchyard::model {
namespace {

using ep_test::Batch;
using ep_test::CheckExpertSide;
using ep_test::Config;
using ep_test::ConnectGloo;
using ep_test::MakeGlobal;
using ep_test::PrintConfig;
using ep_test::Result;
using ep_test::RunLocal;
using ep_test::RunStep;
using ep_test::SameBits;

// |got - want| <= 4 * FLT_EPSILON * scale, element-wise; tracks the worst ratio in *worst.
bool Close(float got, double want, double scale, double* worst) {
  const double err = std::fabs(static_cast<double>(got) - want);
  const double bound = 4.0 * FLT_EPSILON * scale;
  if (bound > 0) *worst = std::max(*worst, err / bound);
  return err <= bound;
}

// Checks `got` for `rank` against both references (see the file comment).
int CheckAgainstReferences(const Config& c, const std::vector<Batch>& all, int rank,
                           const Result& got, double* worst) {
  // (a) the global batch through one LocalDispatcher: the expert side, bit for bit.
  if (CheckExpertSide(c, all, rank, got) != 0) return 1;
  // (b) this rank's tokens through one LocalDispatcher.
  const Batch& mine = all[rank];
  absl::StatusOr<Result> local = RunLocal(mine, c);
  SY_CHILD_OK(local.status());
  SY_CHILD_CHECK(got.d_topk_probs.size() == local->d_topk_probs.size());
  for (size_t i = 0; i < got.d_topk_probs.size(); ++i) {
    SY_CHILD_CHECK(got.d_topk_probs[i] == local->d_topk_probs[i]);
  }
  SY_CHILD_CHECK(got.out.size() == local->out.size() && got.dx.size() == local->dx.size());
  const int k = c.topk;
  for (int64_t t = 0; t < mine.t; ++t) {
    for (int64_t h = 0; h < c.hidden; ++h) {
      const int64_t i = t * c.hidden + h;
      double acc = 0, scale = 0, grad_scale = 0;
      for (int s = 0; s < k; ++s) {
        if (mine.idx[t * k + s] < 0) continue;
        const double term = static_cast<double>(mine.x[i]) * mine.probs[t * k + s];
        acc += term;
        scale += std::fabs(term);
        grad_scale += std::fabs(static_cast<double>(mine.dout[i]) * mine.probs[t * k + s]);
      }
      // The identity round trip, and the same output as the local path.
      SY_CHILD_CHECK(Close(got.out[i], acc, scale, worst));
      SY_CHILD_CHECK(Close(got.out[i], local->out[i], scale, worst));
      SY_CHILD_CHECK(Close(got.dx[i], local->dx[i], grad_scale, worst));
    }
  }
  return 0;
}

int DistributedChild(const Config& c, uint32_t seed, const std::string& dir, int rank) {
  absl::StatusOr<std::unique_ptr<comm::GlooCommunicator>> world = ConnectGloo(dir, rank, c.world);
  SY_CHILD_OK(world.status());
  int64_t max_tokens = 1;
  for (int64_t t : c.tokens) max_tokens = std::max(max_tokens, t);
  absl::StatusOr<std::unique_ptr<AllGatherDispatcher>> d =
      AllGatherDispatcher::Create(world->get(), Device::Cpu(), DType::kF32, DType::kF32, max_tokens,
                                  c.hidden, c.num_experts, c.world, c.topk);
  SY_CHILD_OK(d.status());
  // Two micro-batches through the same dispatcher; the second rotates the token counts across
  // ranks, so the gathered sizes must be re-synchronised and nothing of the first may leak.
  double worst = 0;
  for (int step = 0; step < 2; ++step) {
    Config cs = c;
    if (step == 1) std::rotate(cs.tokens.begin(), cs.tokens.begin() + 1, cs.tokens.end());
    const std::vector<Batch> batches = MakeGlobal(cs, seed + step);
    Result got;
    SY_CHILD_OK(RunStep(**d, batches[rank], cs.hidden, cs.topk, &got));
    if (CheckAgainstReferences(cs, batches, rank, got, &worst) != 0) {
      std::fprintf(stderr, "rank %d: step %d failed\n", rank, step);
      return 1;
    }
    SY_CHILD_CHECK((*d)->tokens_per_rank() == cs.tokens);
  }
  std::fprintf(stderr,
               "rank %d/%d: T=%ld, expert rows exact, out/dx worst error %.3f of the bound "
               "4*FLT_EPSILON*sum|terms|: OK\n",
               rank, c.world, static_cast<long>(c.tokens[rank]), worst);
  return 0;
}

void RunDistributed(const Config& c, const std::string& name) {
  const uint32_t seed = std::random_device{}();
  PrintConfig(name, c, seed);
  const std::string dir = comm::testing::UniqueStoreDir(absl::StrCat("ag_", name));
  std::vector<int> codes = comm::testing::RunProcesses(
      c.world, absl::Seconds(25), [&](int rank) { return DistributedChild(c, seed, dir, rank); });
  for (int r = 0; r < c.world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r << " seed " << seed;
}

TEST(AllGatherDispatcherTest, TwoRanksTwoLocalExperts) {
  Config c;
  c.world = 2;
  c.num_experts = 4;
  c.topk = 2;
  c.hidden = 8;
  c.tokens = {7, 12};
  c.dead_expert = 3;  // rank 1's local expert 1 receives nothing
  RunDistributed(c, "w2");
}

TEST(AllGatherDispatcherTest, FourRanksUnevenTokens) {
  Config c;
  c.world = 4;
  c.num_experts = 8;
  c.topk = 3;
  c.hidden = 5;
  c.tokens = {9, 0, 16, 4};  // rank 1 has no token (AllGatherV with a zero count)
  c.dead_expert = 2;
  RunDistributed(c, "w4");
}

TEST(AllGatherDispatcherTest, FourRanksOneLocalExpert) {
  Config c;
  c.world = 4;
  c.num_experts = 4;
  c.topk = 2;
  c.hidden = 3;
  c.tokens = {6, 6, 6, 6};
  c.dead_expert = 0;  // rank 0 has no rows at all for its only expert
  RunDistributed(c, "w4l1");
}

// EP = 1 degenerates to the local path: same rows, counts, output and gradients, bit for bit.
TEST(AllGatherDispatcherTest, SingleRankMatchesLocalDispatcher) {
  Config c;
  c.world = 1;
  c.num_experts = 6;
  c.topk = 2;
  c.hidden = 4;
  c.tokens = {11};
  c.dead_expert = 5;
  const std::vector<Batch> all = MakeGlobal(c, std::random_device{}());
  absl::StatusOr<std::unique_ptr<comm::SingleRankCommunicator>> ep =
      comm::SingleRankCommunicator::Create("ep");
  ASSERT_TRUE(ep.ok());
  absl::StatusOr<std::unique_ptr<AllGatherDispatcher>> d = AllGatherDispatcher::Create(
      ep->get(), Device::Cpu(), DType::kF32, DType::kF32, 11, c.hidden, 6, 1, 2);
  ASSERT_TRUE(d.ok()) << d.status();
  Result got;
  absl::Status s = RunStep(**d, all[0], c.hidden, c.topk, &got);
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<Result> ref = RunLocal(all[0], c);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(got.tokens_per_expert, ref->tokens_per_expert);
  EXPECT_TRUE(SameBits(got.expert_x, ref->expert_x));
  EXPECT_TRUE(SameBits(got.expert_probs, ref->expert_probs));
  EXPECT_TRUE(SameBits(got.d_expert_out, ref->d_expert_out));
  EXPECT_TRUE(SameBits(got.out, ref->out));
  EXPECT_TRUE(SameBits(got.dx, ref->dx));
  EXPECT_TRUE(SameBits(got.d_topk_probs, ref->d_topk_probs));
  EXPECT_EQ(got.tokens_per_expert[5], 0);
  comm::testing::ChildRank() = 0;
  double worst = 0;
  EXPECT_EQ(CheckAgainstReferences(c, all, 0, got, &worst), 0);
}

TEST(AllGatherDispatcherTest, RejectsBadArgumentsAndPhaseOrder) {
  absl::StatusOr<std::unique_ptr<comm::SingleRankCommunicator>> ep =
      comm::SingleRankCommunicator::Create("ep");
  ASSERT_TRUE(ep.ok());
  EXPECT_EQ(
      AllGatherDispatcher::Create(ep->get(), Device::Cpu(), DType::kF32, DType::kF32, 4, 4, 4, 2, 2)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);  // ep_size != group size
  EXPECT_EQ(
      AllGatherDispatcher::Create(nullptr, Device::Cpu(), DType::kF32, DType::kF32, 4, 4, 4, 1, 2)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      AllGatherDispatcher::Create(ep->get(), Device::Cpu(), DType::kF32, DType::kF32, 4, 4, 4, 1, 5)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);  // topk > num_experts
  // CUDA needs an NcclCommunicator on the device (its stream orders the collectives).
  const absl::Status cuda = AllGatherDispatcher::Create(ep->get(), Device::Cuda(0), DType::kF32,
                                                        DType::kF32, 4, 4, 4, 1, 2)
                                .status();
  EXPECT_EQ(cuda.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cuda.message().find("NcclCommunicator"), std::string::npos) << cuda;
  absl::StatusOr<std::unique_ptr<AllGatherDispatcher>> d = AllGatherDispatcher::Create(
      ep->get(), Device::Cpu(), DType::kF32, DType::kF32, 4, 4, 4, 1, 2);
  ASSERT_TRUE(d.ok());
  DispatchState st;
  // A stream on another device than the dispatcher's.
  EXPECT_EQ((*d)->DispatchPreprocess(Stream{Device::Cuda(0), nullptr}, &st).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*d)->Dispatch(Stream::Cpu(), &st).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*d)->Combine(Stream::Cpu(), &st).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*d)->CombineBackward(Stream::Cpu(), Tensor(), &st).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace switchyard::model
