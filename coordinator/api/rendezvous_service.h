// File: coordinator/api/rendezvous_service.h
//
// switchyard.v1.RendezvousService (proto/switchyard/v1/worker.proto, WORKER_PROTOCOL.md
// "Rendezvous"): a key-value store in memory through which the ranks of one generation of a job
// exchange NCCL unique ids and Gloo addresses.
//
// Contracts:
// - Keys exist only for a live generation. The scheduler opens generation g of a job when it
//   starts it (OpenGeneration: the keys of older generations are dropped), ends it when the
//   generation stops for any reason (EndGeneration: its keys are dropped) and forgets the job
//   when it reaches a terminal state (DropJob). A Set or Get naming a job with no open
//   generation here, or another generation than the open one, is FAILED_PRECONDITION naming the
//   job and both generations; nothing is stored for it.
// - Only the ranks of that generation may use it: the request's worker_id must be a worker the
//   registry lists as assigned to (job, generation); otherwise PERMISSION_DENIED naming the
//   worker and what it runs. The generation is checked first, so a rank of a generation that
//   ended gets FAILED_PRECONDITION (retryable for the worker), never PERMISSION_DENIED. (All
//   workers share the worker token, so this guards against mistakes and stale ranks, not against a
//   hostile holder of the worker token.)
// - Limits: a value of at most kMaxRendezvousValueBytes, at most kMaxRendezvousKeysPerGeneration
//   keys and kMaxRendezvousBytesPerGeneration bytes (keys + values) per generation; a Set beyond
//   one is RESOURCE_EXHAUSTED naming the limit and stores nothing. So the store holds at most
//   (open generations) x kMaxRendezvousBytesPerGeneration, and nothing once they end.
// - Set overwrites. Get returns the value at once when present, otherwise waits up to timeout_ms
//   for a Set of the key and then fails DEADLINE_EXCEEDED naming the key, job and generation. A
//   Get blocked on a generation that ends meanwhile fails FAILED_PRECONDITION.
// - Bad requests are INVALID_ARGUMENT naming the field and rule: empty `job`, `key` or
//   `worker_id`, generation < 1, timeout_ms < 0 or > kMaxRendezvousTimeoutMs, a key longer than
//   kMaxRendezvousKeyBytes.
// - Every call must carry the worker token (coordinator/api/auth.h, role "worker") when an auth
//   is given; the user (API) token is refused with WRONG_ROLE.
//
// Thread safety: gRPC calls the methods concurrently; the store is guarded by one mutex.
#ifndef SWITCHYARD_COORDINATOR_API_RENDEZVOUS_SERVICE_H_
#define SWITCHYARD_COORDINATOR_API_RENDEZVOUS_SERVICE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "coordinator/api/auth.h"
#include "coordinator/cluster/rendezvous_store.h"
#include "coordinator/cluster/worker_registry.h"
#include "switchyard/v1/worker.grpc.pb.h"

namespace switchyard::api {

class RendezvousServiceImpl final : public v1::RendezvousService::Service {
 public:
  // `store` must outlive the service; `auth` (the worker token) and `workers` (the registry that
  // says which worker runs which rank) may be null (no authentication / no rank check: tests of
  // the store alone) or must outlive it.
  RendezvousServiceImpl(cluster::RendezvousStore* store, const api::TokenAuth* auth,
                        const cluster::WorkerRegistry* workers);

  grpc::Status Set(grpc::ServerContext* context, const v1::RendezvousSetRequest* request,
                   v1::RendezvousSetResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const v1::RendezvousGetRequest* request,
                   v1::RendezvousGetResponse* response) override;

 private:
  absl::Status Authenticate(grpc::ServerContext* context, absl::string_view method) const;
  // PERMISSION_DENIED unless `worker_id` is assigned to (job, generation).
  absl::Status CheckRank(absl::string_view worker_id, absl::string_view job,
                         int64_t generation) const;
  // Every check a Set or Get passes, in order: the worker token, the key's scope, a live
  // generation, the caller a rank of it.
  absl::Status Admit(grpc::ServerContext* context, absl::string_view method, const std::string& job,
                     int64_t generation, const std::string& key,
                     const std::string& worker_id) const;

  cluster::RendezvousStore* const store_;
  const api::TokenAuth* const auth_;
  const cluster::WorkerRegistry* const workers_;
};

}  // namespace switchyard::api

#endif  // SWITCHYARD_COORDINATOR_API_RENDEZVOUS_SERVICE_H_
