// File: coordinator/api/job_service.h
//
// switchyard.v1.JobService (proto/switchyard/v1/job.proto) over a JobHub. Each method
// authenticates and records metrics through RunApiCall (api_call.h); errors are the registry's
// (job_registry.h: INVALID_ARGUMENT naming the field and rule, NOT_FOUND, ALREADY_EXISTS for a
// reused request_id with another spec, FAILED_PRECONDITION for a refused transition or the deletion
// of an unfinished job; the store's DATA_LOSS, RESOURCE_EXHAUSTED (STORE_FULL) and UNAVAILABLE
// (STORE_BUSY), which name the store file and carry no SQL) with a reason attached (api_status.h),
// mapped 1:1 onto gRPC codes.
//
// CreateJob under a deadline: a call whose deadline has already expired (or that was cancelled)
// when the handler runs is DEADLINE_EXCEEDED and creates nothing. The deadline can still expire
// between that check and the reply, so a client that got DEADLINE_EXCEEDED cannot know whether
// the job exists: it must retry with the same request_id, which returns the job already created
// (AIP-155, job_registry.h) instead of a duplicate. syctl submit does exactly that (cli/README.md).
//
// WatchJob: first replays the job's whole event log, then streams each new event as it is
// written (the hub wakes the stream on every mutation; it also re-reads the store every
// kWatchRefresh to see writers outside the hub). The stream ends OK right after the event that
// made the job terminal (SUCCEEDED, FAILED, CANCELLED); a watch of a job already terminal replays
// and ends. It ends CANCELLED when the client cancels (noticed within kCancelPoll) and UNAVAILABLE
// when the coordinator shuts down. With a StepHub (the worker side's rank-0 step reports), step
// reports published after the watch started are streamed too (WatchJobResponse.step; a slow
// watcher loses the oldest, see workers/step_hub.h); they reach the client within kStepPoll and
// are ordered among themselves, not against the events. Job.last_step (GetJob, ListJobs,
// CancelJob) comes from the same hub: it is in memory only, empty after a coordinator restart.
//
// Thread safety: gRPC calls the methods concurrently; the class holds no mutable state.
#ifndef SWITCHYARD_COORDINATOR_API_JOB_SERVICE_H_
#define SWITCHYARD_COORDINATOR_API_JOB_SERVICE_H_

#include "absl/time/time.h"
#include "coordinator/api/auth.h"
#include "coordinator/jobs/job_hub.h"
#include "coordinator/jobs/step_hub.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "switchyard/v1/job.grpc.pb.h"

namespace switchyard::api {

// How often a blocked WatchJob checks whether its client went away.
inline constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);
// How often a WatchJob with a step subscription drains it.
inline constexpr absl::Duration kStepPoll = absl::Milliseconds(10);

// Sets job->last_step from `steps` (no-op when `steps` is null or has no step for the job).
void AttachLastStep(const jobs::StepHub* steps, v1::Job* job);

class JobServiceImpl final : public v1::JobService::Service {
 public:
  // All must outlive the service; `metrics` and `steps` may be null.
  JobServiceImpl(jobs::JobHub* hub, const TokenAuth* auth, metrics::CoordinatorMetrics* metrics,
                 jobs::StepHub* steps = nullptr);

  grpc::Status CreateJob(grpc::ServerContext* context, const v1::CreateJobRequest* request,
                         v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::Job* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* context, const v1::DeleteJobRequest* request,
                         google::protobuf::Empty* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::WatchJobResponse>* writer) override;

 private:
  absl::Status Watch(grpc::ServerContext* context, const std::string& name,
                     grpc::ServerWriter<v1::WatchJobResponse>* writer);

  jobs::JobHub* const hub_;
  const TokenAuth* const auth_;
  metrics::CoordinatorMetrics* const metrics_;
  jobs::StepHub* const steps_;
};

}  // namespace switchyard::api

#endif  // SWITCHYARD_COORDINATOR_API_JOB_SERVICE_H_
