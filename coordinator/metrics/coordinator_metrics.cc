#include "coordinator/metrics/coordinator_metrics.h"

#include <sstream>
#include <utility>
#include <vector>

#include "coordinator/metrics/job_event_reasons.h"
#include "prometheus/text_serializer.h"

namespace switchyard::metrics {
namespace {

// 1 ms .. ~16 s: unary calls take milliseconds, Plan of a large cluster up to seconds.
prometheus::Histogram::BucketBoundaries RpcBuckets() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20};
}

}  // namespace

CoordinatorMetrics::CoordinatorMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      jobs_(prometheus::BuildGauge()
                .Name(std::string(kJobsMetric))
                .Help("Jobs in the coordinator's store, by lifecycle state.")
                .Register(*registry_)),
      workers_attached_(prometheus::BuildGauge()
                            .Name(std::string(kWorkersAttachedMetric))
                            .Help("Workers attached to the coordinator.")
                            .Register(*registry_)
                            .Add({})),
      rpc_duration_(prometheus::BuildHistogram()
                        .Name(std::string(kRpcDurationMetric))
                        .Help("Duration of API calls (gRPC and REST), by method and status code.")
                        .Register(*registry_)),
      job_restarts_(
          prometheus::BuildCounter()
              .Name(std::string(kJobRestartsMetric))
              .Help("Job restarts (entries into RESTARTING) since the coordinator started.")
              .Register(*registry_)
              .Add({})),
      preemptions_(prometheus::BuildCounter()
                       .Name(std::string(kPreemptionsMetric))
                       .Help("Jobs preempted at an on-demand checkpoint (RUNNING -> PENDING, "
                             "PREEMPTED) since the coordinator started.")
                       .Register(*registry_)
                       .Add({})),
      scale_ups_(prometheus::BuildCounter()
                     .Name(std::string(kScaleUpsMetric))
                     .Help("Jobs stopped at an on-demand checkpoint to grow onto more workers "
                           "(RUNNING -> PENDING, SCALING_UP) since the coordinator started.")
                     .Register(*registry_)
                     .Add({})),
      queue_quota_(prometheus::BuildGauge()
                       .Name(std::string(kQueueQuotaMetric))
                       .Help("Worker quota of a queue (no series: the queue has no quota).")
                       .Register(*registry_)),
      queue_in_use_(prometheus::BuildGauge()
                        .Name(std::string(kQueueInUseMetric))
                        .Help("Workers held by a queue's running generations.")
                        .Register(*registry_)),
      queue_pending_(prometheus::BuildGauge()
                         .Name(std::string(kQueuePendingMetric))
                         .Help("Jobs of a queue waiting for admission.")
                         .Register(*registry_)) {
  absl::MutexLock lock(&mu_);
  const google::protobuf::EnumDescriptor* states = v1::Job::State_descriptor();
  for (int i = 0; i < states->value_count(); ++i) {
    const auto state = static_cast<v1::Job::State>(states->value(i)->number());
    if (state == v1::Job::STATE_UNSPECIFIED) continue;
    job_gauges_[state] = &jobs_.Add({{"state", states->value(i)->name()}});
  }
}

void CoordinatorMetrics::ObserveRpc(absl::string_view method, absl::string_view code,
                                    double seconds) {
  prometheus::Histogram* child = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto key = std::make_pair(std::string(method), std::string(code));
    auto it = rpc_children_.find(key);
    if (it == rpc_children_.end()) {
      prometheus::Histogram& h =
          rpc_duration_.Add({{"method", key.first}, {"code", key.second}}, RpcBuckets());
      it = rpc_children_.emplace(std::move(key), &h).first;
    }
    child = it->second;
  }
  child->Observe(seconds);
}

void CoordinatorMetrics::IncrementJobRestarts() { job_restarts_.Increment(); }

void CoordinatorMetrics::CountTransition(v1::Job::State to, absl::string_view reason) {
  // The scheduler emits these reasons from the same constants (job_event_reasons.h).
  if (to == v1::Job::RESTARTING) job_restarts_.Increment();
  if (to == v1::Job::PENDING && reason == kPreempted) preemptions_.Increment();
  if (to == v1::Job::PENDING && reason == kScalingUp) scale_ups_.Increment();
}

void CoordinatorMetrics::SetWorkersAttached(int64_t count) {
  workers_attached_.Set(static_cast<double>(count));
}

void CoordinatorMetrics::SetJobCounter(JobCounter counter) {
  absl::MutexLock lock(&mu_);
  job_counter_ = std::move(counter);
}

void CoordinatorMetrics::SetWorkerCounter(std::function<int64_t()> counter) {
  absl::MutexLock lock(&mu_);
  worker_counter_ = std::move(counter);
}

void CoordinatorMetrics::SetQueueCounter(std::function<std::vector<QueueGauges>()> counter) {
  absl::MutexLock lock(&mu_);
  queue_counter_ = std::move(counter);
}

void CoordinatorMetrics::RefreshQueues(const std::vector<QueueGauges>& queues) {
  for (const QueueGauges& q : queues) {
    const std::map<std::string, std::string> labels = {{"queue", q.queue}};
    if (q.quota.has_value()) queue_quota_.Add(labels).Set(static_cast<double>(*q.quota));
    queue_in_use_.Add(labels).Set(static_cast<double>(q.workers_in_use));
    queue_pending_.Add(labels).Set(static_cast<double>(q.pending));
  }
}

std::string CoordinatorMetrics::Scrape() {
  JobCounter counter;
  std::function<int64_t()> workers;
  std::function<std::vector<QueueGauges>()> queues;
  {
    absl::MutexLock lock(&mu_);
    counter = job_counter_;
    workers = worker_counter_;
    queues = queue_counter_;
  }
  if (workers) SetWorkersAttached(workers());
  if (queues) RefreshQueues(queues());
  if (counter) {
    absl::StatusOr<std::map<v1::Job::State, int64_t>> counts = counter();
    if (counts.ok()) {
      absl::MutexLock lock(&mu_);
      for (auto& [state, gauge] : job_gauges_) {
        auto it = counts->find(state);
        gauge->Set(it == counts->end() ? 0.0 : static_cast<double>(it->second));
      }
    }
  }
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

}  // namespace switchyard::metrics
