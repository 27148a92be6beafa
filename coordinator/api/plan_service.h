// File: coordinator/api/plan_service.h
//
// switchyard.v1.PlanService over the planner (coordinator/planner/planner.h): Plan resolves the
// request like a submitted job (jobs::ResolvePlanRequest: defaults, the default corpus's
// vocabulary, the coordinator's checkpoint directory, the submit rules and path rules, the workers'
// parallelism, or with PlanRequest.search the sizes the spec leaves unset freed over one world)
// and returns PlanJob's plan, or its INVALID_ARGUMENT (field and rule) /
// RESOURCE_EXHAUSTED (no mapping fits, reason NO_FEASIBLE_PLAN) with a reason attached.
// Authenticated and measured like every API call (api_call.h). Planning is pure computation plus
// one read of the store's jobs (the measured columns and the calibration); nothing is stored.
//
// Thread safety: stateless; gRPC calls Plan concurrently.
#ifndef SWITCHYARD_COORDINATOR_API_PLAN_SERVICE_H_
#define SWITCHYARD_COORDINATOR_API_PLAN_SERVICE_H_

#include "absl/status/statusor.h"
#include "coordinator/api/auth.h"
#include "coordinator/jobs/job_hub.h"
#include "coordinator/jobs/resolve_spec.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "switchyard/v1/plan.grpc.pb.h"

namespace switchyard::api {

// What Plan (gRPC) and POST /v1/plans (REST) both answer: the request resolved like a submitted
// job, then PlanJob, then (with a hub) what this coordinator's jobs of the same workload measured
// on each ranked mapping (PlanCandidate.measured) and, when any mapping of it was measured, the
// step-time calibration fitted on those runs: each ranked candidate's calibrated_step_seconds,
// the ranking by it, Plan.calibration (coordinator/jobs/measured_runs.h). With request.search
// (plan.proto PlanSearch) the sizes the spec leaves unset are varied over one world
// (ResolvePlanRequest): every feasible mapping of it ranked (estimated, calibrated where a
// calibration exists, measured where a job ran it), every other one rejected with its rule, and
// Plan.search says what was searched; without it the plan is the scheduler's one mapping. The
// planner's RESOURCE_EXHAUSTED (nothing fits in memory) carries reason NO_FEASIBLE_PLAN; no other
// error gets that reason (a full disk is RESOURCE_EXHAUSTED too).
absl::StatusOr<v1::Plan> PlanForUser(const v1::PlanRequest& request,
                                     const jobs::CoordinatorContext& context,
                                     jobs::JobHub* hub = nullptr);

class PlanServiceImpl final : public v1::PlanService::Service {
 public:
  // `auth` must outlive the service; `metrics` may be null; `context` as the JobRegistry's;
  // `hub` (may be null: no measured columns) must outlive the service.
  PlanServiceImpl(const TokenAuth* auth, metrics::CoordinatorMetrics* metrics,
                  jobs::CoordinatorContext context = {}, jobs::JobHub* hub = nullptr);

  grpc::Status Plan(grpc::ServerContext* context, const v1::PlanRequest* request,
                    v1::Plan* response) override;

 private:
  const TokenAuth* const auth_;
  metrics::CoordinatorMetrics* const metrics_;
  const jobs::CoordinatorContext context_;
  jobs::JobHub* const hub_;
};

}  // namespace switchyard::api

#endif  // SWITCHYARD_COORDINATOR_API_PLAN_SERVICE_H_
