#include "coordinator/api/job_service.h"

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "coordinator/api/api_call.h"
#include "coordinator/jobs/job_state.h"

namespace switchyard::api {
JobServiceImpl::JobServiceImpl(JobHub* hub, const TokenAuth* auth,
                               metrics::CoordinatorMetrics* metrics)
    : hub_(hub), auth_(auth), metrics_(metrics) {}

grpc::Status JobServiceImpl::CreateJob(grpc::ServerContext* context,
                                       const v1::CreateJobRequest* request, v1::Job* response) {
  return ToGrpcStatus(
      RunApiCall(*auth_, metrics_, "CreateJob", AuthorizationOf(*context), [&]() -> absl::Status {
        SY_ASSIGN_OR_RETURN(*response, hub_->CreateJob(*request));
        return absl::OkStatus();
      }));
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                    v1::Job* response) {
  return ToGrpcStatus(
      RunApiCall(*auth_, metrics_, "GetJob", AuthorizationOf(*context), [&]() -> absl::Status {
        SY_ASSIGN_OR_RETURN(*response, hub_->GetJob(request->name()));
        return absl::OkStatus();
      }));
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context,
                                      const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  return ToGrpcStatus(
      RunApiCall(*auth_, metrics_, "ListJobs", AuthorizationOf(*context), [&]() -> absl::Status {
        SY_ASSIGN_OR_RETURN(*response, hub_->ListJobs(*request));
        return absl::OkStatus();
      }));
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context,
                                       const v1::CancelJobRequest* request, v1::Job* response) {
  return ToGrpcStatus(
      RunApiCall(*auth_, metrics_, "CancelJob", AuthorizationOf(*context), [&]() -> absl::Status {
        SY_ASSIGN_OR_RETURN(*response, hub_->CancelJob(request->name()));
        return absl::OkStatus();
      }));
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* context,
                                      const v1::WatchJobRequest* request,
                                      grpc::ServerWriter<v1::WatchJobResponse>* writer) {
  return ToGrpcStatus(RunApiCall(*auth_, metrics_, "WatchJob", AuthorizationOf(*context),
                                 [&] { return Watch(context, request->name(), writer); }));
}

absl::Status JobServiceImpl::Watch(grpc::ServerContext* context, const std::string& name,
                                   grpc::ServerWriter<v1::WatchJobResponse>* writer) {
  int64_t last_sequence = 0;
  while (true) {
    // Read the version first: a mutation after this point wakes the wait below.
    const uint64_t version = hub_->version();
    const absl::Time read_time = absl::Now();
    // The job before its events: if it is terminal here, the events read next include the
    // terminal one.
    SY_ASSIGN_OR_RETURN(v1::Job job, hub_->GetJob(name));
    SY_ASSIGN_OR_RETURN(std::vector<v1::JobEvent> events, hub_->ListEvents(name));
    for (v1::JobEvent& event : events) {
      if (event.sequence() <= last_sequence) continue;
      last_sequence = event.sequence();
      v1::WatchJobResponse response;
      *response.mutable_event() = std::move(event);
      if (!writer->Write(response)) {
        return absl::CancelledError("WatchJob: the client stopped reading");
      }
    }
    if (jobs::IsTerminal(job.state())) return absl::OkStatus();
    while (true) {
      if (context->IsCancelled()) return absl::CancelledError("WatchJob: cancelled by the client");
      if (hub_->closed())
        return absl::UnavailableError("WatchJob: the coordinator is shutting down");
      if (hub_->WaitForChange(version, kCancelPoll) != version) break;
      if (absl::Now() - read_time >= kWatchRefresh) break;
    }
  }
}

}  // namespace switchyard::api
