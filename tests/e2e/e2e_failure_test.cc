// End-to-end failure tests with real processes on loopback (see e2e_test.cc): a worker
// SIGKILLed or SIGSTOPped mid-job (restart at world 1 from the last checkpoint), the restart
// limit, a permanent worker error, and the coordinator SIGKILLed and restarted on the same store
// and ports. Each test prints the event log, the steps and its timings.
//
//   e2e_failure_test <switchyard-coordinator> <switchyard-worker>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "gtest/gtest.h"
#include "switchyard/v1/job.grpc.pb.h"
#include "tests/e2e/e2e_cluster.h"
#include "tests/e2e/e2e_util.h"

namespace switchyard::e2e {
namespace {

TEST(E2eTest, KilledWorkerRestartsTheJobOnTheSurvivorFromTheLastCheckpoint) {
  Cluster c("kill_worker");
  ASSERT_NO_FATAL_FAILURE(StartTwoWorkers(c));
  const std::string job = c.Submit("kill-worker-1");
  ASSERT_FALSE(job.empty());
  JobWatcher watch(c.coordinator()->grpc_address(), job);
  ASSERT_TRUE(watch.WaitForStep(12, 60)) << (watch.Print(), c.PrintLogs(), "");
  const absl::Time killed = absl::Now();
  c.worker(1).Signal(SIGKILL);
  int64_t last_before = 0;
  for (const SeenStep& s : watch.Steps()) last_before = std::max(last_before, s.metrics.step());
  std::printf("SIGKILL worker 1 (pid %d) after step %lld\n", c.worker(1).pid(),
              static_cast<long long>(last_before));

  ASSERT_TRUE(watch.WaitForState(Job::RESTARTING, 60)) << (watch.Print(), c.PrintLogs(), "");
  const double to_restarting = Seconds(killed);
  ASSERT_TRUE(watch.WaitForState(Job::STARTING, 60, 2)) << (watch.Print(), c.PrintLogs(), "");
  const double to_starting = Seconds(killed);
  const Job::State end = watch.WaitForEnd(120);
  std::printf("killed -> RESTARTING %.2f s, -> STARTING gen 2 %.2f s, -> %s %.2f s\n",
              to_restarting, to_starting, Job::State_Name(end).c_str(), Seconds(killed));
  watch.Print();
  if (end != Job::SUCCEEDED) c.PrintLogs();
  ASSERT_EQ(end, Job::SUCCEEDED);

  const std::vector<SeenEvent> events = watch.Events();
  const v1::JobEvent* restarting = FindEvent(events, Job::RESTARTING, 1);
  ASSERT_NE(restarting, nullptr);
  // Whichever the coordinator learns first: the dead worker's missing heartbeats (WORKER_LOST,
  // after heartbeat_timeout) or the survivor's retryable exit when Gloo sees the peer's socket
  // close (WORKER_FAILED, 128 + UNAVAILABLE). On loopback the second comes first.
  EXPECT_TRUE(restarting->reason() == "WORKER_LOST" ||
              (restarting->reason() == "WORKER_FAILED" &&
               restarting->message().find("exited with code 142") != std::string::npos))
      << restarting->reason() << ": " << restarting->message();
  const v1::JobEvent* second = FindEvent(events, Job::STARTING, 2);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(WorldOf(*second), 1) << second->message();  // DP shrinks to the survivor
  const Job final_job = c.Get(job);
  EXPECT_EQ(final_job.restart_count(), 1);

  ExpectResumedFromCheckpoint(watch, c, job, "kill-worker-1");
  EXPECT_EQ(c.Attached(), 1);  // the killed worker is gone from the registry
}

// A hung worker (SIGSTOP: sockets open, no heartbeats) is marked LOST after the coordinator's
// heartbeat_timeout (5 s): RESTARTING with reason WORKER_LOST, and the survivor, blocked in a
// collective with the hung peer, is stopped at once (Stop aborts its communicators, which wakes
// the blocked collective) and resumes alone, as for a killed worker. The workers run with the
// binary's default --comm-timeout (60 s): a survivor that waits for its collective to time out
// fails the RUNNING bound (measured without the fix in GlooCommunicator::Abort: STARTING of
// generation 2 after 7.0 s, as the Stop is acknowledged after stop_report_after regardless, but
// RUNNING only after 60.2 s, the next Start waiting for the blocked thread). Then SIGCONT: the
// stale worker's old generation is over; it re-attaches, is stopped and idle, and nothing else
// happens to the job (no third generation, one restart, it still resumes from the checkpoint and
// succeeds).
//
// Bounds, from the coordinator's settings (heartbeat_timeout 5 s, monitor every 250 ms, workers
// heartbeat every 1 s): LOST is declared 5 to 5.25 s after the last heartbeat, i.e. 4 to 5.3 s
// after the SIGSTOP; 10 s leaves 4.7 s for a loaded 2-core machine. STARTING of generation 2
// needs the survivor's WorkerExit(143) (at most stop_report_after = 2 s after the Stop) and a
// schedule pass, RUNNING its first step at world 1 (measured 5.4 s after the SIGSTOP); 20 s for
// both is far below the 60 s a timed-out collective takes.
TEST(E2eTest, HungWorkerIsLostWithinTheHeartbeatTimeoutAndResumedWorkerIsStoppedCleanly) {
  Cluster c("hung_worker");
  ASSERT_NO_FATAL_FAILURE(StartTwoWorkers(c, /*comm_timeout_s=*/60));
  const std::string job = c.Submit("hung-worker-1");
  ASSERT_FALSE(job.empty());
  JobWatcher watch(c.coordinator()->grpc_address(), job);
  ASSERT_TRUE(watch.WaitForStep(12, 60)) << (watch.Print(), c.PrintLogs(), "");
  const absl::Time stopped = absl::Now();
  c.worker(1).Signal(SIGSTOP);
  std::printf("SIGSTOP worker 1 (pid %d) after step %lld\n", c.worker(1).pid(),
              static_cast<long long>(watch.Steps().back().metrics.step()));
  const bool restarting = watch.WaitForState(Job::RESTARTING, 30);
  const double to_restarting = Seconds(stopped);
  const bool starting = restarting && watch.WaitForState(Job::STARTING, 60, 2);
  const double to_starting = Seconds(stopped);
  const bool running = starting && watch.WaitForState(Job::RUNNING, 60, 2);
  const double to_running = Seconds(stopped);
  std::printf("SIGSTOP -> RESTARTING %.2f s -> STARTING gen 2 %.2f s -> RUNNING gen 2 %.2f s\n",
              to_restarting, to_starting, to_running);
  if (!running) c.worker(1).Signal(SIGKILL);
  ASSERT_TRUE(running) << (watch.Print(), c.PrintLogs(), "");
  EXPECT_GE(to_restarting, 4.0);  // not before the 5 s heartbeat timeout (1 s heartbeats)
  EXPECT_LT(to_restarting, 10.0);
  EXPECT_LT(to_starting, 20.0);
  EXPECT_LT(to_running, 20.0) << "the survivor waited for its blocked collective to time out";

  // SIGCONT: the stale worker finds its stream gone and its peer's connections closed.
  const absl::Time resumed = absl::Now();
  c.worker(1).Signal(SIGCONT);
  std::printf("SIGCONT worker 1 at step %lld of generation 2\n",
              static_cast<long long>(watch.Steps().back().metrics.step()));
  const bool reattached = c.WaitForAttached(2, 30);
  std::printf("worker 1 re-attached %.2f s after SIGCONT\n", Seconds(resumed));
  EXPECT_TRUE(reattached) << (c.PrintLogs(), "");
  bool idle = false;
  const absl::Time idle_deadline = absl::Now() + absl::Seconds(30);
  while (!idle && absl::Now() < idle_deadline) {
    idle = c.WorkerGeneration(1) == 0;
    if (!idle) absl::SleepFor(absl::Milliseconds(100));
  }
  std::printf("worker 1 idle (switchyard_worker_generation 0) %.2f s after SIGCONT: %s\n",
              Seconds(resumed), idle ? "yes" : "no");
  EXPECT_TRUE(idle) << "the stale generation must end on the resumed worker";
  for (absl::string_view line : absl::StrSplit(c.worker(1).Log(), '\n')) {
    if (absl::StrContains(line, "generation 1") || absl::StrContains(line, "attached") ||
        absl::StrContains(line, "reconnect")) {
      std::printf("worker 1: %s\n", std::string(line).c_str());
    }
  }

  const Job::State end = watch.WaitForEnd(120);
  std::printf("-> %s %.2f s after SIGSTOP\n", Job::State_Name(end).c_str(), Seconds(stopped));
  watch.Print();
  if (end != Job::SUCCEEDED) c.PrintLogs();
  ASSERT_EQ(end, Job::SUCCEEDED);
  const std::vector<SeenEvent> events = watch.Events();
  const v1::JobEvent* lost = FindEvent(events, Job::RESTARTING, 1);
  ASSERT_NE(lost, nullptr);
  EXPECT_EQ(lost->reason(), "WORKER_LOST") << lost->message();
  const v1::JobEvent* second = FindEvent(events, Job::STARTING, 2);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(WorldOf(*second), 1) << second->message();
  EXPECT_EQ(FindEvent(events, Job::RESTARTING, 2), nullptr) << "the resumed worker disturbed "
                                                               "generation 2";
  EXPECT_EQ(FindEvent(events, Job::STARTING, 3), nullptr);
  EXPECT_EQ(c.Get(job).restart_count(), 1);
  ExpectResumedFromCheckpoint(watch, c, job, "hung-worker-1");
  EXPECT_TRUE(c.worker(1).Running()) << "the resumed worker stays up, idle";
  EXPECT_EQ(c.Attached(), 2);
}

// max_restarts 0: the first lost worker fails the job (RESTART_LIMIT_EXCEEDED) instead of
// restarting it.
TEST(E2eTest, LostWorkerPastMaxRestartsFailsTheJob) {
  Cluster c("restart_limit");
  ASSERT_NO_FATAL_FAILURE(StartTwoWorkers(c));
  const std::string job =
      c.Submit("restart-limit-1", 1, [](v1::JobSpec& spec) { spec.set_max_restarts(0); });
  ASSERT_FALSE(job.empty());
  JobWatcher watch(c.coordinator()->grpc_address(), job);
  ASSERT_TRUE(watch.WaitForStep(6, 60)) << (watch.Print(), c.PrintLogs(), "");
  const absl::Time killed = absl::Now();
  c.worker(1).Signal(SIGKILL);
  const Job::State end = watch.WaitForEnd(60);
  std::printf("SIGKILL worker 1 with max_restarts 0 -> %s after %.2f s\n",
              Job::State_Name(end).c_str(), Seconds(killed));
  watch.Print();
  ASSERT_EQ(end, Job::FAILED) << (c.PrintLogs(), "");
  const std::vector<SeenEvent> events = watch.Events();
  EXPECT_EQ(events.back().event.reason(), "RESTART_LIMIT_EXCEEDED")
      << events.back().event.message();
  EXPECT_EQ(FindEvent(events, Job::STARTING, 2), nullptr);
  const Job final_job = c.Get(job);
  std::printf("failure_reason: %s\n", final_job.failure_reason().c_str());
  EXPECT_FALSE(final_job.failure_reason().empty());
}

// A spec the coordinator accepts but the workers cannot run (its data file does not exist): the
// ranks exit with a permanent code and the job FAILS at once with their message, no restart.
TEST(E2eTest, PermanentWorkerErrorFailsTheJobWithoutRestart) {
  Cluster c("permanent");
  ASSERT_NO_FATAL_FAILURE(StartTwoWorkers(c));
  const std::string missing = "permanent_no_such_dataset";  // under the cluster's data root
  const std::string job = c.Submit("permanent-1", 2, [&](v1::JobSpec& spec) {
    spec.mutable_data()->set_mock_data(false);
    spec.mutable_data()->add_data_path(missing);
  });
  ASSERT_FALSE(job.empty());
  const absl::Time t0 = absl::Now();
  JobWatcher watch(c.coordinator()->grpc_address(), job);
  const Job::State end = watch.WaitForEnd(60);
  std::printf("%s -> %s after %.2f s\n", job.c_str(), Job::State_Name(end).c_str(), Seconds(t0));
  watch.Print();
  ASSERT_EQ(end, Job::FAILED) << (c.PrintLogs(), "");
  const std::vector<SeenEvent> events = watch.Events();
  const v1::JobEvent& failed = events.back().event;
  EXPECT_EQ(failed.reason(), "WORKER_EXIT_PERMANENT") << failed.message();
  EXPECT_NE(failed.message().find("permanent_no_such_dataset"), std::string::npos)
      << failed.message();
  EXPECT_EQ(FindEvent(events, Job::RESTARTING, 1), nullptr);
  EXPECT_TRUE(watch.Steps().empty());
  EXPECT_TRUE(c.WaitForAttached(2, 10));  // both workers survive and are idle again
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(c.worker(i).Running());
}

TEST(E2eTest, KilledCoordinatorRestartsOnTheSameStoreAndTheJobCompletes) {
  Cluster c("kill_coordinator");
  ASSERT_NO_FATAL_FAILURE(StartTwoWorkers(c));
  const std::string job = c.Submit("kill-coordinator-1");
  ASSERT_FALSE(job.empty());
  auto watch = std::make_unique<JobWatcher>(c.coordinator()->grpc_address(), job);
  ASSERT_TRUE(watch->WaitForStep(10, 60)) << (watch->Print(), c.PrintLogs(), "");
  const std::vector<SeenEvent> before = watch->Events();
  const absl::Time killed = absl::Now();
  const pid_t old_pid = c.coordinator()->pid();
  c.KillCoordinator();
  std::printf("SIGKILL coordinator pid %d at step %lld with %zu events\n", old_pid,
              static_cast<long long>(watch->Steps().back().metrics.step()), before.size());
  ASSERT_TRUE(c.StartCoordinator()) << (c.PrintLogs(), "");
  std::printf("coordinator restarted on the same ports after %.2f s\n", Seconds(killed));
  const bool reattached = c.WaitForAttached(2, 30);
  std::printf("both workers re-attached %.2f s after the kill\n", Seconds(killed));
  EXPECT_TRUE(reattached);
  for (int i = 0; i < 2; ++i) {
    for (absl::string_view line : absl::StrSplit(c.worker(i).Log(), '\n')) {
      if (absl::StrContains(line, "attached") || absl::StrContains(line, "reconnect")) {
        std::printf("worker %d: %s\n", i, std::string(line).c_str());
      }
    }
  }

  const Job::State end = watch->WaitForEnd(120);
  std::printf("-> %s %.2f s after the kill (watch streams opened: %d)\n",
              Job::State_Name(end).c_str(), Seconds(killed), watch->watches());
  watch->Print();
  if (end != Job::SUCCEEDED) c.PrintLogs();
  ASSERT_EQ(end, Job::SUCCEEDED);
  EXPECT_GE(watch->watches(), 2);

  // The event log after the restart starts with the events seen before the kill.
  const std::vector<v1::JobEvent> log = c.Replay(job);
  ASSERT_GE(log.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(log[i].sequence(), before[i].event.sequence());
    EXPECT_EQ(log[i].state(), before[i].event.state());
    EXPECT_EQ(log[i].generation(), before[i].event.generation());
    EXPECT_EQ(log[i].reason(), before[i].event.reason());
  }
  std::printf("replayed log after restart: %zu events, the %zu from before the kill intact\n",
              log.size(), before.size());
  EXPECT_EQ(log.back().state(), Job::SUCCEEDED);
  // Both workers are attached to the new process again, and the job finished in generation 1:
  // the new coordinator re-adopted the running generation (or, when the workers re-attached only
  // after finishing, counted their WorkerExit(0)) instead of restarting the job.
  EXPECT_TRUE(c.WaitForAttached(2, 20));
  for (const v1::JobEvent& e : log) {
    EXPECT_EQ(e.generation(), e.state() == Job::PENDING ? 0 : 1) << e.ShortDebugString();
  }
  std::printf("new coordinator log %s 're-adopted %s generation 1'\n",
              c.coordinator()->process().Log().find("re-adopted " + job) != std::string::npos
                  ? "says"
                  : "does not say (the workers' WorkerExit(0) came first)",
              job.c_str());
  EXPECT_EQ(c.Get(job).restart_count(), 0);
}

}  // namespace
}  // namespace switchyard::e2e
