// File: coordinator/workers/rendezvous_service.cc
#include "coordinator/workers/rendezvous_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace switchyard::workers {
namespace {

absl::Status CheckScope(absl::string_view job, int64_t generation, absl::string_view key) {
  if (job.empty()) return absl::InvalidArgumentError("job must not be empty");
  if (generation < 1) {
    return absl::InvalidArgumentError(absl::StrCat("generation (", generation, ") must be >= 1"));
  }
  if (key.empty()) return absl::InvalidArgumentError("key must not be empty");
  if (key.size() > kMaxRendezvousKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("key (", key.size(), " bytes) must be at most ",
                                                   kMaxRendezvousKeyBytes, " bytes"));
  }
  return absl::OkStatus();
}

std::string Scope(absl::string_view job, int64_t generation) {
  return absl::StrCat(job, " generation ", generation);
}

}  // namespace

absl::Status RendezvousStore::Adopt(const std::string& job, int64_t generation) {
  JobKeys& keys = jobs_[job];
  if (generation < keys.generation) {
    return absl::FailedPreconditionError(absl::StrCat("generation ", generation, " of ", job,
                                                      " is older than its newest (",
                                                      keys.generation, "); its keys were dropped"));
  }
  if (generation > keys.generation) {
    keys.generation = generation;
    keys.values.clear();
  }
  return absl::OkStatus();
}

absl::Status RendezvousStore::Set(const v1::RendezvousSetRequest& request) {
  if (auto status = CheckScope(request.job(), request.generation(), request.key()); !status.ok()) {
    return status;
  }
  if (request.value().size() > kMaxRendezvousValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("value (", request.value().size(),
                                                   " bytes) must be at most ",
                                                   kMaxRendezvousValueBytes, " bytes"));
  }
  absl::MutexLock lock(&mu_);
  if (auto status = Adopt(request.job(), request.generation()); !status.ok()) return status;
  jobs_[request.job()].values[request.key()] = request.value();
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousStore::Get(const v1::RendezvousGetRequest& request) {
  if (auto status = CheckScope(request.job(), request.generation(), request.key()); !status.ok()) {
    return status;
  }
  if (request.timeout_ms() < 0 || request.timeout_ms() > kMaxRendezvousTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "timeout_ms (", request.timeout_ms(), ") must be in [0, ", kMaxRendezvousTimeoutMs, "]"));
  }
  const absl::Time deadline = absl::Now() + absl::Milliseconds(request.timeout_ms());
  absl::MutexLock lock(&mu_);
  if (auto status = Adopt(request.job(), request.generation()); !status.ok()) return status;
  // Present, or the generation moved on (the job may also be dropped: then the entry is gone).
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = jobs_.find(request.job());
    return it == jobs_.end() || it->second.generation != request.generation() ||
           it->second.values.count(request.key()) > 0;
  };
  mu_.AwaitWithDeadline(absl::Condition(&settled), deadline);
  auto it = jobs_.find(request.job());
  if (it == jobs_.end() || it->second.generation != request.generation()) {
    return absl::FailedPreconditionError(absl::StrCat(
        Scope(request.job(), request.generation()), " was dropped while waiting for key '",
        request.key(), "' (a newer generation started or the job ended)"));
  }
  auto value = it->second.values.find(request.key());
  if (value == it->second.values.end()) {
    return absl::DeadlineExceededError(
        absl::StrCat("key '", request.key(), "' of ", Scope(request.job(), request.generation()),
                     " was not set within ", request.timeout_ms(), " ms"));
  }
  return value->second;
}

void RendezvousStore::DropBefore(absl::string_view job, int64_t generation) {
  absl::MutexLock lock(&mu_);
  JobKeys& keys = jobs_[std::string(job)];
  if (generation > keys.generation) {
    keys.generation = generation;
    keys.values.clear();
  }
}

void RendezvousStore::DropJob(absl::string_view job) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it != jobs_.end()) jobs_.erase(it);
}

int RendezvousStore::KeyCount(absl::string_view job, int64_t generation) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end() || it->second.generation != generation) return 0;
  return static_cast<int>(it->second.values.size());
}

RendezvousServiceImpl::RendezvousServiceImpl(RendezvousStore* store, const api::TokenAuth* auth)
    : store_(store), auth_(auth) {}

absl::Status RendezvousServiceImpl::Authenticate(grpc::ServerContext* context) const {
  if (auth_ == nullptr) return absl::OkStatus();
  return auth_->Check(api::AuthorizationOf(*context));
}

grpc::Status RendezvousServiceImpl::Set(grpc::ServerContext* context,
                                        const v1::RendezvousSetRequest* request,
                                        v1::RendezvousSetResponse* /*response*/) {
  if (auto status = Authenticate(context); !status.ok()) return ToGrpcStatus(status);
  return ToGrpcStatus(store_->Set(*request));
}

grpc::Status RendezvousServiceImpl::Get(grpc::ServerContext* context,
                                        const v1::RendezvousGetRequest* request,
                                        v1::RendezvousGetResponse* response) {
  if (auto status = Authenticate(context); !status.ok()) return ToGrpcStatus(status);
  absl::StatusOr<std::string> value = store_->Get(*request);
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*std::move(value));
  return grpc::Status::OK;
}

}  // namespace switchyard::workers
