// File: coordinator/jobs/job_state.h
//
// The job lifecycle (DESIGN.md "Job", ecosystem.md §1.7, AIP-216) as a transition table and the
// pure function that applies one transition. No I/O: the registry (job_registry.h) runs it inside
// a store transaction.
//
//   PENDING ──► STARTING ──► RUNNING ──► SUCCEEDED
//                 ▲   │         │
//                 │   ▼         ▼
//               RESTARTING ◄────┘        any non-terminal ──► FAILED | CANCELLED
//
// Allowed transitions (every other pair, and any change out of a terminal state, is
// FAILED_PRECONDITION naming both states and what `from` allows):
//
//   from        to
//   PENDING     STARTING, FAILED, CANCELLED
//   STARTING    RUNNING, RESTARTING, FAILED, CANCELLED
//   RUNNING     SUCCEEDED, RESTARTING, FAILED, CANCELLED, PENDING (preempted at a checkpoint,
//               scheduler.h "Preemption": back in the queue, no restart spent)
//   RESTARTING  STARTING, FAILED, CANCELLED
//
// FAILED is reachable from every non-terminal state (a planner that finds no mapping fails a
// PENDING job; a permanent worker exit fails a STARTING one). SUCCEEDED only from RUNNING.
//
// Counters (as TorchElastic's single max_restarts budget, ecosystem.md §0):
// - generation is bumped on every entry to STARTING (the first start is generation 1), so
//   messages from an older attempt can be told apart.
// - restart_count is bumped on every entry to RESTARTING. When restart_count already equals the
//   job's max_restarts (JobSpec.max_restarts, default 3 from common/config_defaults), a request for
//   RESTARTING moves the job to FAILED instead, with failure_reason RESTART_LIMIT_EXCEEDED naming
//   the budget and the cause; the caller sees the FAILED state in the result.
// - failure_reason is set on entry to FAILED ("REASON: message").
#ifndef SWITCHYARD_COORDINATOR_JOBS_JOB_STATE_H_
#define SWITCHYARD_COORDINATOR_JOBS_JOB_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "switchyard/v1/job.pb.h"

namespace switchyard::jobs {

using State = v1::Job::State;

// The reason a RESTARTING request turns into FAILED when the restart budget is spent.
inline constexpr absl::string_view kRestartLimitExceeded = "RESTART_LIMIT_EXCEEDED";

// SUCCEEDED, FAILED, CANCELLED.
bool IsTerminal(State state);

// The states `from` may move to, in enum order (empty for terminal states).
std::vector<State> AllowedTargets(State from);

// OK if the table allows from -> to, else FAILED_PRECONDITION such as
// "job cannot go from RUNNING to STARTING (RUNNING allows PENDING, SUCCEEDED, RESTARTING,
// FAILED, CANCELLED)".
absl::Status CheckTransition(State from, State to);

// OK if `reason` is a machine-readable reason: 1..63 characters of A-Z, 0-9 and '_', starting
// with a letter (AIP-193's ErrorInfo.reason form); else INVALID_ARGUMENT naming `reason`.
absl::Status CheckReason(absl::string_view reason);

// The lifecycle fields of a job.
struct Lifecycle {
  State state = v1::Job::PENDING;
  int64_t generation = 0;
  int32_t restart_count = 0;
  std::string failure_reason;
};

// The outcome of one transition: the fields after it and the event to log.
struct TransitionResult {
  Lifecycle after;
  std::string reason;   // the event's reason (kRestartLimitExceeded when converted to FAILED)
  std::string message;  // the event's message
};

// Applies `to` to `before` under the rules above. `reason` must pass CheckReason; `max_restarts`
// >= 0. Errors: INVALID_ARGUMENT (reason, max_restarts), FAILED_PRECONDITION (table).
absl::StatusOr<TransitionResult> ApplyTransition(const Lifecycle& before, State to,
                                                 absl::string_view reason,
                                                 absl::string_view message, int32_t max_restarts);

}  // namespace switchyard::jobs

#endif  // SWITCHYARD_COORDINATOR_JOBS_JOB_STATE_H_
