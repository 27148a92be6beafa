// File: coordinator/jobs/scheduler_internal.h
//
// Shared by scheduler.cc (start, loop, placement) and scheduler_lifecycle.cc (events, ending a
// generation, periodic checks): the event reasons the scheduler logs and the Stop message.
#ifndef SWITCHYARD_COORDINATOR_WORKERS_SCHEDULER_INTERNAL_H_
#define SWITCHYARD_COORDINATOR_WORKERS_SCHEDULER_INTERNAL_H_

#include <cstdint>
#include <string>

#include "coordinator/metrics/job_event_reasons.h"
#include "switchyard/v1/worker.pb.h"

namespace switchyard::jobs::scheduler_internal {

inline constexpr char kScheduled[] = "SCHEDULED";
inline constexpr char kFirstStep[] = "FIRST_STEP";
inline constexpr char kAllRanksFinished[] = "ALL_RANKS_FINISHED";
inline constexpr char kWorkerExitPermanent[] = "WORKER_EXIT_PERMANENT";
inline constexpr char kWorkerFailed[] = "WORKER_FAILED";
inline constexpr char kWorkerLost[] = "WORKER_LOST";
inline constexpr char kUnsupportedParallelism[] = "UNSUPPORTED_PARALLELISM";
inline constexpr char kNoFeasiblePlan[] = "NO_FEASIBLE_PLAN";
inline constexpr char kInvalidSpec[] = "INVALID_SPEC";
inline constexpr char kWaitingForWorkers[] = "WAITING_FOR_WORKERS";
inline constexpr char kQueueQuotaExceeded[] = "QUEUE_QUOTA_EXCEEDED";
inline constexpr char kWaitingForPriority[] = "WAITING_FOR_PRIORITY";
inline constexpr char kInvalidPaths[] = "INVALID_PATHS";
inline constexpr char kCoordinatorRestarted[] = "COORDINATOR_RESTARTED";
// The two reasons CoordinatorMetrics counts are defined with the metrics, which sit below us.
using ::switchyard::metrics::kPreempted;
using ::switchyard::metrics::kScalingUp;
inline constexpr int32_t kStoppedOnRequest = 143;

inline v1::CoordinatorMessage StopMessage(const std::string& reason) {
  v1::CoordinatorMessage message;
  message.mutable_stop()->set_reason(reason);
  return message;
}

}  // namespace switchyard::jobs::scheduler_internal

#endif  // SWITCHYARD_COORDINATOR_WORKERS_SCHEDULER_INTERNAL_H_
