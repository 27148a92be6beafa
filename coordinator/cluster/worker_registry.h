// File: coordinator/cluster/worker_registry.h
//
// The workers attached to this coordinator (WORKER_PROTOCOL.md): who they are, whether they are
// idle, busy with a rank of a job's generation, or lost, and when they last spoke. In memory
// (authoritative for this process) and mirrored into the store's `workers` table so that
// operators and a restarted coordinator see them.
//
// Contracts:
// - Register(registration) adds the worker as IDLE, or re-registers a known id (a reconnect, or
//   a worker re-attaching after a coordinator restart); the result says what was known before:
//   the in-memory entry, else the store's row from a previous coordinator process. A BUSY worker
//   that registers again stays BUSY with its job, generation and rank (a reconnect: the scheduler
//   checks the generation of its next heartbeat); a LOST or IDLE one becomes IDLE.
// - A worker whose stream ended is disconnected (SetDisconnected) but not LOST: WORKER_PROTOCOL.md
//   marks it LOST only after heartbeat_timeout without a message, so a worker that reconnects in
//   time keeps its rank. Idle() lists connected workers only.
// - Touch(id, generation) records a message from the worker (any message counts as a heartbeat)
//   and the generation its heartbeat reported.
// - A monitor thread marks every non-LOST worker whose last message is older than
//   heartbeat_timeout as LOST (checked every monitor_interval) and calls on_lost outside the
//   registry's lock. MarkLost does the same at once (the stream broke).
// - Store mirroring: Register upserts the row; every state change sets state and job; heartbeat
//   times are written at most every persist_interval per worker (1000 workers at 1 Hz would
//   otherwise be 1000 SQLite transactions a second). Store errors on these writes are logged, not
//   returned, except on Register (the caller refuses the worker). Store state names: IDLE ->
//   kIdle, BUSY -> kAssigned, LOST -> kLost.
// - Create() marks every row of a previous process that is not LOST or DETACHED as LOST in the
//   store (nobody is attached to a fresh process) after remembering it for PreviousRow().
//
// Thread safety: any thread may call any method. on_lost runs on the monitor thread or on the
// caller of MarkLost, never under the registry's lock.
#ifndef SWITCHYARD_COORDINATOR_WORKERS_WORKER_REGISTRY_H_
#define SWITCHYARD_COORDINATOR_WORKERS_WORKER_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/store/store.h"
#include "switchyard/v1/worker.pb.h"

namespace switchyard::cluster {

enum class WorkerState { kIdle, kBusy, kLost };
const char* WorkerStateName(WorkerState state);

struct WorkerInfo {
  std::string id;
  std::string host;
  std::optional<v1::GpuInfo> gpu;
  std::string version;
  // Registration.job: "jobs/{id}" for a job-scoped worker (it may run that job only), else empty.
  std::string scope;
  WorkerState state = WorkerState::kIdle;
  std::string job;                  // "jobs/{id}" while busy, else empty
  int64_t generation = 0;           // of `job` while busy
  int32_t rank = -1;                // in `generation` while busy
  int64_t reported_generation = 0;  // from the worker's last heartbeat
  int64_t heartbeats = 0;           // heartbeats since registration
  bool connected = false;           // has an open stream
  absl::Time registered_at = absl::InfinitePast();
  absl::Time last_heartbeat = absl::InfinitePast();
};

struct WorkerRegistryOptions {
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  absl::Duration monitor_interval = absl::Milliseconds(250);
  absl::Duration persist_interval = absl::Seconds(10);
  // Called with the worker as it was marked LOST and the reason text.
  std::function<void(const WorkerInfo&, const std::string&)> on_lost;
};

// What Register found.
struct Registered {
  WorkerInfo worker;                         // as registered now (IDLE)
  std::optional<WorkerInfo> before;          // the in-memory entry this replaces, if any
  std::optional<store::WorkerRow> previous;  // the store row of a previous coordinator, if any
};

class WorkerRegistry {
 public:
  // INVALID_ARGUMENT for a non-positive timeout or interval; the store's errors. `store` must
  // outlive the registry. Starts the monitor thread.
  static absl::StatusOr<std::unique_ptr<WorkerRegistry>> Create(store::Store* store,
                                                                WorkerRegistryOptions options);
  ~WorkerRegistry();  // Stops the monitor.
  // Stops the monitor thread (coordinator shutdown: nobody is marked LOST afterwards).
  void StopMonitor();
  WorkerRegistry(const WorkerRegistry&) = delete;
  WorkerRegistry& operator=(const WorkerRegistry&) = delete;

  // INVALID_ARGUMENT naming registration.worker_id / registration.host when empty or
  // worker_id longer than 256 bytes; UNAVAILABLE/INTERNAL when the store write fails.
  absl::StatusOr<Registered> Register(const v1::Registration& registration);

  // Records a message from `id` at now; `generation` >= 0 is the heartbeat's generation (-1: not a
  // heartbeat). NOT_FOUND for an unknown id. A LOST worker that speaks again stays LOST until it
  // registers again (its stream is gone or its rank was replaced).
  absl::Status Touch(const std::string& id, int64_t generation);

  // State changes; NOT_FOUND for an unknown id. SetBusy/SetIdle do not revive a LOST worker
  // (FAILED_PRECONDITION).
  absl::Status SetBusy(const std::string& id, const std::string& job, int64_t generation,
                       int32_t rank);
  absl::Status SetIdle(const std::string& id);
  // Its stream ended (LOST follows after heartbeat_timeout unless it registers again).
  void SetDisconnected(const std::string& id);
  // Marks the worker LOST now (stream broke) and calls on_lost; false when unknown or already LOST.
  bool MarkLost(const std::string& id, const std::string& why);

  std::optional<WorkerInfo> Get(const std::string& id) const;
  // Every worker, id order.
  std::vector<WorkerInfo> List() const;
  // Connected IDLE workers ordered by host, then id (ranks of one host stay adjacent).
  std::vector<WorkerInfo> Idle() const;
  int CountInState(WorkerState state) const;

  // The row a previous coordinator process left for `id` (as read by Create), if any.
  std::optional<store::WorkerRow> PreviousRow(const std::string& id) const;
  // Rows of the previous process that were assigned to a job, by job name.
  std::map<std::string, std::vector<std::string>> PreviousAssignments() const;

 private:
  WorkerRegistry(store::Store* store, WorkerRegistryOptions options);
  void MonitorLoop();
  void Persist(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);

  store::Store* const store_;
  const WorkerRegistryOptions options_;
  absl::Mutex persist_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::map<std::string, WorkerInfo> workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Time> persisted_heartbeat_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, store::WorkerRow> previous_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
};

}  // namespace switchyard::cluster

#endif  // SWITCHYARD_COORDINATOR_WORKERS_WORKER_REGISTRY_H_
