#include "coordinator/api/plan_service.h"

#include <string>
#include <utility>

#include "common/grpc_status.h"
#include "common/status.h"
#include "coordinator/api/api_call.h"
#include "coordinator/api/api_status.h"
#include "coordinator/planner/planner.h"

namespace switchyard::api {

absl::StatusOr<v1::Plan> PlanForUser(const v1::PlanRequest& request,
                                     const jobs::CoordinatorContext& context, jobs::JobHub* hub) {
  v1::SearchScope scope;
  SY_ASSIGN_OR_RETURN(v1::PlanRequest resolved, jobs::ResolvePlanRequest(request, context, &scope));
  absl::StatusOr<v1::Plan> plan = planner::PlanJob(resolved);
  if (plan.status().code() == absl::StatusCode::kResourceExhausted) {
    return WithReason(plan.status(), "NO_FEASIBLE_PLAN");
  }
  if (plan.ok() && request.has_search()) *plan->mutable_search() = std::move(scope);
  if (plan.ok() && hub != nullptr) SY_RETURN_IF_ERROR(hub->AttachMeasurements(resolved, &*plan));
  return plan;
}

PlanServiceImpl::PlanServiceImpl(const TokenAuth* auth, metrics::CoordinatorMetrics* metrics,
                                 jobs::CoordinatorContext context, jobs::JobHub* hub)
    : auth_(auth), metrics_(metrics), context_(std::move(context)), hub_(hub) {}

grpc::Status PlanServiceImpl::Plan(grpc::ServerContext* context, const v1::PlanRequest* request,
                                   v1::Plan* response) {
  return ToGrpcStatus(
      RunApiCall(*auth_, metrics_, "Plan", AuthorizationOf(*context), [&]() -> absl::Status {
        SY_ASSIGN_OR_RETURN(*response, PlanForUser(*request, context_, hub_));
        return absl::OkStatus();
      }));
}

}  // namespace switchyard::api
