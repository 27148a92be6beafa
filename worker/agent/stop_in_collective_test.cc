// File: worker/agent/stop_in_collective_test.cc
//
// A Stop that lands while a CPU worker is inside a Gloo collective (issue 15, item 5) aborts it
// promptly instead of waiting for the Gloo timeout. Real processes, the agent's own stop path:
// two forked ranks build the process groups (CreateGlooProcessGroups, Gloo over loopback with a
// 10-minute timeout) and the trainer of the tiny MoE model (EP = 2); rank 1 then stalls (SIGSTOP)
// before its first step, so rank 0's Step() blocks in a collective with it. One second into that
// Step, another thread of rank 0 calls GenerationControl::RequestStop, exactly what the agent does
// on the coordinator's Stop (agent.cc -> GenerationControl::RequestStop -> ProcessGroups::AbortAll
// -> GlooCommunicator::Abort, which wakes a collective blocked in its own process). Step() must
// return within 5 s of the request (not 10 minutes) with ABORTED. Rank 0 then ends rank 1.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "gtest/gtest.h"
#include "worker/agent/generation.h"
#include "worker/comm/testing/forked_ranks.h"
#include "worker/train/process_groups.h"
#include "worker/train/testing/tiny_moe_spec.h"
#include "worker/train/trainer.h"

namespace switchyard::agent {
namespace {

namespace ct = ::switchyard::comm::testing;

constexpr int kWorld = 2;
constexpr absl::Duration kStopAfter = absl::Seconds(1);
constexpr absl::Duration kBound = absl::Seconds(5);

int RankBody(int rank, const std::string& dir) {
  std::shared_ptr<comm::KvStore> store = ct::OpenFileStore(dir);
  SY_CHILD_CHECK(store != nullptr);
  ParallelDims dims;
  dims.world_size = kWorld;
  dims.expert_model_parallel_size = kWorld;
  comm::GlooOptions gopt;
  gopt.timeout = absl::Minutes(10);
  auto groups = train::CreateGlooProcessGroups(store, rank, dims, gopt);
  SY_CHILD_OK(groups.status());
  train::TrainerOptions opt;
  opt.force_dtype = true;
  opt.dtype = DType::kF32;
  opt.groups = groups->get();
  v1::JobSpec spec = *ParseJobSpecYaml(test_specs::TinyMoeSpecYaml(4, /*jitter=*/false));
  spec.mutable_parallel()->set_world_size(kWorld);
  spec.mutable_parallel()->set_expert_model_parallel_size(kWorld);
  auto trainer = train::Trainer::Create(spec, opt);
  SY_CHILD_OK(trainer.status());
  if (rank == 1) {
    SY_CHILD_OK(store->Set("victim_pid", absl::StrCat(getpid())));
    std::fflush(nullptr);
    raise(SIGSTOP);
    _exit(3);
  }
  GenerationControl control;
  control.SetGroups(groups->get());
  absl::Time requested_at = absl::InfiniteFuture();
  std::thread stopper([&] {
    absl::SleepFor(kStopAfter);
    requested_at = absl::Now();
    control.RequestStop("Stop: test");
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<train::StepResult> r = (*trainer)->Step();
  const absl::Time returned = absl::Now();
  stopper.join();
  control.SetGroups(nullptr);
  const double after_stop = absl::ToDoubleSeconds(returned - requested_at);
  std::fprintf(stderr,
               "rank 0: Step() returned %.2f s after it started, %.2f s after the Stop: %s\n",
               absl::ToDoubleSeconds(returned - start), after_stop, r.status().ToString().c_str());
  absl::StatusOr<std::string> pid = store->Get("victim_pid", absl::Seconds(5));
  int64_t p = 0;
  if (pid.ok() && absl::SimpleAtoi(*pid, &p) && p > 0) kill(static_cast<pid_t>(p), SIGKILL);
  SY_CHILD_CHECK(!r.ok());
  SY_CHILD_CHECK(r.status().code() == absl::StatusCode::kAborted);
  SY_CHILD_CHECK(control.stop_requested());
  // It blocked until the Stop (rank 1 never took part), then returned promptly.
  SY_CHILD_CHECK(returned >= requested_at);
  SY_CHILD_CHECK(after_stop < absl::ToDoubleSeconds(kBound));
  return 0;
}

TEST(StopInCollectiveTest, StopAbortsABlockedGlooCollectivePromptly) {
  const std::string dir = ct::UniqueStoreDir("stop_in_collective");
  const std::vector<int> codes =
      ct::RunProcesses(kWorld, absl::Seconds(120), [&](int rank) { return RankBody(rank, dir); });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 128 + SIGKILL);
}

}  // namespace
}  // namespace switchyard::agent
