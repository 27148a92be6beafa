// File: coordinator/cluster/rendezvous_store.h
//
// The key-value store in memory through which the ranks of one generation of a job exchange NCCL
// unique ids and Gloo addresses, behind switchyard.v1.RendezvousService
// (coordinator/api/rendezvous_service.h, which authenticates callers and checks that they are
// ranks of the generation; the store does neither). The contracts on generations, limits, Set and
// Get are in the service's header; the store enforces all of them except the token and rank
// checks.
//
// Thread safety: every method may be called concurrently; one mutex guards the store.
#ifndef SWITCHYARD_COORDINATOR_CLUSTER_RENDEZVOUS_STORE_H_
#define SWITCHYARD_COORDINATOR_CLUSTER_RENDEZVOUS_STORE_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "switchyard/v1/worker.pb.h"

namespace switchyard::cluster {

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

// INVALID_ARGUMENT naming the field and rule unless `job` is non-empty, `generation` >= 1 and
// `key` is non-empty and at most kMaxRendezvousKeyBytes.
absl::Status CheckRendezvousScope(absl::string_view job, int64_t generation, absl::string_view key);
// "<job> generation <g>", how messages name a generation's keys.
std::string RendezvousScopeName(absl::string_view job, int64_t generation);

}  // namespace switchyard::cluster

#endif  // SWITCHYARD_COORDINATOR_CLUSTER_RENDEZVOUS_STORE_H_
