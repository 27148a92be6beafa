// File: tests/e2e/e2e_preempt_test.cc
//
// Preemption at checkpoints and scale-up at a checkpoint boundary end to end (issue 18 items 3
// and 4; coordinator/jobs/scheduler.h "Preemption", "Scale-up"): the real switchyard-coordinator
// with --queues=a=2,b=2 and --scale-up-delay=2s, real CPU switchyard-worker agents (Gloo on
// loopback), three jobs of two priorities:
//   - jobs/1 (queue a, priority 0, 2 workers) and jobs/2 (queue b, priority 0, 1..2 workers)
//     start on the 3 workers attached: jobs/1 whole (2), jobs/2 on the one left (never a
//     partial gang: every STARTING event's world is within the job's range);
//   - jobs/3 (default queue, priority 10, 1 worker) preempts the youngest low-priority job that
//     frees enough, jobs/2: an on-demand checkpoint at step N (CHECKPOINT_SAVED), PENDING with
//     PREEMPTED "preempted at step N", jobs/3 runs and SUCCEEDS, jobs/2 resumes (generation 2)
//     with its first step N+1 (continuous); jobs/1 is never stopped;
//   - a 4th worker attaches: jobs/2 (below its max of 2, queue b has room) scales up at an
//     on-demand checkpoint at step M (SCALING_UP "scaling up from 1 to 2 worker(s) at step M"),
//     generation 3 runs on 2 workers from step M+1.
// Every event is read through WatchJob (what `syctl watch` prints).
//
//   e2e_preempt_test <switchyard-coordinator> <switchyard-worker>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/e2e/e2e_cluster.h"
#include "tests/e2e/e2e_util.h"

namespace switchyard::e2e {
namespace {

// The step N of a "... at step N..." message; -1 when absent.
int64_t StepIn(const std::string& message) {
  const size_t at = message.find("at step ");
  if (at == std::string::npos) return -1;
  int64_t step = -1;
  std::string digits;
  for (size_t i = at + 8; i < message.size() && message[i] >= '0' && message[i] <= '9'; ++i) {
    digits.push_back(message[i]);
  }
  if (!absl::SimpleAtoi(digits, &step)) return -1;
  return step;
}

// The last step rank 0 reported in `generation`; -1 when none.
int64_t LastStepOf(const JobWatcher& w, int64_t generation) {
  int64_t last = -1;
  for (const SeenStep& s : w.Steps()) {
    if (s.generation == generation) last = s.metrics.step();
  }
  return last;
}

// The first step rank 0 reported in `generation`; -1 when none.
int64_t FirstStepOf(const JobWatcher& w, int64_t generation) {
  for (const SeenStep& s : w.Steps()) {
    if (s.generation == generation) return s.metrics.step();
  }
  return -1;
}

const v1::JobEvent* Find(const std::vector<SeenEvent>& events, const std::string& reason) {
  for (const SeenEvent& e : events) {
    if (e.event.reason() == reason) return &e.event;
  }
  return nullptr;
}

TEST(E2ePreemptTest, PreemptionResumesContinuouslyAndScaleUpWhenAWorkerAttaches) {
  Cluster c("preempt");
  c.SetQueues("a=2,b=2");
  c.AddCoordinatorFlag("--scale-up-delay=2s");
  ASSERT_TRUE(c.StartCoordinator());
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < 3; ++i) c.StartWorker();
  ASSERT_TRUE(c.WaitForAttached(3, 30)) << (c.PrintLogs(), "");

  auto job = [](const std::string& queue, int priority, int max_workers, int iters) {
    return [=](v1::JobSpec& s) {
      s.set_queue(queue);
      s.set_priority(priority);
      s.set_max_workers(max_workers);
      s.mutable_training()->set_train_iters(iters);
    };
  };
  const std::string j1 = c.Submit("low-a", 2, job("a", 0, 2, 100000));
  ASSERT_EQ(j1, "jobs/1");
  JobWatcher w1(c.coordinator()->grpc_address(), j1);
  ASSERT_TRUE(w1.WaitForStep(1, 60)) << (c.PrintLogs(), "");
  const std::string j2 = c.Submit("low-b", 1, job("b", 0, 2, 100000));
  JobWatcher w2(c.coordinator()->grpc_address(), j2);
  ASSERT_TRUE(w2.WaitForStep(3, 60)) << (c.PrintLogs(), "");

  const std::string j3 = c.Submit("high", 1, job("", 10, 1, 20));
  JobWatcher w3(c.coordinator()->grpc_address(), j3);
  const Job::State e3 = w3.WaitForEnd(120);
  if (e3 != Job::SUCCEEDED) c.PrintLogs();
  ASSERT_EQ(e3, Job::SUCCEEDED);
  ASSERT_TRUE(w2.WaitForState(Job::RUNNING, 60, 2)) << (c.PrintLogs(), "");

  // Scale-up: a 4th worker attaches; jobs/2 grows to 2 at a checkpoint.
  c.StartWorker();
  const bool grew = w2.WaitForState(Job::RUNNING, 90, 3);
  const int64_t resumed_at = FirstStepOf(w2, 2);
  absl::SleepFor(absl::Seconds(2));  // a few steps of generation 3
  for (const std::string& name : {j1, j2}) {
    auto r = c.http().Post(absl::StrCat("/v1/", name, ":cancel"), AuthHeaders(), "{}",
                           "application/json");
    EXPECT_TRUE(r && r->status == 200) << name;
  }
  EXPECT_EQ(w1.WaitForEnd(60), Job::CANCELLED);
  EXPECT_EQ(w2.WaitForEnd(60), Job::CANCELLED);
  std::printf("ended after %.2f s\n", Seconds(t0));
  for (JobWatcher* w : {&w1, &w2, &w3}) w->Print();
  if (!grew) c.PrintLogs();
  ASSERT_TRUE(grew) << "jobs/2 did not scale up";

  // Preemption: jobs/2 saved on demand at step N, went PENDING (PREEMPTED at step N) and resumed
  // at N+1; jobs/1 (older) was never stopped.
  const std::vector<SeenEvent> ev2 = w2.Events();
  const v1::JobEvent* preempted = Find(ev2, "PREEMPTED");
  ASSERT_NE(preempted, nullptr);
  EXPECT_EQ(preempted->state(), Job::PENDING);
  const int64_t n = StepIn(preempted->message());
  ASSERT_GT(n, 0) << preempted->message();
  EXPECT_TRUE(absl::StrContains(preempted->message(), "for " + j3)) << preempted->message();
  bool saved_n = false;
  for (const SeenEvent& e : ev2) {
    saved_n = saved_n || (e.event.reason() == "CHECKPOINT_SAVED" &&
                          e.event.message() == absl::StrCat("checkpoint at step ", n));
  }
  EXPECT_TRUE(saved_n) << "no CHECKPOINT_SAVED at step " << n;
  // The ranks stop at the Stop that follows the save, so they may run (and, at
  // training.save_interval = 5, save) a step or two more whose reports the coordinator drops
  // (the generation is draining): generation 2 resumes from the latest committed checkpoint,
  // at least N+1 and at most one save interval past the last step reported before the stop.
  const int64_t last1 = LastStepOf(w2, 1);
  EXPECT_GE(resumed_at, n + 1) << "generation 2 started before the on-demand checkpoint";
  EXPECT_LE(resumed_at, last1 + 1 + 5) << "generation 1 reported up to " << last1;
  // Scale-up: from 1 to 2 workers at step M, generation 3 from M+1 on 2 workers.
  const v1::JobEvent* scaling = Find(ev2, "SCALING_UP");
  ASSERT_NE(scaling, nullptr);
  EXPECT_TRUE(absl::StrContains(scaling->message(), "scaling up from 1 to 2 worker(s)"))
      << scaling->message();
  const int64_t m = StepIn(scaling->message());
  EXPECT_GE(FirstStepOf(w2, 3), m + 1);
  EXPECT_LE(FirstStepOf(w2, 3), LastStepOf(w2, 2) + 1 + 5);
  int starts1 = 0;
  for (const SeenEvent& e : ev2) {
    if (e.event.state() != Job::STARTING) continue;
    EXPECT_EQ(WorldOf(e.event), e.event.generation() == 3 ? 2 : 1) << e.event.message();
  }
  for (const SeenEvent& e : w1.Events()) {
    if (e.event.state() == Job::STARTING) {
      ++starts1;
      EXPECT_EQ(WorldOf(e.event), 2);
    }
    EXPECT_NE(e.event.reason(), "PREEMPTED") << "jobs/1 is older: never the victim";
  }
  EXPECT_EQ(starts1, 1);
  // The coordinator's counters: one preemption, one scale-up.
  auto scraped = c.http().Get("/metrics");
  ASSERT_TRUE(scraped);
  EXPECT_EQ(MetricValue(scraped->body, "switchyard_coordinator_preemptions_total"), 1);
  EXPECT_EQ(MetricValue(scraped->body, "switchyard_coordinator_scale_ups_total"), 1);
  std::printf(
      "jobs/2: preempted at step %lld (generation 1 reported up to %lld), generation 2 from "
      "step %lld; scaled up at step %lld (generation 2 up to %lld), generation 3 from step %lld\n",
      static_cast<long long>(n), static_cast<long long>(last1), static_cast<long long>(resumed_at),
      static_cast<long long>(m), static_cast<long long>(LastStepOf(w2, 2)),
      static_cast<long long>(FirstStepOf(w2, 3)));
}

}  // namespace
}  // namespace switchyard::e2e
