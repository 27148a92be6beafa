// CoordinatorMetrics: every metric is present in the text exposition with the documented names
// and labels, and the values follow the calls.
#include "coordinator/metrics/coordinator_metrics.h"

#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace switchyard::metrics {
namespace {

// "name{labels} value" lines of the exposition (comments skipped), keyed by everything before the
// last space.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

TEST(CoordinatorMetricsTest, ExposesEveryMetricWithItsLabels) {
  CoordinatorMetrics metrics;
  std::map<v1::Job::State, int64_t> counts = {{v1::Job::PENDING, 3}, {v1::Job::RUNNING, 2}};
  metrics.SetJobCounter(
      [&]() -> absl::StatusOr<std::map<v1::Job::State, int64_t>> { return counts; });
  metrics.SetWorkersAttached(4);
  metrics.IncrementJobRestarts();
  metrics.IncrementJobRestarts();
  // JobHub's transition callback: one more restart, two preemptions, one scale-up; a PENDING
  // with another reason counts as none of them.
  metrics.CountTransition(v1::Job::RESTARTING, "WORKER_LOST");
  metrics.CountTransition(v1::Job::PENDING, "PREEMPTED");
  metrics.CountTransition(v1::Job::PENDING, "PREEMPTED");
  metrics.CountTransition(v1::Job::PENDING, "SCALING_UP");
  metrics.CountTransition(v1::Job::PENDING, "WAITING_FOR_WORKERS");
  metrics.CountTransition(v1::Job::RUNNING, "FIRST_STEP");
  metrics.ObserveRpc("CreateJob", "OK", 0.003);
  metrics.ObserveRpc("CreateJob", "OK", 0.2);
  metrics.ObserveRpc("GetJob", "NOT_FOUND", 0.0001);
  std::vector<QueueGauges> queues = {{"a", 2, 2, 1}, {"default", std::nullopt, 0, 3}};
  metrics.SetQueueCounter([&] { return queues; });
  const std::string text = metrics.Scrape();
  std::printf("%s", text.c_str());
  EXPECT_TRUE(absl::StrContains(text, "# TYPE switchyard_coordinator_jobs gauge"));
  EXPECT_TRUE(
      absl::StrContains(text, "# TYPE switchyard_coordinator_rpc_duration_seconds histogram"));
  EXPECT_TRUE(absl::StrContains(text, "# TYPE switchyard_coordinator_job_restarts_total counter"));
  std::map<std::string, double> s = Samples(text);
  EXPECT_EQ(s["switchyard_coordinator_jobs{state=\"PENDING\"}"], 3);
  EXPECT_EQ(s["switchyard_coordinator_jobs{state=\"RUNNING\"}"], 2);
  EXPECT_EQ(s.count("switchyard_coordinator_jobs{state=\"CANCELLED\"}"), 1u);
  EXPECT_EQ(s["switchyard_coordinator_jobs{state=\"CANCELLED\"}"], 0);
  EXPECT_EQ(s.count("switchyard_coordinator_jobs{state=\"STATE_UNSPECIFIED\"}"), 0u);
  EXPECT_EQ(s["switchyard_coordinator_workers_attached"], 4);
  // Queues (scheduler.h "Queues"): quota only where one is set.
  EXPECT_TRUE(absl::StrContains(text, "# TYPE switchyard_queue_quota_workers gauge"));
  EXPECT_EQ(s["switchyard_queue_quota_workers{queue=\"a\"}"], 2);
  EXPECT_EQ(s.count("switchyard_queue_quota_workers{queue=\"default\"}"), 0u);
  EXPECT_EQ(s["switchyard_queue_workers_in_use{queue=\"a\"}"], 2);
  EXPECT_EQ(s["switchyard_queue_pending_jobs{queue=\"a\"}"], 1);
  EXPECT_EQ(s["switchyard_queue_pending_jobs{queue=\"default\"}"], 3);
  EXPECT_EQ(s["switchyard_coordinator_job_restarts_total"], 3);
  EXPECT_EQ(s["switchyard_coordinator_preemptions_total"], 2);
  EXPECT_EQ(s["switchyard_coordinator_scale_ups_total"], 1);
  EXPECT_EQ(
      s["switchyard_coordinator_rpc_duration_seconds_count{code=\"OK\",method=\"CreateJob\"}"], 2);
  EXPECT_NEAR(
      s["switchyard_coordinator_rpc_duration_seconds_sum{code=\"OK\",method=\"CreateJob\"}"], 0.203,
      1e-9);
  EXPECT_EQ(s["switchyard_coordinator_rpc_duration_seconds_bucket{code=\"OK\",method=\"CreateJob\","
              "le=\"0.005\"}"],
            1);
  EXPECT_EQ(s["switchyard_coordinator_rpc_duration_seconds_bucket{code=\"OK\",method=\"CreateJob\","
              "le=\"+Inf\"}"],
            2);
  EXPECT_EQ(s["switchyard_coordinator_rpc_duration_seconds_count{code=\"NOT_FOUND\",method="
              "\"GetJob\"}"],
            1);

  // The gauge follows the counter at the next scrape; a failing counter keeps the last values.
  counts = {{v1::Job::SUCCEEDED, 5}};
  queues = {{"a", 2, 0, 0}};
  s = Samples(metrics.Scrape());
  EXPECT_EQ(s["switchyard_queue_workers_in_use{queue=\"a\"}"], 0);
  EXPECT_EQ(s["switchyard_coordinator_jobs{state=\"PENDING\"}"], 0);
  EXPECT_EQ(s["switchyard_coordinator_jobs{state=\"SUCCEEDED\"}"], 5);
  metrics.SetJobCounter([]() -> absl::StatusOr<std::map<v1::Job::State, int64_t>> {
    return absl::UnavailableError("store busy");
  });
  s = Samples(metrics.Scrape());
  EXPECT_EQ(s["switchyard_coordinator_jobs{state=\"SUCCEEDED\"}"], 5);
}

}  // namespace
}  // namespace switchyard::metrics
