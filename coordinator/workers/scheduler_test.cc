// File: coordinator/workers/scheduler_test.cc
//
// The job lifecycle of WORKER_PROTOCOL.md end to end: a real gRPC server on loopback with the
// worker services, a real SQLite file, fake workers that are real gRPC clients.
#include "coordinator/workers/scheduler.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config_defaults.h"
#include "common/validate.h"
#include "coordinator/workers/worker_test_util.h"
#include "gtest/gtest.h"

namespace switchyard::workers {
namespace {

using testing::FakeWorker;
using testing::Harness;
using testing::HeartbeatTicker;
using v1::CoordinatorMessage;
using v1::Job;

struct Fleet {
  std::vector<std::unique_ptr<FakeWorker>> workers;
  std::unique_ptr<HeartbeatTicker> ticker;

  Fleet(Harness* h, int n, const std::string& prefix = "w") {
    std::vector<FakeWorker*> raw;
    for (int i = 0; i < n; ++i) {
      workers.push_back(std::make_unique<FakeWorker>(testing::MakeChannel(h->port()),
                                                     absl::StrCat(prefix, i), "host-a"));
      workers.back()->Attach();
      raw.push_back(workers.back().get());
    }
    ticker = std::make_unique<HeartbeatTicker>(raw, absl::Milliseconds(200));
    // Wait until every worker is registered.
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (h->plane()->registry()->CountInState(WorkerState::kIdle) < n && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_EQ(h->plane()->registry()->CountInState(WorkerState::kIdle), n);
  }
  ~Fleet() {
    ticker.reset();
    workers.clear();
  }
};

// Waits for an Assignment on each of `workers` and then its Start; checks ranks 0..n-1, one
// world size, one generation, Start after the Assignment. Returns rank -> worker.
std::map<int, FakeWorker*> ExpectGeneration(const std::vector<FakeWorker*>& workers,
                                            const std::string& job, int64_t generation, int world) {
  std::map<int, FakeWorker*> by_rank;
  absl::Time last_assignment = absl::InfinitePast(), first_start = absl::InfiniteFuture();
  for (FakeWorker* w : workers) {
    auto a = w->WaitFor(CoordinatorMessage::kAssignment);
    EXPECT_TRUE(a.has_value()) << w->id() << " got no Assignment";
    if (!a) continue;
    const v1::Assignment& as = a->message.assignment();
    EXPECT_EQ(as.job(), job);
    EXPECT_EQ(as.generation(), generation);
    EXPECT_EQ(as.world_size(), world);
    EXPECT_EQ(as.spec().parallel().world_size(), world);
    EXPECT_EQ(as.mapping().data_parallel_size(), world);
    EXPECT_EQ(as.spec().training().global_batch_size() %
                  (as.spec().training().micro_batch_size() * world),
              0);
    EXPECT_EQ(as.rendezvous_address(), "coordinator.test:7070");
    EXPECT_FALSE(as.spec().training().save().empty());
    EXPECT_EQ(as.spec().training().save(), as.spec().training().load());
    // The worker validates the assigned spec as the coordinator does.
    v1::JobSpec defaulted = as.spec();
    ApplyDefaults(&defaulted);
    absl::Status valid = ValidateJobSpec(defaulted);
    EXPECT_TRUE(valid.ok()) << valid;
    EXPECT_TRUE(by_rank.emplace(as.rank(), w).second) << "rank " << as.rank() << " twice";
    auto s = w->WaitFor(CoordinatorMessage::kStart);
    EXPECT_TRUE(s.has_value()) << w->id() << " got no Start";
    if (s) {
      EXPECT_GE(s->time, a->time);
      first_start = std::min(first_start, s->time);
    }
    last_assignment = std::max(last_assignment, a->time);
  }
  std::vector<std::string> ranks;
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(by_rank.count(r), 1u) << "rank " << r << " missing";
    if (by_rank.count(r)) ranks.push_back(absl::StrCat(r, "=", by_rank[r]->id()));
  }
  std::printf(
      "%s generation %lld: world %d, ranks {%s}; first Start received %s after the last "
      "Assignment (another stream may overtake)\n",
      job.c_str(), static_cast<long long>(generation), world, absl::StrJoin(ranks, ", ").c_str(),
      absl::FormatDuration(first_start - last_assignment).c_str());
  return by_rank;
}

std::vector<FakeWorker*> Raw(const Fleet& fleet) {
  std::vector<FakeWorker*> out;
  for (const auto& w : fleet.workers) out.push_back(w.get());
  return out;
}

void PrintEvents(Harness* h, const std::string& job) {
  auto events = h->registry()->ListEvents(job);
  ASSERT_TRUE(events.ok());
  for (const v1::JobEvent& e : *events) {
    std::printf("  event %lld %s gen %lld %s: %s\n", static_cast<long long>(e.sequence()),
                Job::State_Name(e.state()).c_str(), static_cast<long long>(e.generation()),
                e.reason().c_str(), e.message().c_str());
  }
}

bool HasEvent(Harness* h, const std::string& job, Job::State state, const std::string& reason) {
  auto events = h->registry()->ListEvents(job);
  if (!events.ok()) return false;
  for (const v1::JobEvent& e : *events) {
    if (e.state() == state && e.reason() == reason) return true;
  }
  return false;
}

TEST(SchedulerTest, AssignsRunsSucceeds) {
  auto h = Harness::Start("sched_success.db");
  ASSERT_NE(h, nullptr);
  Fleet fleet(h.get(), 4);
  auto watch_steps = h->plane()->steps();
  const std::string job = h->Submit(testing::SmallSpec(2, 4));
  std::shared_ptr<StepSubscription> sub = watch_steps->Subscribe(job);
  auto ranks = ExpectGeneration(Raw(fleet), job, 1, 4);
  ASSERT_EQ(ranks.size(), 4u);
  EXPECT_EQ(ranks[0]->assignment()->spec().training().save(),
            absl::StrCat(std::getenv("TEST_TMPDIR"), "/checkpoints/1"));
  Job starting = h->WaitForState(job, Job::STARTING);
  EXPECT_EQ(starting.generation(), 1);

  for (auto& [rank, w] : ranks) w->SendStep(1, 5.0 + rank);
  h->WaitForState(job, Job::RUNNING);
  auto step = sub->Next(absl::Seconds(10));
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->step(), 1);
  EXPECT_DOUBLE_EQ(step->loss(), 5.0);  // rank 0's report
  for (auto& [rank, w] : ranks) w->SendStep(2, 4.0 + rank);
  step = sub->Next(absl::Seconds(10));
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->step(), 2);
  std::printf("WatchJob subscription got steps 1 and 2 with rank 0's loss %.1f\n", step->loss());

  // CheckpointNow reaches every rank; a job without a running generation is refused.
  ASSERT_TRUE(h->plane()->scheduler()->RequestCheckpoint(job).ok());
  for (auto& [rank, w] : ranks) {
    EXPECT_TRUE(w->WaitFor(CoordinatorMessage::kCheckpoint).has_value()) << "rank " << rank;
  }
  EXPECT_EQ(h->plane()->scheduler()->RequestCheckpoint("jobs/999").code(),
            absl::StatusCode::kFailedPrecondition);

  // Workers report BUSY in the store while running.
  auto row = h->store()->GetWorker(ranks[1]->id());
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->state, store::WorkerState::kAssigned);
  EXPECT_EQ(row->job, job);

  for (auto& [rank, w] : ranks) w->SendExit(0);
  Job done = h->WaitForState(job, Job::SUCCEEDED);
  PrintEvents(h.get(), job);
  EXPECT_TRUE(HasEvent(h.get(), job, Job::SUCCEEDED, "ALL_RANKS_FINISHED"));
  ASSERT_TRUE(h->plane()->steps()->LastStep(job).has_value());
  EXPECT_EQ(h->plane()->steps()->LastStep(job)->step(), 2);
  // The subscription closes with the job.
  EXPECT_FALSE(sub->Next(absl::Seconds(2)).has_value());
  EXPECT_TRUE(sub->done());
  // Every worker is idle again (in memory and in the store) and no Stop was sent.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (h->plane()->registry()->CountInState(WorkerState::kIdle) < 4 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(h->plane()->registry()->CountInState(WorkerState::kIdle), 4);
  for (auto& w : fleet.workers) EXPECT_EQ(w->CountReceived(CoordinatorMessage::kStop), 0);
  row = h->store()->GetWorker(ranks[1]->id());
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->state, store::WorkerState::kIdle);
}

TEST(SchedulerTest, LostWorkerRestartsOnFewerWorkers) {
  auto h = Harness::Start("sched_lost.db");
  ASSERT_NE(h, nullptr);
  Fleet fleet(h.get(), 4);
  const std::string job = h->Submit(testing::SmallSpec(2, 4));
  auto ranks = ExpectGeneration(Raw(fleet), job, 1, 4);
  ASSERT_EQ(ranks.size(), 4u);
  for (auto& [rank, w] : ranks) w->SendStep(1, 3.0);
  h->WaitForState(job, Job::RUNNING);

  // Rank 2 goes silent: no heartbeats, no answers.
  FakeWorker* silent = ranks[2];
  silent->set_ack_stop(false);
  silent->set_heartbeating(false);
  const absl::Time silenced = absl::Now();
  // RESTARTING lasts only until the Stops are acknowledged: wait for its event.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!HasEvent(h.get(), job, Job::RESTARTING, "WORKER_LOST") && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  std::printf("silent worker %s: job RESTARTING after %s (heartbeat_timeout 1s)\n",
              silent->id().c_str(), absl::FormatDuration(absl::Now() - silenced).c_str());
  EXPECT_TRUE(HasEvent(h.get(), job, Job::RESTARTING, "WORKER_LOST"));
  // Its stream is ended by the coordinator.
  auto end = silent->WaitForEnd(absl::Seconds(10));
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->error_code(), grpc::StatusCode::UNAVAILABLE) << end->error_message();

  // The other three get Stop (and acknowledge), then a generation 2 of world 3.
  std::vector<FakeWorker*> rest;
  for (auto& [rank, w] : ranks) {
    if (w == silent) continue;
    auto stop = w->WaitFor(CoordinatorMessage::kStop);
    ASSERT_TRUE(stop.has_value()) << w->id();
    EXPECT_NE(stop->message.stop().reason().find("WORKER_LOST"), std::string::npos);
    rest.push_back(w);
  }
  auto ranks2 = ExpectGeneration(rest, job, 2, 3);
  ASSERT_EQ(ranks2.size(), 3u);
  Job restarted = h->WaitForState(job, Job::STARTING);
  EXPECT_EQ(restarted.restart_count(), 1);
  EXPECT_EQ(restarted.generation(), 2);
  for (auto& [rank, w] : ranks2) w->SendStep(2, 2.0);
  h->WaitForState(job, Job::RUNNING);
  for (auto& [rank, w] : ranks2) w->SendExit(0);
  h->WaitForState(job, Job::SUCCEEDED);
  PrintEvents(h.get(), job);
  auto lost = h->plane()->registry()->Get(silent->id());
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ(lost->state, WorkerState::kLost);
  auto row = h->store()->GetWorker(silent->id());
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->state, store::WorkerState::kLost);
}

TEST(SchedulerTest, RestartLimitExceededFails) {
  auto h = Harness::Start("sched_limit.db");
  ASSERT_NE(h, nullptr);
  Fleet fleet(h.get(), 2);
  const std::string job = h->Submit(testing::SmallSpec(2, 2, /*max_restarts=*/1));
  auto ranks = ExpectGeneration(Raw(fleet), job, 1, 2);
  ASSERT_EQ(ranks.size(), 2u);
  ranks[1]->SendExit(200, "NCCL timeout");  // retryable
  auto stop = ranks[0]->WaitFor(CoordinatorMessage::kStop);
  ASSERT_TRUE(stop.has_value());
  std::printf("Stop to rank 0: %s\n", stop->message.stop().reason().c_str());
  auto ranks2 = ExpectGeneration(Raw(fleet), job, 2, 2);
  ASSERT_EQ(ranks2.size(), 2u);
  ranks2[0]->SendExit(137, "lost peer");
  ASSERT_TRUE(ranks2[1]->WaitFor(CoordinatorMessage::kStop).has_value());
  Job failed = h->WaitForState(job, Job::FAILED);
  std::printf("failure_reason: %s\n", failed.failure_reason().c_str());
  EXPECT_NE(failed.failure_reason().find("RESTART_LIMIT_EXCEEDED"), std::string::npos);
  EXPECT_NE(failed.failure_reason().find("WORKER_FAILED"), std::string::npos);
  EXPECT_EQ(failed.restart_count(), 1);
  PrintEvents(h.get(), job);
  // No third generation.
  absl::SleepFor(absl::Milliseconds(300));
  for (auto& w : fleet.workers) EXPECT_EQ(w->CountReceived(CoordinatorMessage::kAssignment), 2);
}

TEST(SchedulerTest, PermanentExitFails) {
  auto h = Harness::Start("sched_permanent.db");
  ASSERT_NE(h, nullptr);
  Fleet fleet(h.get(), 3);
  const std::string job = h->Submit(testing::SmallSpec(3, 3));
  auto ranks = ExpectGeneration(Raw(fleet), job, 1, 3);
  ASSERT_EQ(ranks.size(), 3u);
  for (auto& [rank, w] : ranks) w->SendStep(1, 1.0);
  h->WaitForState(job, Job::RUNNING);
  ranks[1]->SendExit(2, "bad spec: unsupported layout");
  Job failed = h->WaitForState(job, Job::FAILED);
  std::printf("failure_reason: %s\n", failed.failure_reason().c_str());
  EXPECT_NE(failed.failure_reason().find("WORKER_EXIT_PERMANENT"), std::string::npos);
  EXPECT_NE(failed.failure_reason().find("code 2"), std::string::npos);
  EXPECT_EQ(failed.restart_count(), 0);
  ASSERT_TRUE(ranks[0]->WaitFor(CoordinatorMessage::kStop).has_value());
  ASSERT_TRUE(ranks[2]->WaitFor(CoordinatorMessage::kStop).has_value());
  EXPECT_EQ(ranks[1]->CountReceived(CoordinatorMessage::kStop), 0);
}

TEST(SchedulerTest, CancelStopsEveryRank) {
  auto h = Harness::Start("sched_cancel.db");
  ASSERT_NE(h, nullptr);
  Fleet fleet(h.get(), 2);
  const std::string job = h->Submit(testing::SmallSpec(2, 2));
  auto ranks = ExpectGeneration(Raw(fleet), job, 1, 2);
  ASSERT_EQ(ranks.size(), 2u);
  for (auto& [rank, w] : ranks) w->SendStep(1, 1.0);
  h->WaitForState(job, Job::RUNNING);
  const absl::Time cancelled = absl::Now();
  ASSERT_TRUE(h->hub()->CancelJob(job).ok());  // what JobService.CancelJob does
  for (auto& [rank, w] : ranks) {
    auto stop = w->WaitFor(CoordinatorMessage::kStop);
    ASSERT_TRUE(stop.has_value()) << w->id();
    std::printf("rank %d got Stop %s after CancelJob: %s\n", rank,
                absl::FormatDuration(stop->time - cancelled).c_str(),
                stop->message.stop().reason().c_str());
  }
  h->WaitForState(job, Job::CANCELLED);
  // The acknowledged workers are idle and take the next job.
  const std::string next = h->Submit(testing::SmallSpec(2, 2));
  auto ranks2 = ExpectGeneration(Raw(fleet), next, 1, 2);
  EXPECT_EQ(ranks2.size(), 2u);
}

TEST(SchedulerTest, WaitsForMinWorkersAndFailsUnsupportedParallelism) {
  auto h = Harness::Start("sched_wait.db");
  ASSERT_NE(h, nullptr);
  Fleet fleet(h.get(), 1);
  const std::string job = h->Submit(testing::SmallSpec(2, 2));
  v1::JobSpec tp2 = testing::SmallSpec(1, 1);
  tp2.mutable_parallel()->set_tensor_model_parallel_size(2);
  tp2.mutable_parallel()->set_sequence_parallel(true);
  const std::string bad = h->Submit(tp2);
  Job failed = h->WaitForState(bad, Job::FAILED);
  std::printf("TP=2 job: %s\n", failed.failure_reason().c_str());
  EXPECT_NE(failed.failure_reason().find("UNSUPPORTED_PARALLELISM"), std::string::npos);
  EXPECT_NE(failed.failure_reason().find("parallel.tensor_model_parallel_size (2)"),
            std::string::npos);
  absl::SleepFor(absl::Milliseconds(500));
  auto pending = h->hub()->GetJob(job);
  ASSERT_TRUE(pending.ok());
  EXPECT_EQ(pending->state(), Job::PENDING) << "1 idle worker < min_workers 2";
  // A second worker arrives: the job starts on both.
  FakeWorker second(testing::MakeChannel(h->port()), "late", "host-b");
  second.Attach();
  fleet.ticker->Add(&second);
  auto ranks = ExpectGeneration({fleet.workers[0].get(), &second}, job, 1, 2);
  EXPECT_EQ(ranks.size(), 2u);
}

TEST(SchedulerTest, NoFeasiblePlanFails) {
  auto h = Harness::Start("sched_noplan.db");
  ASSERT_NE(h, nullptr);
  Fleet fleet(h.get(), 2);
  v1::JobSpec spec = testing::SmallSpec(2, 2);
  spec.mutable_training()->set_global_batch_size(3);  // not divisible by 1 x 2
  const std::string job = h->Submit(spec);
  Job failed = h->WaitForState(job, Job::FAILED);
  std::printf("failure_reason: %s\n", failed.failure_reason().c_str());
  EXPECT_NE(failed.failure_reason().find("NO_FEASIBLE_PLAN"), std::string::npos);
  EXPECT_NE(failed.failure_reason().find("global_batch_size"), std::string::npos);
  for (auto& w : fleet.workers) EXPECT_EQ(w->CountReceived(CoordinatorMessage::kAssignment), 0);
}

TEST(SchedulerTest, UnacknowledgedStopMarksWorkerLostThenRestarts) {
  auto h = Harness::Start("sched_stuck.db");
  ASSERT_NE(h, nullptr);
  Fleet fleet(h.get(), 3);
  const std::string job = h->Submit(testing::SmallSpec(2, 3));
  auto ranks = ExpectGeneration(Raw(fleet), job, 1, 3);
  ASSERT_EQ(ranks.size(), 3u);
  FakeWorker* stuck = ranks[1];
  stuck->set_ack_stop(false);  // heartbeats on, but never answers the Stop (stuck collective)
  const absl::Time failed_at = absl::Now();
  ranks[0]->SendExit(139, "CUDA error");
  ASSERT_TRUE(stuck->WaitFor(CoordinatorMessage::kStop).has_value());
  auto end = stuck->WaitForEnd(absl::Seconds(10));
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->error_code(), grpc::StatusCode::UNAVAILABLE);
  std::printf("stuck worker's stream ended after %s (stop_timeout 3s): %s\n",
              absl::FormatDuration(absl::Now() - failed_at).c_str(), end->error_message().c_str());
  EXPECT_NE(end->error_message().find("did not acknowledge Stop"), std::string::npos);
  auto ranks2 = ExpectGeneration({ranks[0], ranks[2]}, job, 2, 2);
  EXPECT_EQ(ranks2.size(), 2u);
  PrintEvents(h.get(), job);
}

TEST(SchedulerTest, ReconnectWithinTimeoutKeepsTheRank) {
  auto h = Harness::Start("sched_reconnect.db");
  ASSERT_NE(h, nullptr);
  Fleet fleet(h.get(), 2);
  const std::string job = h->Submit(testing::SmallSpec(2, 2));
  auto ranks = ExpectGeneration(Raw(fleet), job, 1, 2);
  ASSERT_EQ(ranks.size(), 2u);
  for (auto& [rank, w] : ranks) w->SendStep(1, 1.0);
  h->WaitForState(job, Job::RUNNING);

  // Rank 1's connection breaks; a CheckpointNow sent meanwhile waits in its queue.
  FakeWorker* old = ranks[1];
  const v1::Assignment assignment = *old->assignment();
  old->set_heartbeating(false);
  EXPECT_TRUE(old->Close().ok());
  ASSERT_TRUE(h->plane()->scheduler()->RequestCheckpoint(job).ok());
  FakeWorker again(testing::MakeChannel(h->port(), 7), old->id(), "host-a");
  again.set_assignment(assignment);
  again.Attach();
  fleet.ticker->Add(&again);
  auto checkpoint = again.WaitFor(CoordinatorMessage::kCheckpoint);
  ASSERT_TRUE(checkpoint.has_value()) << "the queued CheckpointNow was not delivered";
  absl::SleepFor(absl::Milliseconds(1500));  // past heartbeat_timeout: nobody is LOST
  EXPECT_EQ(h->plane()->registry()->Get(old->id())->state, WorkerState::kBusy);
  again.SendStep(2, 0.5);
  ranks[0]->SendStep(2, 0.5);
  ranks[0]->SendExit(0);
  again.SendExit(0);
  Job done = h->WaitForState(job, Job::SUCCEEDED);
  EXPECT_EQ(done.generation(), 1);
  EXPECT_EQ(done.restart_count(), 0);
  EXPECT_EQ(ranks[0]->CountReceived(CoordinatorMessage::kStop), 0);
  std::printf("rank 1 reconnected on a new stream, got the queued CheckpointNow, kept its rank\n");
}

TEST(SchedulerTest, ReconnectWithAnotherGenerationRestarts) {
  auto h = Harness::Start("sched_reconnect_other.db");
  ASSERT_NE(h, nullptr);
  Fleet fleet(h.get(), 2);
  const std::string job = h->Submit(testing::SmallSpec(1, 2));
  auto ranks = ExpectGeneration(Raw(fleet), job, 1, 2);
  ASSERT_EQ(ranks.size(), 2u);
  FakeWorker* old = ranks[1];
  old->set_heartbeating(false);
  EXPECT_TRUE(old->Close().ok());
  FakeWorker again(testing::MakeChannel(h->port(), 8), old->id(), "host-a");
  again.Attach();  // a restarted process: idle, heartbeats generation 0
  fleet.ticker->Add(&again);
  ASSERT_TRUE(ranks[0]->WaitFor(CoordinatorMessage::kStop).has_value());
  auto ranks2 = ExpectGeneration({ranks[0], &again}, job, 2, 2);
  EXPECT_EQ(ranks2.size(), 2u);
  PrintEvents(h.get(), job);
  EXPECT_TRUE(HasEvent(h.get(), job, Job::RESTARTING, "WORKER_LOST"));
}

TEST(SchedulerTest, WaitsWhenMoreWorkersCouldMakeAPlan) {
  auto h = Harness::Start("sched_wait_plan.db");
  ASSERT_NE(h, nullptr);
  Fleet fleet(h.get(), 3);
  v1::JobSpec spec = testing::SmallSpec(2, 6);
  spec.mutable_training()->set_global_batch_size(5);  // only a world of 5 (or 1) divides it
  const std::string job = h->Submit(spec);
  absl::SleepFor(absl::Milliseconds(600));
  EXPECT_EQ(h->hub()->GetJob(job)->state(), Job::PENDING) << "3 workers < 5: wait, not FAILED";
  std::vector<std::unique_ptr<FakeWorker>> more;
  std::vector<FakeWorker*> all = Raw(fleet);
  for (int i = 0; i < 2; ++i) {
    more.push_back(std::make_unique<FakeWorker>(testing::MakeChannel(h->port()),
                                                absl::StrCat("more", i), "host-b"));
    more.back()->Attach();
    fleet.ticker->Add(more.back().get());
    all.push_back(more.back().get());
  }
  auto ranks = ExpectGeneration(all, job, 1, 5);
  EXPECT_EQ(ranks.size(), 5u);
}

TEST(SchedulerTest, IdleWorkerRunningAnUnknownGenerationGetsOneStop) {
  auto h = Harness::Start("sched_zombie.db");
  ASSERT_NE(h, nullptr);
  FakeWorker zombie(testing::MakeChannel(h->port()), "zombie");
  v1::Assignment stale;
  stale.set_job("jobs/99");
  stale.set_generation(5);
  zombie.set_assignment(stale);
  zombie.set_ack_stop(false);
  zombie.Attach();
  HeartbeatTicker ticker({&zombie}, absl::Milliseconds(100));
  auto stop = zombie.WaitFor(CoordinatorMessage::kStop, absl::Seconds(5));
  ASSERT_TRUE(stop.has_value());
  std::printf("zombie got Stop: %s\n", stop->message.stop().reason().c_str());
  EXPECT_NE(stop->message.stop().reason().find("generation 5"), std::string::npos);
  absl::SleepFor(absl::Milliseconds(1200));  // two more rescans: no second Stop
  EXPECT_EQ(zombie.CountReceived(CoordinatorMessage::kStop), 1);
}

}  // namespace
}  // namespace switchyard::workers
