#include "coordinator/api/worker_admin_service.h"

#include <algorithm>

#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "coordinator/api/api_call.h"

namespace switchyard::api {
namespace {

void SetTime(absl::Time t, google::protobuf::Timestamp* out) {
  if (t == absl::InfinitePast()) return;
  const int64_t ns = absl::ToUnixNanos(t);
  out->set_seconds(ns / 1000000000);
  out->set_nanos(static_cast<int32_t>(ns % 1000000000));
}

v1::WorkerStatus::State ToState(cluster::WorkerState s) {
  switch (s) {
    case cluster::WorkerState::kIdle:
      return v1::WorkerStatus::IDLE;
    case cluster::WorkerState::kBusy:
      return v1::WorkerStatus::BUSY;
    case cluster::WorkerState::kLost:
      return v1::WorkerStatus::LOST;
  }
  return v1::WorkerStatus::STATE_UNSPECIFIED;
}

}  // namespace

v1::WorkerStatus ToWorkerStatus(const cluster::WorkerInfo& info) {
  v1::WorkerStatus w;
  w.set_worker_id(info.id);
  w.set_host(info.host);
  if (info.gpu.has_value()) *w.mutable_gpu() = *info.gpu;
  w.set_version(info.version);
  w.set_state(ToState(info.state));
  const bool busy = info.state == cluster::WorkerState::kBusy;
  w.set_job(busy ? info.job : "");
  w.set_generation(busy ? info.generation : 0);
  w.set_rank(busy ? info.rank : -1);
  w.set_connected(info.connected);
  SetTime(info.registered_at, w.mutable_registered_time());
  SetTime(info.last_heartbeat, w.mutable_last_heartbeat_time());
  return w;
}

v1::ListWorkersResponse ListAllWorkers(const cluster::WorkerRegistry& registry) {
  std::vector<cluster::WorkerInfo> all = registry.List();
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  v1::ListWorkersResponse response;
  for (const cluster::WorkerInfo& info : all) *response.add_workers() = ToWorkerStatus(info);
  return response;
}

WorkerAdminServiceImpl::WorkerAdminServiceImpl(const TokenAuth* auth,
                                               metrics::CoordinatorMetrics* metrics,
                                               const cluster::WorkerRegistry* registry)
    : auth_(auth), metrics_(metrics), registry_(registry) {}

grpc::Status WorkerAdminServiceImpl::ListWorkers(grpc::ServerContext* context,
                                                 const v1::ListWorkersRequest*,
                                                 v1::ListWorkersResponse* response) {
  return ToGrpcStatus(
      RunApiCall(*auth_, metrics_, "ListWorkers", AuthorizationOf(*context), [&]() -> absl::Status {
        *response = ListAllWorkers(*registry_);
        return absl::OkStatus();
      }));
}

}  // namespace switchyard::api
