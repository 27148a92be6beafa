// File: coordinator/jobs/job_hub.h
//
// The JobRegistry with change notification: every mutation that goes through the hub (create,
// cancel, transition, checkpoint) bumps a version number and wakes the threads blocked in
// WaitForChange, so JobService.WatchJob streams new events as they are written instead of polling
// the store. The gRPC JobService, the REST gateway and (later) the WorkerService share one hub;
// mutations that bypass it (another process writing the same store file) are still seen, but
// only when a watcher re-reads on its periodic wake-up (kWatchRefresh).
//
// The hub also feeds the lifecycle counter metrics (restarts, preemptions, scale-ups): every
// successful transition calls the `on_transition` callback with the job and the reason.
//
// DeleteJob removes a finished job (JobRegistry::DeleteJob) and, when asked, its checkpoint
// directory jobs::JobCheckpointDir(checkpoint_root, id) = <checkpoint_root>/jobs/<id> first (every
// file a job writes is inside it: its training.save is relative to it, common/config/job_paths.h):
// if that removal fails nothing is deleted.
//
// Close() wakes every waiter for good (graceful shutdown): WaitForChange then returns at once and
// closed() is true.
//
// Thread safety: any thread may call any method.
#ifndef SWITCHYARD_COORDINATOR_API_JOB_HUB_H_
#define SWITCHYARD_COORDINATOR_API_JOB_HUB_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/jobs/job_registry.h"
#include "switchyard/v1/job.pb.h"

namespace switchyard::jobs {

// How often a watcher re-reads the store even without a notification (writers outside the hub).
inline constexpr absl::Duration kWatchRefresh = absl::Seconds(1);

class JobHub {
 public:
  // `registry` must outlive the hub. `on_transition` (may be empty) is called after each
  // successful transition with the job as it now is and the transition's reason. `checkpoint_root`
  // (empty: unknown) is where the scheduler puts job checkpoints (ServerOptions.checkpoint_root);
  // `make_job_directories`: CreateJob creates each new job's directory under it (a coordinator that
  // serves workers).
  using TransitionCallback = std::function<void(const v1::Job& job, absl::string_view reason)>;
  explicit JobHub(jobs::JobRegistry* registry, TransitionCallback on_transition = {},
                  std::string checkpoint_root = "", bool make_job_directories = false);
  JobHub(const JobHub&) = delete;
  JobHub& operator=(const JobHub&) = delete;

  // JobRegistry::CreateJob; with make_job_directories, the new job's directory
  // <checkpoint_root>/jobs/<id> (and the root and <root>/jobs) is created mode 0700 when missing,
  // inside the transaction that creates the job: workers then find it, and a Kubernetes subPath
  // mount of it finds it existing and owned by the coordinator's uid. FAILED_PRECONDITION naming
  // the directory and errno when it cannot be made; then no job is stored.
  absl::StatusOr<v1::Job> CreateJob(const v1::CreateJobRequest& request);
  // Same contracts as JobRegistry's methods of the same names.
  absl::StatusOr<v1::Job> GetJob(absl::string_view name);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request);
  absl::StatusOr<v1::Job> CancelJob(absl::string_view name);
  absl::StatusOr<v1::Job> Transition(absl::string_view name, jobs::State to,
                                     absl::string_view reason, absl::string_view message = "",
                                     const v1::Plan* plan = nullptr);
  absl::StatusOr<v1::Job> RecordCheckpoint(absl::string_view name, int64_t step);
  absl::StatusOr<v1::Job> RecordWaitReason(absl::string_view name, absl::string_view reason,
                                           absl::string_view message);
  // The scheduler's view of its queues after each pass (scheduler.h "Queues"). `waiting`: job
  // name -> its QueueStatus, for every job waiting there; GetJob and ListJobs fill
  // Job.queue_status from it (jobs not in it get none). `usage`: one entry per queue.
  struct QueueUsage {
    std::string queue;
    std::optional<int32_t> quota;  // nullopt: no quota
    int32_t workers_in_use = 0;    // workers of the queue's generations in flight
    int32_t pending = 0;           // its jobs waiting for admission
  };
  void SetQueueState(std::map<std::string, v1::QueueStatus> waiting, std::vector<QueueUsage> usage);
  std::vector<QueueUsage> QueueState() const;
  // What ResolveJobSpec fills on this coordinator (the registry's context).
  const jobs::CoordinatorContext& context() const { return registry_->context(); }
  // The measured columns and the calibration of a plan (JobRegistry::AttachMeasurements); not a
  // job change.
  absl::Status AttachMeasurements(const v1::PlanRequest& request, v1::Plan* plan) {
    return registry_->AttachMeasurements(request, plan);
  }
  // Not a job change: watchers are not woken (they get steps from the StepHub).
  absl::Status RecordLastStep(absl::string_view name, const v1::StepMetrics& step);
  absl::Status RecordLastValidation(absl::string_view name, const v1::StepMetrics& step);
  absl::StatusOr<std::vector<v1::JobEvent>> ListEvents(absl::string_view name);
  // AIP-135 (job.proto's DeleteJobRequest): NOT_FOUND for an absent job unless allow_missing;
  // FAILED_PRECONDITION naming the state for an unfinished one; with delete_checkpoints and no
  // checkpoint root or a spec-chosen training.save, FAILED_PRECONDITION; a directory that cannot be
  // removed is INTERNAL naming it, and the job is kept.
  absl::Status DeleteJob(const v1::DeleteJobRequest& request);
  // OK, or why the store refuses to serve (it found corruption): /healthz and gRPC health.
  absl::Status StoreHealth();

  // The number of successful mutations so far.
  uint64_t version() const;
  // Blocks until version() != `seen`, Close() is called, or `timeout` passes; returns version().
  uint64_t WaitForChange(uint64_t seen, absl::Duration timeout) const;

  void Close();
  bool closed() const;

 private:
  // Bumps the version and wakes the waiters when `result` is OK; returns it.
  absl::StatusOr<v1::Job> Notify(absl::StatusOr<v1::Job> result);

  jobs::JobRegistry* const registry_;
  const TransitionCallback on_transition_;
  mutable absl::Mutex queue_mu_;
  std::map<std::string, v1::QueueStatus> waiting_ ABSL_GUARDED_BY(queue_mu_);
  std::vector<QueueUsage> usage_ ABSL_GUARDED_BY(queue_mu_);
  // Job.queue_status from waiting_ (cleared when the job is not waiting there).
  void FillQueueStatus(v1::Job* job) const;
  const std::string checkpoint_root_;
  const bool make_job_directories_;
  mutable absl::Mutex mu_;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace switchyard::jobs

#endif  // SWITCHYARD_COORDINATOR_API_JOB_HUB_H_
