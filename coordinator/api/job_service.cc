#include "coordinator/api/job_service.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "coordinator/api/api_call.h"
#include "coordinator/jobs/job_state.h"

namespace switchyard::api {
void AttachLastStep(const jobs::StepHub* steps, v1::Job* job) {
  if (steps == nullptr) return;
  std::optional<v1::StepMetrics> step = steps->LastStep(job->name());
  if (step.has_value()) *job->mutable_last_step() = *std::move(step);
}

JobServiceImpl::JobServiceImpl(jobs::JobHub* hub, const TokenAuth* auth,
                               metrics::CoordinatorMetrics* metrics, jobs::StepHub* steps)
    : hub_(hub), auth_(auth), metrics_(metrics), steps_(steps) {}

grpc::Status JobServiceImpl::CreateJob(grpc::ServerContext* context,
                                       const v1::CreateJobRequest* request, v1::Job* response) {
  return ToGrpcStatus(
      RunApiCall(*auth_, metrics_, "CreateJob", AuthorizationOf(*context), [&]() -> absl::Status {
        // A caller that already gave up must not get a job it will never hear of; past this
        // check the deadline can still expire before the reply, hence request_id (job_service.h).
        if (context->IsCancelled() || absl::FromChrono(context->deadline()) <= absl::Now()) {
          return absl::DeadlineExceededError(
              "CreateJob: the call's deadline expired or it was cancelled before the job was "
              "created; nothing was created (retry with the same request_id)");
        }
        SY_ASSIGN_OR_RETURN(*response, hub_->CreateJob(*request));
        return absl::OkStatus();
      }));
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                    v1::Job* response) {
  return ToGrpcStatus(
      RunApiCall(*auth_, metrics_, "GetJob", AuthorizationOf(*context), [&]() -> absl::Status {
        SY_ASSIGN_OR_RETURN(*response, hub_->GetJob(request->name()));
        AttachLastStep(steps_, response);
        return absl::OkStatus();
      }));
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context,
                                      const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  return ToGrpcStatus(
      RunApiCall(*auth_, metrics_, "ListJobs", AuthorizationOf(*context), [&]() -> absl::Status {
        SY_ASSIGN_OR_RETURN(*response, hub_->ListJobs(*request));
        for (v1::Job& job : *response->mutable_jobs()) AttachLastStep(steps_, &job);
        return absl::OkStatus();
      }));
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context,
                                       const v1::CancelJobRequest* request, v1::Job* response) {
  return ToGrpcStatus(
      RunApiCall(*auth_, metrics_, "CancelJob", AuthorizationOf(*context), [&]() -> absl::Status {
        SY_ASSIGN_OR_RETURN(*response, hub_->CancelJob(request->name()));
        AttachLastStep(steps_, response);
        return absl::OkStatus();
      }));
}

grpc::Status JobServiceImpl::DeleteJob(grpc::ServerContext* context,
                                       const v1::DeleteJobRequest* request,
                                       google::protobuf::Empty* response) {
  (void)response;
  return ToGrpcStatus(RunApiCall(*auth_, metrics_, "DeleteJob", AuthorizationOf(*context),
                                 [&] { return hub_->DeleteJob(*request); }));
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* context,
                                      const v1::WatchJobRequest* request,
                                      grpc::ServerWriter<v1::WatchJobResponse>* writer) {
  return ToGrpcStatus(RunApiCall(*auth_, metrics_, "WatchJob", AuthorizationOf(*context),
                                 [&] { return Watch(context, request->name(), writer); }));
}

absl::Status JobServiceImpl::Watch(grpc::ServerContext* context, const std::string& name,
                                   grpc::ServerWriter<v1::WatchJobResponse>* writer) {
  // Validates the name (INVALID_ARGUMENT / NOT_FOUND) before subscribing to its steps.
  SY_RETURN_IF_ERROR(hub_->GetJob(name).status());
  std::shared_ptr<jobs::StepSubscription> steps =
      steps_ != nullptr ? steps_->Subscribe(name) : nullptr;
  auto drain_steps = [&]() -> absl::Status {
    if (steps == nullptr) return absl::OkStatus();
    while (std::optional<v1::StepMetrics> step = steps->Next(absl::ZeroDuration())) {
      v1::WatchJobResponse response;
      *response.mutable_step() = *std::move(step);
      if (!writer->Write(response)) {
        return absl::CancelledError("WatchJob: the client stopped reading");
      }
    }
    return absl::OkStatus();
  };
  int64_t last_sequence = 0;
  while (true) {
    // Read the version first: a mutation after this point wakes the wait below.
    const uint64_t version = hub_->version();
    const absl::Time read_time = absl::Now();
    // The job before its events: if it is terminal here, the events read next include the
    // terminal one.
    SY_ASSIGN_OR_RETURN(v1::Job job, hub_->GetJob(name));
    SY_ASSIGN_OR_RETURN(std::vector<v1::JobEvent> events, hub_->ListEvents(name));
    SY_RETURN_IF_ERROR(drain_steps());
    for (v1::JobEvent& event : events) {
      if (event.sequence() <= last_sequence) continue;
      last_sequence = event.sequence();
      v1::WatchJobResponse response;
      *response.mutable_event() = std::move(event);
      if (!writer->Write(response)) {
        return absl::CancelledError("WatchJob: the client stopped reading");
      }
    }
    if (jobs::IsTerminal(job.state())) return drain_steps();
    while (true) {
      if (context->IsCancelled()) return absl::CancelledError("WatchJob: cancelled by the client");
      if (hub_->closed()) {
        return absl::UnavailableError("WatchJob: the coordinator is shutting down");
      }
      SY_RETURN_IF_ERROR(drain_steps());
      const absl::Duration wait = steps != nullptr ? kStepPoll : kCancelPoll;
      if (hub_->WaitForChange(version, wait) != version) break;
      if (absl::Now() - read_time >= jobs::kWatchRefresh) break;
    }
  }
}

}  // namespace switchyard::api
