// File: coordinator/metrics/coordinator_metrics.h
//
// The coordinator's Prometheus metrics (DESIGN.md "Names": prefix switchyard_; ecosystem.md §3.1:
// base units, counters end in _total, low-cardinality labels):
//
//   switchyard_coordinator_jobs{state="PENDING"|...|"CANCELLED"}   gauge, jobs per state
//   switchyard_coordinator_workers_attached                         gauge
//   switchyard_coordinator_rpc_duration_seconds{method,code}        histogram
//   switchyard_coordinator_job_restarts_total                       counter
//   switchyard_coordinator_preemptions_total                        counter, jobs preempted at a
//                                                                    checkpoint (PENDING,
//                                                                    PREEMPTED)
//   switchyard_coordinator_scale_ups_total                          counter, jobs stopped at a
//                                                                    checkpoint to grow
//                                                                    (SCALING_UP)
//   switchyard_queue_quota_workers{queue}                            gauge, a queue's worker quota
//                                                                    (absent: no quota)
//   switchyard_queue_workers_in_use{queue}                           gauge, workers of its jobs'
//                                                                    generations in flight
//   switchyard_queue_pending_jobs{queue}                             gauge, its jobs waiting for
//                                                                    admission
//
// `queue` is one of the operator's --queues (and "default"): a closed set the operator chose, so
// its cardinality stays small. The queue gauges are refreshed at scrape time from the callback
// given to SetQueueCounter (the scheduler's last pass, coordinator/jobs/scheduler.h "Queues").
//
// `method` is the API method name ("CreateJob", "Plan", ...; the gRPC service and the REST gateway
// record the same names, so a dashboard sees one API), `code` the canonical status code name
// ("OK", "INVALID_ARGUMENT", ...). Both sets are closed, so the label cardinality stays bounded.
//
// The job gauge (and the workers gauge, when SetWorkerCounter was called) is refreshed at scrape
// time by the callback given to SetJobCounter (the store is
// the source of truth; counting there cannot drift from it). Scrape() renders the text exposition
// format (version 0.0.4) that the REST gateway serves on GET /metrics.
//
// Thread safety: every method may be called from any thread.
#ifndef SWITCHYARD_COORDINATOR_METRICS_COORDINATOR_METRICS_H_
#define SWITCHYARD_COORDINATOR_METRICS_COORDINATOR_METRICS_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "switchyard/v1/job.pb.h"

namespace switchyard::metrics {

inline constexpr absl::string_view kJobsMetric = "switchyard_coordinator_jobs";
inline constexpr absl::string_view kWorkersAttachedMetric =
    "switchyard_coordinator_workers_attached";
inline constexpr absl::string_view kRpcDurationMetric =
    "switchyard_coordinator_rpc_duration_seconds";
inline constexpr absl::string_view kJobRestartsMetric = "switchyard_coordinator_job_restarts_total";
inline constexpr absl::string_view kPreemptionsMetric = "switchyard_coordinator_preemptions_total";
inline constexpr absl::string_view kScaleUpsMetric = "switchyard_coordinator_scale_ups_total";
inline constexpr absl::string_view kQueueQuotaMetric = "switchyard_queue_quota_workers";
inline constexpr absl::string_view kQueueInUseMetric = "switchyard_queue_workers_in_use";
inline constexpr absl::string_view kQueuePendingMetric = "switchyard_queue_pending_jobs";

// One queue as the gauges show it.
struct QueueGauges {
  std::string queue;
  std::optional<int64_t> quota;  // nullopt: no quota (no quota series)
  int64_t workers_in_use = 0;
  int64_t pending = 0;
};

class CoordinatorMetrics {
 public:
  // Counts jobs per state (every state except STATE_UNSPECIFIED should be present; missing ones
  // read 0). An error leaves the gauge at its previous values.
  using JobCounter = std::function<absl::StatusOr<std::map<v1::Job::State, int64_t>>()>;

  CoordinatorMetrics();
  CoordinatorMetrics(const CoordinatorMetrics&) = delete;
  CoordinatorMetrics& operator=(const CoordinatorMetrics&) = delete;

  // Records one finished API call. `seconds` >= 0.
  void ObserveRpc(absl::string_view method, absl::string_view code, double seconds);
  void IncrementJobRestarts();
  // Counts one job transition (JobHub's callback): into RESTARTING a restart; into PENDING with
  // reason PREEMPTED a preemption, with SCALING_UP a scale-up (job_event_reasons.h, emitted by
  // coordinator/jobs/scheduler.h).
  void CountTransition(v1::Job::State to, absl::string_view reason);
  // Sets the workers gauge now (0 until something sets it).
  void SetWorkersAttached(int64_t count);
  void SetJobCounter(JobCounter counter);
  // When set, the workers gauge is refreshed from it at every scrape (the coordinator binds it to
  // the worker registry's attached count).
  void SetWorkerCounter(std::function<int64_t()> counter);
  // When set, the queue gauges are refreshed from it at every scrape (a queue it no longer lists
  // keeps its last values).
  void SetQueueCounter(std::function<std::vector<QueueGauges>()> counter);

  // Refreshes the job gauge, then renders every metric in the text exposition format.
  std::string Scrape();

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Gauge& workers_attached_;
  prometheus::Family<prometheus::Histogram>& rpc_duration_;
  prometheus::Counter& job_restarts_;
  prometheus::Counter& preemptions_;
  prometheus::Counter& scale_ups_;

  absl::Mutex mu_;
  std::map<v1::Job::State, prometheus::Gauge*> job_gauges_ ABSL_GUARDED_BY(mu_);
  // Family::Add is slow (prometheus-cpp README), so each (method, code) child is looked up once.
  std::map<std::pair<std::string, std::string>, prometheus::Histogram*> rpc_children_
      ABSL_GUARDED_BY(mu_);
  JobCounter job_counter_ ABSL_GUARDED_BY(mu_);
  std::function<int64_t()> worker_counter_ ABSL_GUARDED_BY(mu_);
  prometheus::Family<prometheus::Gauge>& queue_quota_;
  prometheus::Family<prometheus::Gauge>& queue_in_use_;
  prometheus::Family<prometheus::Gauge>& queue_pending_;
  std::function<std::vector<QueueGauges>()> queue_counter_ ABSL_GUARDED_BY(mu_);
  void RefreshQueues(const std::vector<QueueGauges>& queues);
};

}  // namespace switchyard::metrics

#endif  // SWITCHYARD_COORDINATOR_METRICS_COORDINATOR_METRICS_H_
