// File: coordinator/workers/rendezvous_service.h
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
#include "coordinator/workers/worker_registry.h"
#include "switchyard/v1/worker.grpc.pb.h"

namespace switchyard::workers {

inline constexpr int64_t kMaxRendezvousTimeoutMs = 10 * 60 * 1000;
inline constexpr size_t kMaxRendezvousKeyBytes = 1024;
// Gloo's full-mesh address blob of one rank grows with the world (tens of bytes per peer); 1 MiB
// leaves room for tens of thousands of ranks. An NCCL unique id is 128 bytes.
inline constexpr size_t kMaxRendezvousValueBytes = 1 << 20;
// A generation of W ranks sets a few keys per rank and process group (dozens per rank at most).
inline constexpr int kMaxRendezvousKeysPerGeneration = 16384;
inline constexpr size_t kMaxRendezvousBytesPerGeneration = 32 << 20;

// What the store holds now, over every job (for tests and debugging).
struct RendezvousUsage {
  int open_generations = 0;
  int64_t keys = 0;
  int64_t bytes = 0;  // keys + values
};

// The store behind the service, usable without gRPC (the scheduler opens and ends generations
// through it). It does not authenticate or check ranks: the service does.
class RendezvousStore {
 public:
  absl::Status Set(const v1::RendezvousSetRequest& request);
  absl::StatusOr<std::string> Get(const v1::RendezvousGetRequest& request);

  // Generation `generation` of `job` starts: it becomes the open one, the keys of older ones are
  // dropped and Gets blocked on them fail. An older generation than the newest known is ignored.
  void OpenGeneration(absl::string_view job, int64_t generation);
  // Generation `generation` of `job` stopped: its keys are dropped, later Sets and Gets fail and
  // blocked Gets fail. Nothing when it is not the open one.
  void EndGeneration(absl::string_view job, int64_t generation);
  // Forgets the job (terminal): its keys are dropped and blocked Gets fail.
  void DropJob(absl::string_view job);

  // OK when (job, generation) is the open generation of the job; otherwise FAILED_PRECONDITION
  // naming what is open instead.
  absl::Status CheckLive(absl::string_view job, int64_t generation) const;

  // The number of keys stored for (job, generation); 0 when that generation is not open.
  int KeyCount(absl::string_view job, int64_t generation) const;
  RendezvousUsage Usage() const;

 private:
  struct JobKeys {
    int64_t generation = 0;  // the newest generation opened
    bool open = false;
    int64_t bytes = 0;
    std::map<std::string, std::string> values;
  };
  // The open keys of (job, generation), or FAILED_PRECONDITION naming what is open instead.
  absl::StatusOr<JobKeys*> Live(absl::string_view job, int64_t generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<const JobKeys*> LiveConst(absl::string_view job, int64_t generation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, JobKeys, std::less<>> jobs_ ABSL_GUARDED_BY(mu_);
};

class RendezvousServiceImpl final : public v1::RendezvousService::Service {
 public:
  // `store` must outlive the service; `auth` (the worker token) and `workers` (the registry that
  // says which worker runs which rank) may be null (no authentication / no rank check: tests of
  // the store alone) or must outlive it.
  RendezvousServiceImpl(RendezvousStore* store, const api::TokenAuth* auth,
                        const WorkerRegistry* workers);

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

  RendezvousStore* const store_;
  const api::TokenAuth* const auth_;
  const WorkerRegistry* const workers_;
};

}  // namespace switchyard::workers

#endif  // SWITCHYARD_COORDINATOR_WORKERS_RENDEZVOUS_SERVICE_H_
