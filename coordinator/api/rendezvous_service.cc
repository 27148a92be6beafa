// File: coordinator/api/rendezvous_service.cc
#include "coordinator/api/rendezvous_service.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status.h"

namespace switchyard::api {

RendezvousServiceImpl::RendezvousServiceImpl(cluster::RendezvousStore* store,
                                             const api::TokenAuth* auth,
                                             const cluster::WorkerRegistry* workers)
    : store_(store), auth_(auth), workers_(workers) {}

absl::Status RendezvousServiceImpl::Authenticate(grpc::ServerContext* context,
                                                 absl::string_view method) const {
  if (auth_ == nullptr) return absl::OkStatus();
  return auth_->Check(api::AuthorizationOf(*context), method);
}

absl::Status RendezvousServiceImpl::CheckRank(absl::string_view worker_id, absl::string_view job,
                                              int64_t generation) const {
  if (workers_ == nullptr) return absl::OkStatus();
  if (worker_id.empty()) {
    return absl::InvalidArgumentError(
        "worker_id must not be empty: only the ranks of a running generation may rendezvous");
  }
  std::optional<cluster::WorkerInfo> worker = workers_->Get(std::string(worker_id));
  if (!worker) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker '", worker_id, "' is not attached to this coordinator"));
  }
  if (worker->job != job || worker->generation != generation) {
    return absl::PermissionDeniedError(absl::StrCat(
        "worker '", worker_id, "' is not a rank of ", cluster::RendezvousScopeName(job, generation),
        worker->job.empty()
            ? " (it runs nothing)"
            : absl::StrCat(" (it runs ",
                           cluster::RendezvousScopeName(worker->job, worker->generation), ")")));
  }
  return absl::OkStatus();
}

absl::Status RendezvousServiceImpl::Admit(grpc::ServerContext* context, absl::string_view method,
                                          const std::string& job, int64_t generation,
                                          const std::string& key,
                                          const std::string& worker_id) const {
  SY_RETURN_IF_ERROR(Authenticate(context, method));
  SY_RETURN_IF_ERROR(cluster::CheckRendezvousScope(job, generation, key));
  SY_RETURN_IF_ERROR(store_->CheckLive(job, generation));
  return CheckRank(worker_id, job, generation);
}

grpc::Status RendezvousServiceImpl::Set(grpc::ServerContext* context,
                                        const v1::RendezvousSetRequest* request,
                                        v1::RendezvousSetResponse* /*response*/) {
  if (auto status = Admit(context, "RendezvousService.Set", request->job(), request->generation(),
                          request->key(), request->worker_id());
      !status.ok()) {
    return ToGrpcStatus(status);
  }
  return ToGrpcStatus(store_->Set(*request));
}

grpc::Status RendezvousServiceImpl::Get(grpc::ServerContext* context,
                                        const v1::RendezvousGetRequest* request,
                                        v1::RendezvousGetResponse* response) {
  if (auto status = Admit(context, "RendezvousService.Get", request->job(), request->generation(),
                          request->key(), request->worker_id());
      !status.ok()) {
    return ToGrpcStatus(status);
  }
  absl::StatusOr<std::string> value = store_->Get(*request);
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*std::move(value));
  return grpc::Status::OK;
}
}  // namespace switchyard::api
