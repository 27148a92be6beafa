// End-to-end tests of a job's normal life with real processes on loopback: the
// switchyard-coordinator binary (SQLite store and token file in TEST_TMPDIR) and
// switchyard-worker --coordinator agents training a tiny CPU MoE job over Gloo: success on two
// workers (matching one standalone process), cancel, the token. Jobs are submitted and cancelled
// through REST and watched through gRPC WatchJob; each test prints the event log, the steps and
// its timings.
//
//   e2e_test <switchyard-coordinator> <switchyard-worker>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
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

TEST(E2eTest, SubmitTrainsOnTwoWorkersToSucceeded) {
  Cluster c("succeed");
  ASSERT_NO_FATAL_FAILURE(StartTwoWorkers(c));
  const absl::Time t0 = absl::Now();
  const std::string job = c.Submit("succeed-1");
  ASSERT_FALSE(job.empty());
  JobWatcher watch(c.coordinator()->grpc_address(), job);
  const Job::State end = watch.WaitForEnd(120);
  std::printf("%s ended %s after %.2f s\n", job.c_str(), Job::State_Name(end).c_str(), Seconds(t0));
  watch.Print();
  if (end != Job::SUCCEEDED) c.PrintLogs();
  ASSERT_EQ(end, Job::SUCCEEDED);

  const std::vector<SeenEvent> events = watch.Events();
  const v1::JobEvent* starting = FindEvent(events, Job::STARTING, 1);
  ASSERT_NE(starting, nullptr);
  EXPECT_EQ(WorldOf(*starting), 2) << starting->message();
  EXPECT_NE(FindEvent(events, Job::RUNNING, 1), nullptr);
  EXPECT_EQ(FindEvent(events, Job::RESTARTING, 1), nullptr);
  const Job final_job = c.Get(job);
  EXPECT_EQ(final_job.generation(), 1);
  EXPECT_EQ(final_job.restart_count(), 0);

  const std::vector<SeenStep> steps = watch.Steps();
  ASSERT_GE(steps.size(), 10u);
  EXPECT_EQ(steps.back().metrics.step(), kTrainIters);
  const double first = MeanLoss(steps, 0, 5),
               last = MeanLoss(steps, steps.size() - 5, steps.size());
  std::printf("loss: step %lld %.4f .. step %lld %.4f; mean of first 5 %.4f, last 5 %.4f\n",
              static_cast<long long>(steps.front().metrics.step()), steps.front().metrics.loss(),
              static_cast<long long>(steps.back().metrics.step()), steps.back().metrics.loss(),
              first, last);
  EXPECT_LT(last, first - 0.1);

  // The same spec trained by one standalone process: data parallelism over the coordinator's
  // two workers must give the same losses (DESIGN.md: distributed runs match the single-rank run
  // on the same global batch, to fp32 rounding on CPU; the standalone log prints 4 decimals).
  auto spec = ParseJobSpecYaml(kSpec);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ExpectSameLossesAsStandalone(*spec, "succeed", steps, "world 2");
}

TEST(E2eTest, CancelMidJobEndsEveryWorkersGeneration) {
  Cluster c("cancel");
  ASSERT_NO_FATAL_FAILURE(StartTwoWorkers(c));
  const std::string job = c.Submit("cancel-1");
  ASSERT_FALSE(job.empty());
  JobWatcher watch(c.coordinator()->grpc_address(), job);
  ASSERT_TRUE(watch.WaitForStep(8, 60)) << (watch.Print(), c.PrintLogs(), "");
  const double gen0 = c.WorkerGeneration(0), gen1 = c.WorkerGeneration(1);
  std::printf("before cancel: switchyard_worker_generation %g %g\n", gen0, gen1);
  EXPECT_EQ(gen0, 1);
  EXPECT_EQ(gen1, 1);
  const absl::Time cancelled = absl::Now();
  auto r =
      c.http().Post(absl::StrCat("/v1/", job, ":cancel"), AuthHeaders(), "", "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(Json::parse(r->body)["state"], "CANCELLED") << r->body;
  ASSERT_EQ(watch.WaitForEnd(10), Job::CANCELLED);
  const double to_cancelled = Seconds(cancelled);

  // Each worker ends its generation (Stop -> WorkerExit 143) and reports generation 0 again.
  double idle_after[2] = {-1, -1};
  while (Seconds(cancelled) < 10 && (idle_after[0] < 0 || idle_after[1] < 0)) {
    for (int i = 0; i < 2; ++i) {
      if (idle_after[i] < 0 && c.WorkerGeneration(i) == 0) idle_after[i] = Seconds(cancelled);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Idle in the coordinator's registry too: a job that needs both workers starts at once.
  const std::string next = c.Submit("cancel-2", /*min_workers=*/2);
  ASSERT_FALSE(next.empty());
  JobWatcher next_watch(c.coordinator()->grpc_address(), next);
  const bool next_started = next_watch.WaitForState(Job::STARTING, 20);
  const double to_reused = Seconds(cancelled);
  const bool next_running = next_watch.WaitForState(Job::RUNNING, 60);
  const double to_next_step = Seconds(cancelled);
  const Job::State next_end = next_watch.WaitForEnd(120);
  watch.Print();
  next_watch.Print();
  std::printf(
      "cancel -> CANCELLED %.3f s; worker 0 idle (generation 0 on its /metrics) %.3f s, "
      "worker 1 %.3f s; a min_workers=2 job STARTING %.3f s; it ended %s\n",
      to_cancelled, idle_after[0], idle_after[1], to_reused, Job::State_Name(next_end).c_str());
  // The cancelled generation's training thread unwinds at once (Stop aborts its communicators,
  // which wakes a blocked collective), so the next Start does not wait for --comm-timeout
  // (10 s here). Printed, not asserted.
  std::printf(
      "the next job's first step came %.3f s after the cancel (workers' --comm-timeout "
      "10 s)\n",
      to_next_step);
  EXPECT_TRUE(next_running);
  for (int i = 0; i < 2; ++i) {
    const std::string log = c.worker(i).Log();
    const size_t at = log.find("exit 143");
    const size_t begin = at == std::string::npos ? 0 : log.rfind('\n', at) + 1;
    std::printf("worker %d: %s\n", i,
                at == std::string::npos ? "(no exit 143 line)"
                                        : log.substr(begin, log.find('\n', at) - begin).c_str());
    EXPECT_NE(at, std::string::npos) << log;
    EXPECT_GE(idle_after[i], 0) << "worker " << i << " still reports a generation";
    EXPECT_LT(idle_after[i], 5.0);
  }
  ASSERT_TRUE(next_started) << (c.PrintLogs(), "");
  const std::vector<SeenEvent> next_events = next_watch.Events();
  const v1::JobEvent* starting = FindEvent(next_events, Job::STARTING, 1);
  ASSERT_NE(starting, nullptr);
  EXPECT_EQ(WorldOf(*starting), 2) << starting->message();
  EXPECT_LT(to_reused, 5.0);
  // No step of the cancelled job after its CANCELLED event.
  double cancel_at = 0;
  for (const SeenEvent& e : watch.Events()) {
    if (e.event.state() == Job::CANCELLED) cancel_at = e.at;
  }
  for (const SeenStep& s : watch.Steps()) EXPECT_LE(s.at, cancel_at + 0.5) << s.metrics.step();
  EXPECT_EQ(next_end, Job::SUCCEEDED);
  EXPECT_EQ(c.Attached(), 2);
}

TEST(E2eTest, CallsWithoutTheTokenAreUnauthenticated) {
  Cluster c("token");
  ASSERT_TRUE(c.StartCoordinator());
  auto r = c.http().Get("/v1/jobs");
  ASSERT_TRUE(r);
  std::printf("GET /v1/jobs without token: %d %s\n", r->status, r->body.c_str());
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(Json::parse(r->body)["error"]["reason"], "MISSING_TOKEN");
  r = c.http().Post("/v1/jobs", {{"Authorization", "Bearer wrong"}}, "{}", "application/json");
  ASSERT_TRUE(r);
  std::printf("POST /v1/jobs with a wrong token: %d %s\n", r->status, r->body.c_str());
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(Json::parse(r->body)["error"]["reason"], "INVALID_TOKEN");

  auto stub = v1::JobService::NewStub(
      grpc::CreateChannel(c.coordinator()->grpc_address(), grpc::InsecureChannelCredentials()));
  v1::ListJobsResponse list;
  grpc::Status s = stub->ListJobs(Context(false).get(), v1::ListJobsRequest(), &list);
  std::printf("gRPC ListJobs without token: %d %s\n", s.error_code(), s.error_message().c_str());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  s = stub->ListJobs(Context(true).get(), v1::ListJobsRequest(), &list);
  EXPECT_TRUE(s.ok()) << s.error_message();

  // A worker with the wrong token is refused and exits 1 (permanent).
  const std::string bad = TmpPath("token_bad.token");
  WriteText(bad, "not-the-token\n");
  Process worker({g_worker, "--coordinator", c.coordinator()->grpc_address(), "--token-file", bad,
                  "--device", "cpu"},
                 TmpPath("token_worker.log"), false);
  const int code = worker.Wait(20);
  std::printf("worker with a wrong token exited %d; stderr:\n%s\n", code, worker.Log().c_str());
  EXPECT_EQ(code, 1);
  EXPECT_EQ(c.Attached(), 0);

  // The API token is not the workers' token: a worker holding it is refused the same way, and
  // the workers' token does not open the API.
  Process user_worker({g_worker, "--coordinator", c.coordinator()->grpc_address(), "--token-file",
                       TmpPath("token.token"), "--device", "cpu"},
                      TmpPath("token_user_worker.log"), false);
  const int user_code = user_worker.Wait(20);
  std::printf("worker with the API token exited %d; stderr:\n%s\n", user_code,
              user_worker.Log().c_str());
  EXPECT_EQ(user_code, 1);
  EXPECT_TRUE(absl::StrContains(user_worker.Log(), "WRONG_ROLE")) << user_worker.Log();
  EXPECT_EQ(c.Attached(), 0);
  r = c.http().Get("/v1/jobs", {{"Authorization", absl::StrCat("Bearer ", kWorkerToken)}});
  ASSERT_TRUE(r);
  std::printf("GET /v1/jobs with the workers' token: %d %s\n", r->status, r->body.c_str());
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(Json::parse(r->body)["error"]["reason"], "WRONG_ROLE");
}

}  // namespace
}  // namespace switchyard::e2e
