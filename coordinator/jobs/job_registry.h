// File: coordinator/jobs/job_registry.h
//
// The coordinator's jobs: create (validated, idempotent), get, list (filtered, paginated),
// cancel, and every lifecycle transition, each persisted with an event in one store transaction.
// The gRPC JobService and the REST gateway are thin layers over this class.
//
// Contracts:
// - Resource names are "jobs/{id}", id a positive decimal integer without leading zeros, assigned
//   in creation order and never reused. A malformed name is INVALID_ARGUMENT naming `name`; a
//   well-formed name of no job is NOT_FOUND.
// - CreateJob resolves and checks the spec with ResolveJobSpec (coordinator/jobs/resolve_spec.h:
//   defaults, the coordinator-filled vocabulary and checkpoint directory, then every rule), the
//   same function PlanService and the scheduler call; a bad spec is INVALID_ARGUMENT with the
//   rule's message (field path and rule) and nothing is written. The stored spec is the resolved
//   one except the checkpoint directory the coordinator fills (it depends on the job id: the
//   scheduler resolves again with the id), so Get returns what the job will run with.
// - request_id (AIP-155) makes CreateJob idempotent: the same request_id with an equal effective
//   spec (after defaults) returns the existing job unchanged, in whatever state it is now; with a
//   different spec it is ALREADY_EXISTS naming request_id and the existing job. Empty: no key.
// - ListJobs (AIP-158): ascending id order; state STATE_UNSPECIFIED lists all; page_size 0 means
//   kDefaultPageSize, larger than kMaxPageSize is lowered to it, negative is INVALID_ARGUMENT;
//   next_page_token is opaque, empty on the last page, and bound to the state filter (reusing it
//   with another filter is INVALID_ARGUMENT). Pages are keyset-based (id > last id), so jobs
//   created between pages appear later and no job is listed twice; a job that changes state
//   between pages may be missed by a state-filtered listing. A page is also bounded in bytes: it
//   ends early, with a next_page_token, once its jobs' serialized size reaches
//   kMaxListPageBytes (1 MiB, a quarter of gRPC's default 4 MiB message limit); a page always
//   holds at least one job when one remains.
// - page_token is at most kMaxPageTokenBytes.
// - DeleteJob (AIP-135) removes finished jobs only; a deleted name is NOT_FOUND afterwards.
// - Transitions follow coordinator/jobs/job_state.h (FAILED_PRECONDITION naming from/to states)
//   and append exactly one event each; a refused transition writes nothing.
//
// Thread safety: any thread may call any method (the Store serializes; each read-modify-write is
// one transaction, so concurrent transitions of one job apply one after the other).
#ifndef SWITCHYARD_COORDINATOR_JOBS_JOB_REGISTRY_H_
#define SWITCHYARD_COORDINATOR_JOBS_JOB_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/config/job_paths.h"
#include "coordinator/jobs/job_state.h"
#include "coordinator/jobs/measured_runs.h"
#include "coordinator/jobs/resolve_spec.h"
#include "coordinator/store/store.h"
#include "switchyard/v1/job.pb.h"

namespace switchyard::jobs {

inline constexpr int kDefaultPageSize = 50;
inline constexpr int kMaxPageSize = 1000;
inline constexpr size_t kMaxRequestIdLength = 128;
inline constexpr size_t kMaxListPageBytes = size_t{1} << 20;
inline constexpr size_t kMaxPageTokenBytes = 256;

// "jobs/{id}".
std::string JobName(int64_t id);
// The job's own directory "<checkpoint_root>/jobs/<id>" (common/config/job_paths.h's
// JobDirectory, which spells the layout): DeleteJob removes it.
std::string JobCheckpointDir(absl::string_view checkpoint_root, int64_t id);
// The id of a job name: common/config/job_paths.h (shared with the worker's --job).
using ::switchyard::ParseJobName;

class JobRegistry {
 public:
  // `store` must outlive the registry. `context`: what ResolveJobSpec fills (checkpoint root,
  // default corpus vocabulary).
  explicit JobRegistry(store::Store* store, CoordinatorContext context = {});

  const CoordinatorContext& context() const { return context_; }

  // Validates request.spec (after defaults) and request.request_id, then creates the job in
  // PENDING with event CREATED, or returns the job the request_id already names. `before_commit`
  // (optional) runs with the new job's id before its rows are committed; its error rolls them back
  // (store::Store::InsertJob).
  absl::StatusOr<v1::Job> CreateJob(
      const v1::CreateJobRequest& request,
      const std::function<absl::Status(int64_t id)>& before_commit = nullptr);
  // The same for a spec in JSON or YAML text (common/config/config.h): parse errors are
  // INVALID_ARGUMENT naming the field, and nothing is written.
  absl::StatusOr<v1::Job> CreateJobFromJson(absl::string_view spec_json,
                                            absl::string_view request_id);
  absl::StatusOr<v1::Job> CreateJobFromYaml(absl::string_view spec_yaml,
                                            absl::string_view request_id);

  // The job with Job.last_event (its latest event) filled.
  absl::StatusOr<v1::Job> GetJob(absl::string_view name);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request);

  // Moves the job to CANCELLED (reason CANCELLED_BY_USER); FAILED_PRECONDITION when terminal.
  absl::StatusOr<v1::Job> CancelJob(absl::string_view name, absl::string_view message = "");

  // Deletes a finished job (SUCCEEDED, FAILED, CANCELLED) and its whole event log in one
  // transaction; FAILED_PRECONDITION naming the state for any other job, NOT_FOUND when absent.
  // Returns the job as it was. Its id is never assigned again.
  absl::StatusOr<v1::Job> DeleteJob(absl::string_view name);

  // Moves the job to `to` under job_state.h's rules and logs an event with `reason` (UPPER_SNAKE,
  // e.g. "WORKER_LOST") and `message`. Returns the job as written: a RESTARTING request beyond
  // max_restarts returns it FAILED.
  // `plan` (STARTING only): the plan the new generation runs, stored as Job.plan.
  absl::StatusOr<v1::Job> Transition(absl::string_view name, State to, absl::string_view reason,
                                     absl::string_view message = "",
                                     const v1::Plan* plan = nullptr);

  // Appends an event saying why a PENDING or RESTARTING job is not running yet (`reason`
  // UPPER_SNAKE, e.g. "WAITING_FOR_WORKERS", and `message`); the state is unchanged.
  // FAILED_PRECONDITION naming the state when the job is in another state (it moved on).
  absl::StatusOr<v1::Job> RecordWaitReason(absl::string_view name, absl::string_view reason,
                                           absl::string_view message);

  // Records a saved checkpoint (event CHECKPOINT_SAVED, state unchanged). The job must be RUNNING
  // and `step` must be >= 0 and greater than the last recorded step.
  absl::StatusOr<v1::Job> RecordCheckpoint(absl::string_view name, int64_t step);
  // Saves rank 0's latest step report as Job.last_step (no event; survives a restart).
  absl::Status RecordLastStep(absl::string_view name, const v1::StepMetrics& step);
  // Saves rank 0's latest report with a validation loss as Job.last_validation (likewise).
  absl::Status RecordLastValidation(absl::string_view name, const v1::StepMetrics& step);
  // The last recorded checkpoint step, if any.
  absl::StatusOr<std::optional<int64_t>> LastCheckpointStep(absl::string_view name);

  // The job's event log in sequence order.
  absl::StatusOr<std::vector<v1::JobEvent>> ListEvents(absl::string_view name);

  // PlanCandidate.measured on `plan`'s candidates from this store's jobs of the same workload as
  // the resolved `request`'s spec, and the step-time calibration fitted on them
  // (coordinator/jobs/measured_runs.h AttachMeasurements).
  absl::Status AttachMeasurements(const v1::PlanRequest& request, v1::Plan* plan) {
    return jobs::AttachMeasurements(store_, request, plan);
  }

  // The store's Health(): OK, or the DATA_LOSS that made it refuse every call.
  absl::Status StoreHealth() { return store_->Health(); }

 private:
  absl::StatusOr<store::JobRow> Row(absl::string_view name);

  store::Store* const store_;
  const CoordinatorContext context_;
};

}  // namespace switchyard::jobs

#endif  // SWITCHYARD_COORDINATOR_JOBS_JOB_REGISTRY_H_
