// File: coordinator/api/plan_service.h
//
// switchyard.v1.PlanService over the planner (coordinator/planner/planner.h): Plan checks the
// spec's paths as CreateJob does (common/job_paths.h CheckJobSpecPaths), then returns
// PlanJob's plan, or its INVALID_ARGUMENT (field and rule) / RESOURCE_EXHAUSTED (no mapping fits,
// reason NO_FEASIBLE_PLAN) with a reason attached. Authenticated and measured like every API call
// (api_call.h). Planning is pure computation; nothing is stored.
//
// Thread safety: stateless; gRPC calls Plan concurrently.
#ifndef SWITCHYARD_COORDINATOR_API_PLAN_SERVICE_H_
#define SWITCHYARD_COORDINATOR_API_PLAN_SERVICE_H_

#include "coordinator/api/auth.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "switchyard/v1/plan.grpc.pb.h"

namespace switchyard::api {

class PlanServiceImpl final : public v1::PlanService::Service {
 public:
  // `auth` must outlive the service; `metrics` may be null.
  PlanServiceImpl(const TokenAuth* auth, metrics::CoordinatorMetrics* metrics);

  grpc::Status Plan(grpc::ServerContext* context, const v1::PlanRequest* request,
                    v1::Plan* response) override;

 private:
  const TokenAuth* const auth_;
  metrics::CoordinatorMetrics* const metrics_;
};

}  // namespace switchyard::api

#endif  // SWITCHYARD_COORDINATOR_API_PLAN_SERVICE_H_
