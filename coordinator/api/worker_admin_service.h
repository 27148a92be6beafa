// File: coordinator/api/worker_admin_service.h
//
// switchyard.v1.WorkerAdminService: ListWorkers returns every worker the registry knows
// (coordinator/cluster/worker_registry.h), sorted by id: state, job/generation/rank while busy,
// the stream's connection, registration and last heartbeat times. Authenticated and measured like
// every API call (api_call.h). ToWorkerStatus is shared with the REST route GET /v1/workers.
//
// Thread safety: the registry is thread-safe; gRPC calls ListWorkers concurrently.
#ifndef SWITCHYARD_COORDINATOR_API_WORKER_ADMIN_SERVICE_H_
#define SWITCHYARD_COORDINATOR_API_WORKER_ADMIN_SERVICE_H_

#include "coordinator/api/auth.h"
#include "coordinator/cluster/worker_registry.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "switchyard/v1/worker.grpc.pb.h"

namespace switchyard::api {

v1::WorkerStatus ToWorkerStatus(const cluster::WorkerInfo& info);
// Every registered worker, sorted by id.
v1::ListWorkersResponse ListAllWorkers(const cluster::WorkerRegistry& registry);

class WorkerAdminServiceImpl final : public v1::WorkerAdminService::Service {
 public:
  // `auth` and `registry` must outlive the service; `metrics` may be null.
  WorkerAdminServiceImpl(const TokenAuth* auth, metrics::CoordinatorMetrics* metrics,
                         const cluster::WorkerRegistry* registry);

  grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;

 private:
  const TokenAuth* const auth_;
  metrics::CoordinatorMetrics* const metrics_;
  const cluster::WorkerRegistry* const registry_;
};

}  // namespace switchyard::api

#endif  // SWITCHYARD_COORDINATOR_API_WORKER_ADMIN_SERVICE_H_
