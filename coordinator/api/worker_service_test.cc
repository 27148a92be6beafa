// File: coordinator/api/worker_service_test.cc
//
// WorkerService.Attach over a real gRPC server on loopback: authentication, the registration
// rules, stream replacement, LOST after heartbeat_timeout on a closed or silent stream (mirrored in
// the SQLite store), and re-adoption of a running job by a restarted coordinator.
#include "coordinator/api/worker_service.h"

#include <memory>
#include <string>

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

void WaitUntil(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(done());
}

void ExpectRefused(FakeWorker& worker, grpc::StatusCode code, const std::string& needle) {
  std::optional<grpc::Status> end = worker.WaitForEnd();
  ASSERT_TRUE(end.has_value()) << "stream not ended";
  EXPECT_EQ(end->error_code(), code) << end->error_message();
  EXPECT_NE(end->error_message().find(needle), std::string::npos) << end->error_message();
  std::printf("refused (%d): %s\n", static_cast<int>(end->error_code()),
              end->error_message().c_str());
}

TEST(WorkerServiceTest, RefusesBadStreams) {
  auto h = Harness::Start("service_refuse.db");
  ASSERT_NE(h, nullptr);
  {
    FakeWorker w(testing::MakeChannel(h->port()), "no-token");
    w.Attach(nullptr);
    ExpectRefused(w, grpc::StatusCode::UNAUTHENTICATED, "");
  }
  {
    FakeWorker w(testing::MakeChannel(h->port()), "wrong-token");
    w.Attach("not-the-token");
    ExpectRefused(w, grpc::StatusCode::UNAUTHENTICATED, "");
  }
  {
    FakeWorker w(testing::MakeChannel(h->port()), "");  // empty worker_id
    w.Attach();
    ExpectRefused(w, grpc::StatusCode::INVALID_ARGUMENT, "registration.worker_id");
  }
  {
    FakeWorker w(testing::MakeChannel(h->port()), "heartbeat-first");
    w.Attach(testing::kWorkerToken, /*register_first=*/false);
    w.Heartbeat();
    ExpectRefused(w, grpc::StatusCode::FAILED_PRECONDITION, "first WorkerMessage");
  }
  {
    FakeWorker w(testing::MakeChannel(h->port()), "twice");
    w.Attach();
    v1::WorkerMessage again;
    again.mutable_registration()->set_worker_id("twice");
    again.mutable_registration()->set_host("host-a");
    w.SendRaw(again);
    ExpectRefused(w, grpc::StatusCode::FAILED_PRECONDITION, "exactly once");
  }
  {
    FakeWorker w(testing::MakeChannel(h->port()), "empty-message");
    w.Attach();
    w.SendRaw(v1::WorkerMessage());
    ExpectRefused(w, grpc::StatusCode::INVALID_ARGUMENT, "WorkerMessage.msg must be set");
  }
  {
    FakeWorker w(testing::MakeChannel(h->port()), "negative-generation");
    w.Attach();
    v1::WorkerMessage hb;
    hb.mutable_heartbeat()->set_generation(-3);
    w.SendRaw(hb);
    ExpectRefused(w, grpc::StatusCode::INVALID_ARGUMENT, "heartbeat.generation (-3)");
  }
  // Nothing refused before registering left a worker behind.
  EXPECT_FALSE(h->plane()->registry()->Get("no-token").has_value());
  EXPECT_FALSE(h->plane()->registry()->Get("heartbeat-first").has_value());
}

TEST(WorkerServiceTest, ClosedStreamAndMissedHeartbeatsMarkLost) {
  auto h = Harness::Start("service_lost.db");
  ASSERT_NE(h, nullptr);
  cluster::WorkerRegistry* registry = h->plane()->registry();
  FakeWorker closing(testing::MakeChannel(h->port()), "closing");
  closing.Attach();
  FakeWorker silent(testing::MakeChannel(h->port()), "silent");
  silent.Attach();
  WaitUntil([&] { return registry->CountInState(cluster::WorkerState::kIdle) == 2; });
  auto row = h->store()->GetWorker("silent");
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->state, store::WorkerState::kIdle);
  EXPECT_EQ(row->host, "host-a");
  EXPECT_EQ(row->version, "fake-0");

  grpc::Status closed = closing.Close();
  EXPECT_TRUE(closed.ok()) << closed.error_message();
  // Disconnected at once (no longer offered to jobs), LOST only after heartbeat_timeout.
  WaitUntil([&] { return !registry->Get("closing")->connected; });
  EXPECT_NE(registry->Get("closing")->state, cluster::WorkerState::kLost);
  EXPECT_EQ(registry->Idle().size(), 1u);
  WaitUntil([&] { return registry->Get("closing")->state == cluster::WorkerState::kLost; });

  // "silent" never heartbeats: LOST after heartbeat_timeout (1 s), its stream ended.
  const absl::Time start = absl::Now();
  WaitUntil([&] { return registry->Get("silent")->state == cluster::WorkerState::kLost; });
  const absl::Duration after = absl::Now() - start;
  std::printf("silent worker LOST after %s (timeout 1s, monitor 100ms)\n",
              absl::FormatDuration(after).c_str());
  EXPECT_LT(after, absl::Seconds(3));
  ExpectRefused(silent, grpc::StatusCode::UNAVAILABLE, "LOST");
  row = h->store()->GetWorker("silent");
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->state, store::WorkerState::kLost);
  EXPECT_EQ(h->store()->GetWorker("closing")->state, store::WorkerState::kLost);
}

TEST(WorkerServiceTest, NewStreamReplacesOldOne) {
  auto h = Harness::Start("service_replace.db");
  ASSERT_NE(h, nullptr);
  FakeWorker first(testing::MakeChannel(h->port(), 1), "same-id");
  first.Attach();
  WaitUntil([&] { return h->plane()->registry()->Get("same-id").has_value(); });
  FakeWorker second(testing::MakeChannel(h->port(), 2), "same-id");
  second.Attach();
  ExpectRefused(first, grpc::StatusCode::ABORTED, "replaces this one");
  second.Heartbeat();
  absl::SleepFor(absl::Milliseconds(200));
  auto info = h->plane()->registry()->Get("same-id");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->state, cluster::WorkerState::kIdle)
      << "the replaced stream must not mark it LOST";
  EXPECT_EQ(info->heartbeats, 1);
}

v1::Assignment RunningAssignment(FakeWorker& w) {
  std::optional<v1::Assignment> a = w.assignment();
  EXPECT_TRUE(a.has_value());
  return a ? *a : v1::Assignment();
}

// What the first coordinator leaves for its successor on the same store file.
struct FirstLife {
  std::string job;
  v1::Assignment a0, a1;  // the running assignments of the workers `id0` and `id1`
};

// The first coordinator's life over a fresh `store_name`: workers `id0` and `id1` attach,
// `spec` starts on both, the first `reporting` of them (1 or 2) send step 1, the job is RUNNING
// and the coordinator exits while the workers keep training. With `check_shutdown`, `id0`'s
// stream must end UNAVAILABLE "shutting down". ASSERTs: call through ASSERT_NO_FATAL_FAILURE.
void RunFirstCoordinator(const std::string& store_name, const std::string& id0,
                         const std::string& id1, const v1::JobSpec& spec, int reporting,
                         bool check_shutdown, FirstLife* out) {
  auto h = Harness::Start(store_name);
  ASSERT_NE(h, nullptr);
  FakeWorker w0(testing::MakeChannel(h->port()), id0);
  FakeWorker w1(testing::MakeChannel(h->port()), id1);
  w0.Attach();
  w1.Attach();
  HeartbeatTicker ticker({&w0, &w1}, absl::Milliseconds(200));
  WaitUntil([&] { return h->plane()->registry()->CountInState(cluster::WorkerState::kIdle) == 2; });
  out->job = h->Submit(spec);
  ASSERT_TRUE(w0.WaitFor(CoordinatorMessage::kStart).has_value());
  ASSERT_TRUE(w1.WaitFor(CoordinatorMessage::kStart).has_value());
  w0.SendStep(1, 1.0);
  if (reporting > 1) w1.SendStep(1, 1.0);
  h->WaitForState(out->job, Job::RUNNING);
  out->a0 = RunningAssignment(w0);
  out->a1 = RunningAssignment(w1);
  h->Stop();  // the coordinator exits; the workers keep training
  if (check_shutdown) ExpectRefused(w0, grpc::StatusCode::UNAVAILABLE, "shutting down");
}

TEST(WorkerServiceTest, RestartedCoordinatorReadoptsRunningJob) {
  FirstLife first;
  ASSERT_NO_FATAL_FAILURE(RunFirstCoordinator("service_readopt.db", "keep-0", "keep-1",
                                              testing::SmallSpec(2, 2), /*reporting=*/2,
                                              /*check_shutdown=*/true, &first));
  const std::string& job = first.job;
  auto h = Harness::Start("service_readopt.db", /*fresh=*/false);
  ASSERT_NE(h, nullptr);
  FakeWorker w0(testing::MakeChannel(h->port()), "keep-0");
  FakeWorker w1(testing::MakeChannel(h->port()), "keep-1");
  w0.set_assignment(first.a0);
  w1.set_assignment(first.a1);
  w0.Attach();
  w1.Attach();
  HeartbeatTicker ticker({&w0, &w1}, absl::Milliseconds(200));
  WaitUntil([&] {
    for (const jobs::RunSnapshot& run : h->plane()->scheduler()->Runs()) {
      if (run.job == job && run.running) {
        auto info = h->plane()->registry()->Get("keep-0");
        return info && info->state == cluster::WorkerState::kBusy && info->heartbeats > 0;
      }
    }
    return false;
  });
  w0.SendStep(2, 0.5);
  w1.SendStep(2, 0.6);
  w0.SendExit(0);
  w1.SendExit(0);
  Job done = h->WaitForState(job, Job::SUCCEEDED);
  EXPECT_EQ(done.generation(), 1) << "re-adopted, not restarted";
  EXPECT_EQ(done.restart_count(), 0);
  EXPECT_EQ(w0.CountReceived(CoordinatorMessage::kAssignment), 0);
  EXPECT_EQ(w0.CountReceived(CoordinatorMessage::kStop), 0);
  ASSERT_TRUE(h->plane()->steps()->LastStep(job).has_value());
  EXPECT_EQ(h->plane()->steps()->LastStep(job)->step(), 2);
  std::printf("%s re-adopted at generation %lld by the restarted coordinator, then SUCCEEDED\n",
              job.c_str(), static_cast<long long>(done.generation()));
}

TEST(WorkerServiceTest, RestartedCoordinatorAcceptsExitsSentOnReattach) {
  FirstLife first;
  ASSERT_NO_FATAL_FAILURE(RunFirstCoordinator("service_queued_exit.db", "q-0", "q-1",
                                              testing::SmallSpec(2, 2), /*reporting=*/1,
                                              /*check_shutdown=*/false, &first));
  // Training finished during the outage: each worker re-attaches and sends its queued
  // WorkerExit(0) right after the registration, before any heartbeat.
  auto h = Harness::Start("service_queued_exit.db", /*fresh=*/false);
  ASSERT_NE(h, nullptr);
  FakeWorker w0(testing::MakeChannel(h->port()), "q-0");
  FakeWorker w1(testing::MakeChannel(h->port()), "q-1");
  w0.set_assignment(first.a0);
  w0.Attach();
  w0.SendExit(0, "train_iters reached while the coordinator was away");
  HeartbeatTicker ticker({&w0}, absl::Milliseconds(100));
  // w0 now heartbeats generation 0 while w1 is still away: the job must not restart for that.
  absl::SleepFor(absl::Milliseconds(700));
  w1.set_assignment(first.a1);
  w1.Attach();
  w1.SendExit(0, "train_iters reached while the coordinator was away");
  ticker.Add(&w1);
  Job done = h->WaitForState(first.job, Job::SUCCEEDED);
  EXPECT_EQ(done.generation(), 1);
  EXPECT_EQ(done.restart_count(), 0);
  EXPECT_EQ(w0.CountReceived(CoordinatorMessage::kStop), 0);
}

TEST(WorkerServiceTest, RestartedCoordinatorRestartsJobWhenAWorkerIsMissing) {
  FirstLife first;
  ASSERT_NO_FATAL_FAILURE(RunFirstCoordinator("service_missing.db", "back", "gone",
                                              testing::SmallSpec(1, 2), /*reporting=*/1,
                                              /*check_shutdown=*/false, &first));
  auto h = Harness::Start("service_missing.db", /*fresh=*/false);
  ASSERT_NE(h, nullptr);
  FakeWorker w0(testing::MakeChannel(h->port()), "back");
  w0.set_assignment(first.a0);
  w0.Attach();
  HeartbeatTicker ticker({&w0}, absl::Milliseconds(200));
  // After adopt_grace (3 s) without "gone": Stop to "back", then generation 2 on it alone.
  auto stop = w0.WaitFor(CoordinatorMessage::kStop);
  ASSERT_TRUE(stop.has_value());
  std::printf("Stop: %s\n", stop->message.stop().reason().c_str());
  EXPECT_NE(stop->message.stop().reason().find("COORDINATOR_RESTARTED"), std::string::npos);
  auto next = w0.WaitFor(CoordinatorMessage::kAssignment);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->message.assignment().generation(), 2);
  EXPECT_EQ(next->message.assignment().world_size(), 1);
  Job job_now = h->WaitForState(first.job, Job::STARTING);
  EXPECT_EQ(job_now.restart_count(), 1);
}

}  // namespace
}  // namespace switchyard::api
