#include "coordinator/api/plan_service.h"

#include <string>

#include "common/grpc_status.h"
#include "common/job_paths.h"
#include "common/status.h"
#include "coordinator/api/api_call.h"
#include "coordinator/planner/planner.h"

namespace switchyard::api {

PlanServiceImpl::PlanServiceImpl(const TokenAuth* auth, metrics::CoordinatorMetrics* metrics)
    : auth_(auth), metrics_(metrics) {}

grpc::Status PlanServiceImpl::Plan(grpc::ServerContext* context, const v1::PlanRequest* request,
                                   v1::Plan* response) {
  return ToGrpcStatus(
      RunApiCall(*auth_, metrics_, "Plan", AuthorizationOf(*context), [&]() -> absl::Status {
        SY_RETURN_IF_ERROR(CheckJobSpecPaths(request->spec()));  // as CreateJob would
        // An empty training.save is the job's own directory (as in CreateJob), so save_interval
        // without it is planned, not rejected.
        v1::PlanRequest planned = *request;
        if (planned.spec().training().save().empty()) {
          planned.mutable_spec()->mutable_training()->set_save("<job directory>");
        }
        SY_ASSIGN_OR_RETURN(*response, planner::PlanJob(planned));
        return absl::OkStatus();
      }));
}

}  // namespace switchyard::api
