// File: tests/e2e/e2e_queue_test.cc
//
// Queues, priorities and quotas end to end (issue 18 item 2; coordinator/jobs/scheduler.h
// "Queues"): the real switchyard-coordinator with --queues=a=2,b=2, four real CPU
// switchyard-worker agents (Gloo on loopback) and three 2-worker jobs submitted over REST before
// any worker starts: jobs/1 (queue a, priority 0), jobs/2 (queue a, priority 10), jobs/3 (queue
// b, priority 0). What it checks:
//   - admission order: jobs/2 starts first (priority), jobs/3 next (queue b has room), jobs/1
//     only after jobs/2 has ended (queue a's quota of 2 workers);
//   - gang admission: every STARTING event is a world of 2, generation 1 (never a partial start,
//     never a restart);
//   - `syctl list` shows the waiting jobs/1 PENDING in queue a at position 1 with
//     QUEUE_QUOTA_EXCEEDED, and `syctl get` its position line;
//   - `syctl submit` of a job naming an unknown queue exits non-zero naming the field and rule.
//
//   e2e_queue_test <switchyard-coordinator> <switchyard-worker> <syctl>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "gtest/gtest.h"
#include "tests/e2e/e2e_cluster.h"
#include "tests/e2e/e2e_util.h"

namespace switchyard::e2e {
namespace {

struct SyctlRun {
  int code = -1;
  std::string out;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// syctl against the cluster's coordinator with the API token; stdout and stderr together.
SyctlRun Syctl(Cluster& c, const std::string& token_file, const std::vector<std::string>& args) {
  static int n = 0;
  const std::string out_path = TmpPath(absl::StrCat("queue_syctl", ++n, ".out"));
  std::string command =
      absl::StrCat("'", g_syctl, "' --coordinator ", c.coordinator()->grpc_address(),
                   " --token-file '", token_file, "'");
  for (const std::string& a : args) absl::StrAppend(&command, " '", a, "'");
  absl::StrAppend(&command, " >'", out_path, "' 2>&1 </dev/null");
  const int status = std::system(command.c_str());
  SyctlRun run;
  run.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  run.out = ReadAll(out_path);
  return run;
}

// The `syctl list` row of `job`, split on runs of spaces; empty when absent.
std::vector<std::string> Row(const std::string& table, const std::string& job) {
  for (absl::string_view line : absl::StrSplit(table, '\n')) {
    if (!absl::StartsWith(line, job + " ")) continue;
    return absl::StrSplit(line, ' ', absl::SkipEmpty());
  }
  return {};
}

// The coordinator's time of an event (one clock for all jobs), in seconds.
double Stamp(const v1::JobEvent& e) { return e.time().seconds() + 1e-9 * e.time().nanos(); }

TEST(E2eQueueTest, ThreeJobsTwoPrioritiesFourWorkersQuotaTwoPerQueue) {
  Cluster c("queues");
  c.SetQueues("a=2,b=2");
  ASSERT_TRUE(c.StartCoordinator());
  const std::string token_file = TmpPath("queues.token");  // Cluster writes the API token here

  // A queue the coordinator does not have is refused at submit, naming the field and the rule.
  {
    auto spec = ParseJobSpecYaml(kSpec);
    ASSERT_TRUE(spec.ok());
    spec->set_queue("nope");
    spec->mutable_training()->set_save("nope");
    const std::string path = TmpPath("queues_nope.yaml");
    ASSERT_TRUE(WriteText(path, JobSpecToYaml(*spec)));
    const SyctlRun refused = Syctl(c, token_file, {"submit", "-f", path});
    std::printf("syctl submit (queue nope): exit %d: %s", refused.code, refused.out.c_str());
    EXPECT_NE(refused.code, 0);
    EXPECT_TRUE(
        absl::StrContains(refused.out, "queue (\"nope\") must be one of this coordinator's queues"))
        << refused.out;
  }

  auto in_queue = [](const std::string& queue, int priority) {
    return [queue, priority](v1::JobSpec& s) {
      s.set_queue(queue);
      s.set_priority(priority);
      s.set_max_workers(2);
      s.mutable_training()->set_train_iters(15);
    };
  };
  const std::string j1 = c.Submit("queue-a-low", 2, in_queue("a", 0));
  const std::string j2 = c.Submit("queue-a-high", 2, in_queue("a", 10));
  const std::string j3 = c.Submit("queue-b-low", 2, in_queue("b", 0));
  ASSERT_EQ(j1, "jobs/1");
  ASSERT_EQ(j2, "jobs/2");
  ASSERT_EQ(j3, "jobs/3");
  JobWatcher w1(c.coordinator()->grpc_address(), j1);
  JobWatcher w2(c.coordinator()->grpc_address(), j2);
  JobWatcher w3(c.coordinator()->grpc_address(), j3);
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < 4; ++i) c.StartWorker();

  // While jobs/2 runs, jobs/1 waits at queue a's quota: syctl list shows its position and reason.
  std::vector<std::string> row;
  std::string table;
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  while (absl::Now() < deadline) {
    const SyctlRun list = Syctl(c, token_file, {"list"});
    table = list.out;
    row = Row(table, j1);
    // NAME DISPLAY-NAME STATE QUEUE PRIO POS WAITING ...
    if (row.size() > 6 && row[6] == "QUEUE_QUOTA_EXCEEDED") break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  std::printf("syctl list after %.2f s:\n%s", Seconds(t0), table.c_str());
  ASSERT_GT(row.size(), 6u) << table;
  EXPECT_EQ(row[2], "PENDING");
  EXPECT_EQ(row[3], "a");
  EXPECT_EQ(row[4], "0");
  EXPECT_EQ(row[5], "1");
  EXPECT_EQ(row[6], "QUEUE_QUOTA_EXCEEDED");
  const SyctlRun get = Syctl(c, token_file, {"get", j1});
  std::printf("syctl get %s:\n%s", j1.c_str(), get.out.c_str());
  EXPECT_TRUE(absl::StrContains(
      get.out, "1 in queue a: QUEUE_QUOTA_EXCEEDED: queue a: 2 of 2 worker(s) in use, needs 2"))
      << get.out;

  const Job::State e2 = w2.WaitForEnd(180), e3 = w3.WaitForEnd(180), e1 = w1.WaitForEnd(180);
  std::printf("ended after %.2f s: %s %s, %s %s, %s %s\n", Seconds(t0), j1.c_str(),
              Job::State_Name(e1).c_str(), j2.c_str(), Job::State_Name(e2).c_str(), j3.c_str(),
              Job::State_Name(e3).c_str());
  for (JobWatcher* w : {&w1, &w2, &w3}) w->Print();
  if (e1 != Job::SUCCEEDED || e2 != Job::SUCCEEDED || e3 != Job::SUCCEEDED) c.PrintLogs();
  ASSERT_EQ(e1, Job::SUCCEEDED);
  ASSERT_EQ(e2, Job::SUCCEEDED);
  ASSERT_EQ(e3, Job::SUCCEEDED);

  // Gang admission: each job started once, whole (world 2), and never restarted.
  std::map<std::string, double> started, ended;
  for (auto [name, w] :
       std::vector<std::pair<std::string, JobWatcher*>>{{j1, &w1}, {j2, &w2}, {j3, &w3}}) {
    int starts = 0;
    for (const SeenEvent& e : w->Events()) {
      if (e.event.state() == Job::STARTING) {
        ++starts;
        EXPECT_EQ(WorldOf(e.event), 2) << name << ": " << e.event.message();
        EXPECT_EQ(e.event.generation(), 1) << name;
        started[name] = Stamp(e.event);
      }
      if (e.event.state() == Job::SUCCEEDED) ended[name] = Stamp(e.event);
      EXPECT_NE(e.event.state(), Job::RESTARTING) << name;
    }
    EXPECT_EQ(starts, 1) << name;
  }
  std::printf("STARTING at +%.2f s (%s), +%.2f s (%s), +%.2f s (%s); %s SUCCEEDED at +%.2f s\n",
              0.0, j2.c_str(), started[j3] - started[j2], j3.c_str(), started[j1] - started[j2],
              j1.c_str(), j2.c_str(), ended[j2] - started[j2]);
  // Admission order: priority first, then queue b's room; jobs/1 only once jobs/2 freed queue a.
  EXPECT_LT(started[j2], started[j3]);
  EXPECT_LT(started[j3], started[j1]);
  EXPECT_GE(started[j1], ended[j2]);
  // The waiting reasons reached the event log (syctl watch replays it).
  bool quota_event = false;
  for (const v1::JobEvent& e : c.Replay(j1)) {
    quota_event = quota_event || e.reason() == "QUEUE_QUOTA_EXCEEDED";
  }
  EXPECT_TRUE(quota_event);
}

}  // namespace
}  // namespace switchyard::e2e
