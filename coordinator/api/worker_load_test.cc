// File: coordinator/api/worker_load_test.cc
//
// Load check: 1000 fake workers (real gRPC streams over 10 loopback connections) attach to one
// coordinator and heartbeat at the protocol's 1 s; then one job takes all 1000 of them. Prints the
// latency percentiles and asserts only correctness (every worker registered, none LOST while
// heartbeating, every rank assigned once, the job SUCCEEDED), never timing.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/api/worker_test_util.h"
#include "gtest/gtest.h"

namespace switchyard::api {
namespace {

using testing::FakeWorker;
using testing::Harness;
using testing::HeartbeatTicker;
using v1::CoordinatorMessage;
using v1::Job;

constexpr int kWorkers = 1000;
constexpr int kChannels = 10;

void PrintPercentiles(const char* what, std::vector<absl::Duration> samples) {
  ASSERT_FALSE(samples.empty());
  std::sort(samples.begin(), samples.end());
  auto at = [&](double q) {
    return samples[std::min(samples.size() - 1, static_cast<size_t>(q * samples.size()))];
  };
  std::printf("%-44s n=%zu  p50 %9.3f ms  p99 %9.3f ms  max %9.3f ms\n", what, samples.size(),
              absl::ToDoubleMilliseconds(at(0.50)), absl::ToDoubleMilliseconds(at(0.99)),
              absl::ToDoubleMilliseconds(samples.back()));
}

TEST(WorkerLoadTest, ThousandWorkersAttachHeartbeatAndRunOneJob) {
  api::WorkerPlaneOptions options = testing::FastOptions(
      absl::StrCat(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp", "/ckpt"));
  options.registry.heartbeat_timeout = absl::Seconds(5);  // the protocol's defaults
  options.registry.persist_interval = absl::Seconds(10);
  auto h = Harness::Start("load.db", true, options);
  ASSERT_NE(h, nullptr);
  cluster::WorkerRegistry* registry = h->plane()->registry();

  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int c = 0; c < kChannels; ++c) channels.push_back(testing::MakeChannel(h->port(), c));
  std::vector<std::unique_ptr<FakeWorker>> workers;
  std::vector<FakeWorker*> raw;
  const absl::Time attach_start = absl::Now();
  for (int i = 0; i < kWorkers; ++i) {
    workers.push_back(std::make_unique<FakeWorker>(
        channels[i % kChannels], absl::StrCat("load-", i), absl::StrCat("node-", i / 8)));
    workers.back()->Attach();
    raw.push_back(workers.back().get());
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (registry->CountInState(cluster::WorkerState::kIdle) < kWorkers && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const absl::Duration attach_all = absl::Now() - attach_start;
  ASSERT_EQ(registry->CountInState(cluster::WorkerState::kIdle), kWorkers);
  std::printf("%d workers attached and registered in %s (%d connections)\n", kWorkers,
              absl::FormatDuration(attach_all).c_str(), kChannels);
  std::vector<absl::Duration> registration;
  for (FakeWorker* w : raw) {
    registration.push_back(registry->Get(w->id())->registered_at - w->attach_started());
  }
  PrintPercentiles("Attach: stream open -> registered", registration);

  // Steady state: heartbeats at 1 s for 4 s; nobody may go LOST.
  HeartbeatTicker ticker(raw, absl::Seconds(1));
  absl::SleepFor(absl::Seconds(4));
  int64_t heartbeats = 0;
  for (const cluster::WorkerInfo& w : registry->List()) heartbeats += w.heartbeats;
  std::printf("steady state: %lld heartbeats processed in ~4 s, %d LOST\n",
              static_cast<long long>(heartbeats),
              registry->CountInState(cluster::WorkerState::kLost));
  EXPECT_EQ(registry->CountInState(cluster::WorkerState::kLost), 0);
  EXPECT_GE(heartbeats, kWorkers);

  // One job over all 1000 workers: Assignment and Start pushed to every stream.
  v1::JobSpec spec = testing::SmallSpec(kWorkers, kWorkers);
  spec.mutable_training()->set_global_batch_size(kWorkers);
  const absl::Time submitted = absl::Now();
  const std::string job = h->Submit(spec);
  std::vector<absl::Duration> to_assignment, to_start;
  std::vector<int> rank_seen(kWorkers, 0);
  for (FakeWorker* w : raw) {
    auto a = w->WaitFor(CoordinatorMessage::kAssignment, absl::Seconds(120));
    ASSERT_TRUE(a.has_value()) << w->id();
    EXPECT_EQ(a->message.assignment().world_size(), kWorkers);
    ++rank_seen[a->message.assignment().rank()];
    auto s = w->WaitFor(CoordinatorMessage::kStart, absl::Seconds(120));
    ASSERT_TRUE(s.has_value()) << w->id();
    to_assignment.push_back(a->time - submitted);
    to_start.push_back(s->time - submitted);
  }
  EXPECT_EQ(std::count(rank_seen.begin(), rank_seen.end(), 1), kWorkers);
  PrintPercentiles("CreateJob -> Assignment received (1000 ranks)", to_assignment);
  PrintPercentiles("CreateJob -> Start received (1000 ranks)", to_start);

  const absl::Time exits = absl::Now();
  for (FakeWorker* w : raw) w->SendStep(1, 1.0);
  for (FakeWorker* w : raw) w->SendExit(0);
  Job done = h->WaitForState(job, Job::SUCCEEDED, absl::Seconds(120));
  std::printf("1000 step reports + 1000 exits -> SUCCEEDED in %s\n",
              absl::FormatDuration(absl::Now() - exits).c_str());
  EXPECT_EQ(registry->CountInState(cluster::WorkerState::kLost), 0);
}

}  // namespace
}  // namespace switchyard::api
