// File: worker/model/alltoall_dispatcher_failure_test.cc
//
// Never hang (issue 15, item 5), on the CPU with real processes: W = 3 forked ranks run
// AllToAllDispatcher (label "MoE layer 7") over Gloo on loopback, and rank 1 dies (SIGKILL) or
// stalls (SIGSTOP) INSIDE a phase: its EP communicator is the real GlooCommunicator behind a thin
// test wrapper that, at a chosen AllToAllV call (the first one: the rows of Dispatch; the third:
// the rows of Combine), records the time and signals its own process instead of calling Gloo. The
// other ranks are then blocked in the same all-to-all. Each must get an error, within the Gloo
// timeout (3 s) plus scheduling slack, that names the MoE layer and phase and the missing peer:
//   SIGSTOP: DEADLINE_EXCEEDED "MoE layer 7 <phase> (forward): group 'world' rank r/3 AllToAllV:
//            Timed out ...; no data yet from group rank(s) 1 (world rank 1)" and no other rank;
//   SIGKILL: UNAVAILABLE, the same prefix, Gloo's "Connection closed by peer ..." and
//            "(world rank 1)" among the peers whose data had not arrived.
// Rank 0 ends the stopped victim once the survivors have recorded their evidence.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/testing/forked_ranks.h"
#include "worker/model/alltoall_dispatcher.h"
#include "worker/model/testing/ep_fork.h"

namespace switchyard::model {
namespace {

namespace ct = ::switchyard::comm::testing;
using ep_test::Batch;
using ep_test::Config;
using ep_test::MakeGlobal;
using ep_test::Result;
using ep_test::RunStep;

constexpr int kWorld = 3;
constexpr int kVictim = 1;
constexpr absl::Duration kTimeout = absl::Seconds(3);
// The timeout plus slack for 3 processes sharing 2 busy cores.
constexpr absl::Duration kBound = absl::Seconds(8);

enum class Death { kKilled, kStopped };

// Forwards everything to `inner` except the `die_at`-th AllToAllV call (1-based), where it writes
// "died_at" and "victim_pid" to the store and signals its own process.
class DyingCommunicator final : public comm::Communicator {
 public:
  DyingCommunicator(comm::Communicator* inner, comm::KvStore* store, Death death, int die_at)
      : inner_(inner), store_(store), death_(death), die_at_(die_at) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  absl::Status AllReduce(const Tensor& in, const Tensor& out, comm::ReduceOp op) override {
    return inner_->AllReduce(in, out, op);
  }
  absl::Status ReduceScatter(const Tensor& in, const Tensor& out, comm::ReduceOp op) override {
    return inner_->ReduceScatter(in, out, op);
  }
  absl::Status AllGather(const Tensor& in, const Tensor& out) override {
    return inner_->AllGather(in, out);
  }
  absl::Status AllGatherV(const Tensor& in, const Tensor& out,
                          absl::Span<const int64_t> counts) override {
    return inner_->AllGatherV(in, out, counts);
  }
  absl::Status AllToAllV(const Tensor& in, absl::Span<const int64_t> send_counts, const Tensor& out,
                         absl::Span<const int64_t> recv_counts) override {
    if (++calls_ == die_at_) {
      (void)store_->Set("victim_pid", absl::StrCat(getpid()));
      (void)store_->Set("died_at", absl::StrCat(absl::ToUnixNanos(absl::Now())));
      std::fflush(nullptr);
      raise(death_ == Death::kKilled ? SIGKILL : SIGSTOP);
      _exit(3);  // only after a SIGCONT, which nobody sends
    }
    return inner_->AllToAllV(in, send_counts, out, recv_counts);
  }
  absl::Status Send(const Tensor& t, int peer, uint32_t tag) override {
    return inner_->Send(t, peer, tag);
  }
  absl::Status Recv(const Tensor& t, int peer, uint32_t tag) override {
    return inner_->Recv(t, peer, tag);
  }
  absl::Status Broadcast(const Tensor& t, int root) override { return inner_->Broadcast(t, root); }
  absl::Status Barrier() override { return inner_->Barrier(); }
  absl::Status Synchronize() override { return inner_->Synchronize(); }
  void Abort() override { inner_->Abort(); }

 private:
  comm::Communicator* inner_;
  comm::KvStore* store_;
  const Death death_;
  const int die_at_;
  int calls_ = 0;
};

int RankBody(int rank, Death death, int die_at, const std::string& dir) {
  std::shared_ptr<comm::KvStore> store = ct::OpenFileStore(dir);
  SY_CHILD_CHECK(store != nullptr);
  comm::GlooOptions gopt;
  gopt.timeout = kTimeout;
  auto world = comm::GlooCommunicator::Create(store, rank, kWorld, gopt);
  SY_CHILD_OK(world.status());
  Config c;
  c.world = kWorld;
  c.num_experts = 6;
  c.topk = 2;
  c.hidden = 4;
  c.tokens = {8, 8, 8};
  // No expert is dead and no slot dropped matters here: every rank sends rows to every other one
  // (checked below), so every survivor waits for the victim's rows.
  const std::vector<Batch> all = MakeGlobal(c, 1234);
  DyingCommunicator dying(world->get(), store.get(), death, die_at);
  comm::Communicator* ep =
      rank == kVictim ? static_cast<comm::Communicator*>(&dying) : world->get();
  auto d = AllToAllDispatcher::Create(ep, Device::Cpu(), DType::kF32, DType::kF32, 8, c.hidden,
                                      c.num_experts, kWorld, c.topk, nullptr, "MoE layer 7");
  SY_CHILD_OK(d.status());
  Result got;
  const absl::Status s = RunStep(**d, all[rank], c.hidden, c.topk, &got);
  SY_CHILD_CHECK(rank != kVictim);  // the victim never gets here
  SY_CHILD_CHECK(!s.ok());
  // Every survivor received rows from the victim in the dispatch (so it was waiting for it).
  if (die_at == 1) SY_CHILD_CHECK((*d)->output_splits()[kVictim] > 0);
  absl::StatusOr<std::string> died = store->Get("died_at", absl::Seconds(5));
  SY_CHILD_OK(died.status());
  int64_t died_ns = 0;
  SY_CHILD_CHECK(absl::SimpleAtoi(*died, &died_ns));
  const double since = absl::ToDoubleSeconds(absl::Now() - absl::FromUnixNanos(died_ns));
  SY_CHILD_OK(store->Set(absl::StrCat("error/", rank), s.ToString()));
  SY_CHILD_OK(store->Set(absl::StrCat("since/", rank), absl::StrCat(since)));
  (void)store->Increment("observed");
  if (rank == 0 && death == Death::kStopped) {
    (void)store->WaitForCount("observed", kWorld - 1, absl::Seconds(30));
    absl::StatusOr<std::string> pid = store->Get("victim_pid", absl::Seconds(5));
    int64_t p = 0;
    if (pid.ok() && absl::SimpleAtoi(*pid, &p) && p > 0) kill(static_cast<pid_t>(p), SIGKILL);
  }
  return 0;
}

struct Case {
  Death death;
  int die_at;         // AllToAllV call of the victim that never happens
  const char* phase;  // what the survivors' error must name
};

class DispatchFailureTest : public ::testing::TestWithParam<Case> {};

TEST_P(DispatchFailureTest, EveryOtherRankFailsWithinTheTimeoutNamingLayerPhaseAndPeer) {
  const Case c = GetParam();
  const std::string dir = ct::UniqueStoreDir("a2a_failure");
  const std::vector<int> codes = ct::RunProcesses(
      kWorld, absl::Seconds(60), [&](int rank) { return RankBody(rank, c.death, c.die_at, dir); });
  std::shared_ptr<comm::KvStore> store = ct::OpenFileStore(dir);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(codes[kVictim], 128 + SIGKILL);
  for (int r = 0; r < kWorld; ++r) {
    if (r == kVictim) continue;
    EXPECT_EQ(codes[r], 0) << "rank " << r;
    absl::StatusOr<std::string> error = store->Get(absl::StrCat("error/", r), absl::ZeroDuration());
    absl::StatusOr<std::string> since = store->Get(absl::StrCat("since/", r), absl::ZeroDuration());
    ASSERT_TRUE(error.ok() && since.ok()) << "rank " << r;
    double s = 0;
    ASSERT_TRUE(absl::SimpleAtod(*since, &s));
    std::printf("rank %d failed %.2f s after rank %d's %s (timeout %.0f s, bound %.0f s):\n  %s\n",
                r, s, kVictim, c.death == Death::kKilled ? "SIGKILL" : "SIGSTOP",
                absl::ToDoubleSeconds(kTimeout), absl::ToDoubleSeconds(kBound), error->c_str());
    EXPECT_LT(s, absl::ToDoubleSeconds(kBound)) << "rank " << r;
    EXPECT_TRUE(absl::StrContains(*error, absl::StrCat("MoE layer 7 ", c.phase, " (forward): ")))
        << *error;
    EXPECT_TRUE(absl::StrContains(*error, "AllToAllV")) << *error;
    if (c.death == Death::kStopped) {
      EXPECT_TRUE(absl::StartsWith(*error, "DEADLINE_EXCEEDED: ")) << *error;
      EXPECT_TRUE(absl::StrContains(*error, "no data yet from group rank(s) 1 (world rank 1)"))
          << *error;
      EXPECT_FALSE(absl::StrContains(*error, "(world rank 0)")) << *error;
      EXPECT_FALSE(absl::StrContains(*error, "(world rank 2)")) << *error;
      // Not before the timeout: the victim is alive, only silent.
      EXPECT_GT(s, absl::ToDoubleSeconds(kTimeout) - 0.5) << "rank " << r;
    } else {
      EXPECT_TRUE(absl::StartsWith(*error, "UNAVAILABLE: ")) << *error;
      EXPECT_TRUE(absl::StrContains(*error, "(world rank 1)")) << *error;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Deaths, DispatchFailureTest,
    ::testing::Values(Case{Death::kKilled, 1, "dispatch"}, Case{Death::kStopped, 1, "dispatch"},
                      Case{Death::kKilled, 3, "combine"}, Case{Death::kStopped, 3, "combine"}),
    [](const auto& info) {
      return absl::StrCat(info.param.death == Death::kKilled ? "Killed" : "Stopped", "In",
                          info.param.die_at == 1 ? "Dispatch" : "Combine");
    });

}  // namespace
}  // namespace switchyard::model
