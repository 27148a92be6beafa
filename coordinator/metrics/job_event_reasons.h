// File: coordinator/metrics/job_event_reasons.h
//
// The JobEvent reasons that CoordinatorMetrics::CountTransition counts, spelled once. The
// scheduler (coordinator/jobs/scheduler_internal.h) emits them and the metrics compare against
// them; they live here, below both, because coordinator/metrics must not depend on coordinator/jobs
// (root BUILD package groups). Users see these strings in job events: changing one is an API
// change.
#ifndef SWITCHYARD_COORDINATOR_METRICS_JOB_EVENT_REASONS_H_
#define SWITCHYARD_COORDINATOR_METRICS_JOB_EVENT_REASONS_H_

namespace switchyard::metrics {

// A running job sent back to PENDING to free its workers for a higher-priority one.
inline constexpr char kPreempted[] = "PREEMPTED";
// A running job sent back to PENDING to restart on more workers.
inline constexpr char kScalingUp[] = "SCALING_UP";

}  // namespace switchyard::metrics

#endif  // SWITCHYARD_COORDINATOR_METRICS_JOB_EVENT_REASONS_H_
