// File: coordinator/workers/rendezvous_service.h
//
// switchyard.v1.RendezvousService (proto/switchyard/v1/worker.proto, WORKER_PROTOCOL.md
// "Rendezvous"): a key-value store in memory through which the ranks of one generation of a job
// exchange NCCL unique ids and Gloo addresses.
//
// Contracts:
// - Keys are scoped by (job, generation). Each job keeps only its newest generation: a Set or
//   Get naming a newer generation, or DropBefore(job, g) from the scheduler when it starts
//   generation g, drops every key of the older ones. A Set or Get naming an older generation than
//   the job's newest is FAILED_PRECONDITION naming both generations (a rank of a stopped
//   generation must not rendezvous with the new one).
// - Set overwrites. Get returns the value at once when present, otherwise waits up to timeout_ms
//   for a Set of the key and then fails DEADLINE_EXCEEDED naming the key, job and generation. A
//   Get blocked on a generation that is dropped meanwhile fails FAILED_PRECONDITION.
// - Bad requests are INVALID_ARGUMENT naming the field and rule: empty `job` or `key`,
//   generation < 1, timeout_ms < 0 or > kMaxRendezvousTimeoutMs, a key longer than
//   kMaxRendezvousKeyBytes, a value larger than kMaxRendezvousValueBytes.
// - Every call is authenticated like the API (coordinator/api/auth.h) when an auth is given.
//
// Thread safety: gRPC calls the methods concurrently; the store is guarded by one mutex.
#ifndef SWITCHYARD_COORDINATOR_WORKERS_RENDEZVOUS_SERVICE_H_
#define SWITCHYARD_COORDINATOR_WORKERS_RENDEZVOUS_SERVICE_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/api/auth.h"
#include "switchyard/v1/worker.grpc.pb.h"

namespace switchyard::workers {

inline constexpr int64_t kMaxRendezvousTimeoutMs = 10 * 60 * 1000;
inline constexpr size_t kMaxRendezvousKeyBytes = 1024;
inline constexpr size_t kMaxRendezvousValueBytes = 1 << 20;

// The store behind the service, usable without gRPC (the scheduler drops generations through it).
class RendezvousStore {
 public:
  absl::Status Set(const v1::RendezvousSetRequest& request);
  absl::StatusOr<std::string> Get(const v1::RendezvousGetRequest& request);

  // Drops the keys of every generation of `job` older than `generation` and makes `generation`
  // the newest (Gets blocked on an older one fail).
  void DropBefore(absl::string_view job, int64_t generation);
  // Forgets the job (terminal): its keys are dropped and blocked Gets fail.
  void DropJob(absl::string_view job);

  // The number of keys stored for (job, generation); 0 when that generation is not the newest.
  int KeyCount(absl::string_view job, int64_t generation) const;

 private:
  struct JobKeys {
    int64_t generation = 0;
    std::map<std::string, std::string> values;
  };
  // Moves `job` to `generation` if newer; FAILED_PRECONDITION if older.
  absl::Status Adopt(const std::string& job, int64_t generation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, JobKeys, std::less<>> jobs_ ABSL_GUARDED_BY(mu_);
};

class RendezvousServiceImpl final : public v1::RendezvousService::Service {
 public:
  // `store` must outlive the service; `auth` may be null (no authentication) or must outlive it.
  RendezvousServiceImpl(RendezvousStore* store, const api::TokenAuth* auth);

  grpc::Status Set(grpc::ServerContext* context, const v1::RendezvousSetRequest* request,
                   v1::RendezvousSetResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const v1::RendezvousGetRequest* request,
                   v1::RendezvousGetResponse* response) override;

 private:
  absl::Status Authenticate(grpc::ServerContext* context) const;

  RendezvousStore* const store_;
  const api::TokenAuth* const auth_;
};

}  // namespace switchyard::workers

#endif  // SWITCHYARD_COORDINATOR_WORKERS_RENDEZVOUS_SERVICE_H_
