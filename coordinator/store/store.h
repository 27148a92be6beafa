// File: coordinator/store/store.h
//
// The coordinator's durable state in one SQLite file: jobs, each job's append-only event log, and
// the workers that attached. The store persists rows; it knows no lifecycle rules (those live in
// coordinator/jobs/job_state.h) and does no spec validation (coordinator/jobs/job_registry.h).
//
// File format (schema version kSchemaVersion, kept in `PRAGMA user_version`):
//
//   jobs        id INTEGER PRIMARY KEY AUTOINCREMENT (ids never reused; resource "jobs/{id}"),
//               request_id TEXT UNIQUE (NULL: none), spec BLOB (serialized v1::JobSpec), state,
//               generation, restart_count, failure_reason, last_checkpoint_step (NULL: none),
//               create_time_us, update_time_us (microseconds since the Unix epoch),
//               plan BLOB (serialized v1::Plan of the current generation; NULL: none; v2),
//               last_step BLOB (serialized v1::StepMetrics, rank 0's latest saved; NULL: none; v3)
//   job_events  (job_id, sequence) primary key, sequence 1, 2, ... per job; time_us, state,
//               generation, reason, message. Append-only: triggers abort UPDATE and DELETE.
//   workers     id TEXT PRIMARY KEY, host, gpu BLOB (serialized v1::GpuInfo, NULL on CPU
//               workers), version, state, job (NULL: unassigned), last_heartbeat_us
//
// Promises:
// - The database runs in WAL mode (persistent in the file) with synchronous=NORMAL and foreign
//   keys on; every change that touches more than one row runs in one IMMEDIATE transaction, so a
//   crash or an error leaves either all of it or none.
// - Opening a file of an older schema version upgrades it in one transaction; a file of a newer
//   version, or one that is not a Switchyard store, is FAILED_PRECONDITION and is left untouched.
// - SQLite errors become absl::Status once, here (busy/locked: UNAVAILABLE; constraint: the caller
//   gets ALREADY_EXISTS or FAILED_PRECONDITION as documented; anything else: INTERNAL), with the
//   failing statement in the message. No exception escapes.
//
// Thread safety: a Store is one connection guarded by a mutex; any thread may call any method.
// Several Store objects (threads or processes) may open the same file: writers serialize on
// SQLite's lock and wait up to StoreOptions::busy_timeout.
#ifndef SWITCHYARD_COORDINATOR_STORE_STORE_H_
#define SWITCHYARD_COORDINATOR_STORE_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "switchyard/v1/config.pb.h"
#include "switchyard/v1/job.pb.h"
#include "switchyard/v1/worker.pb.h"

struct sqlite3;

namespace switchyard::store {

inline constexpr int kSchemaVersion = 3;

// One row of `jobs`.
struct JobRow {
  int64_t id = 0;          // assigned by InsertJob
  std::string request_id;  // empty: none
  v1::JobSpec spec;
  v1::Job::State state = v1::Job::STATE_UNSPECIFIED;
  int64_t generation = 0;
  int32_t restart_count = 0;
  std::string failure_reason;
  std::optional<int64_t> last_checkpoint_step;
  std::optional<v1::Plan> plan;                // the current generation's plan (set when it starts)
  std::optional<v1::StepMetrics> last_step;    // SetLastStep's latest (no event, no update_time)
  absl::Time create_time = absl::UnixEpoch();  // set by InsertJob
  absl::Time update_time = absl::UnixEpoch();  // set by InsertJob and UpdateJob
};

// One row of `job_events`.
struct JobEventRow {
  int64_t job_id = 0;
  int64_t sequence = 0;                 // assigned by the store: 1, 2, ... per job
  absl::Time time = absl::UnixEpoch();  // assigned by the store
  v1::Job::State state = v1::Job::STATE_UNSPECIFIED;
  int64_t generation = 0;
  std::string reason;   // machine-readable, e.g. "WORKER_LOST"
  std::string message;  // human-readable
};

// What the coordinator knows about a worker's connection.
enum class WorkerState {
  kIdle = 1,      // attached, no job
  kAssigned = 2,  // attached, running `job`
  kLost = 3,      // missed its heartbeats or its stream broke
  kDetached = 4,  // said goodbye
};
const char* WorkerStateName(WorkerState state);

// One row of `workers`.
struct WorkerRow {
  std::string id;
  std::string host;
  std::optional<v1::GpuInfo> gpu;  // absent on CPU workers
  std::string version;
  WorkerState state = WorkerState::kIdle;
  std::string job;  // "jobs/{id}" while assigned, else empty
  absl::Time last_heartbeat = absl::UnixEpoch();
};

struct StoreOptions {
  // How long a write waits for another connection's write lock before UNAVAILABLE.
  absl::Duration busy_timeout = absl::Seconds(10);
  // The clock for create/update/event times; injectable for tests.
  std::function<absl::Time()> now = [] { return absl::Now(); };
};

// The outcome of InsertJob.
struct InsertResult {
  JobRow job;
  bool created = false;  // false: `request_id` already named `job`, nothing was written
};

class Store {
 public:
  // Opens (creating if needed) the store at `path`, upgrading its schema to kSchemaVersion.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& path,
                                                     StoreOptions options = {});
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const std::string& path() const { return path_; }

  // --- jobs ---------------------------------------------------------------------------------

  // In one transaction: if `job.request_id` is non-empty and already names a job, returns that
  // job with created = false and writes nothing (the caller decides whether the specs agree).
  // Otherwise inserts `job` (its id, create and update times are assigned; state must be set)
  // and `first_event` (its job id, sequence and time are assigned) and returns created = true.
  absl::StatusOr<InsertResult> InsertJob(JobRow job, JobEventRow first_event);

  // NOT_FOUND when no job has this id.
  absl::StatusOr<JobRow> GetJob(int64_t id);

  // Jobs with id > `after_id`, in ascending id order, at most `limit` (>= 1) of them; only those
  // in `state` unless it is STATE_UNSPECIFIED.
  absl::StatusOr<std::vector<JobRow>> ListJobs(v1::Job::State state, int64_t after_id, int limit);

  // Called with the current row, under the store's lock and inside its transaction: it must not
  // call back into the Store. Returns the event to append or an error.
  using JobMutation = std::function<absl::StatusOr<JobEventRow>(JobRow& job)>;

  // Read-modify-write of one job in one IMMEDIATE transaction: reads job `id` (NOT_FOUND if
  // absent), calls `mutate` on it, then writes the row (update time set; id, request id and
  // create time kept) and appends the returned event. If `mutate` fails nothing is written and
  // its status is returned. Returns the row as written.
  absl::StatusOr<JobRow> UpdateJob(int64_t id, const JobMutation& mutate);

  // The job's events in sequence order (empty when the job has none or does not exist).
  absl::StatusOr<std::vector<JobEventRow>> ListJobEvents(int64_t job_id);

  // Row counts of jobs and job_events (for checks that nothing was written).
  absl::StatusOr<int64_t> CountJobs();
  absl::StatusOr<int64_t> CountJobEvents();

  // --- workers ------------------------------------------------------------------------------

  // Inserts or replaces the worker with `worker.id` (non-empty).
  absl::Status UpsertWorker(const WorkerRow& worker);
  // NOT_FOUND when absent.
  absl::StatusOr<WorkerRow> GetWorker(const std::string& id);
  // All workers in id order.
  absl::StatusOr<std::vector<WorkerRow>> ListWorkers();
  // Sets last_heartbeat to now; NOT_FOUND when absent.
  absl::Status RecordHeartbeat(const std::string& id);
  // Overwrites job `id`'s last_step (one-row UPDATE, no event, update_time unchanged: step
  // progress is not a state change). NOT_FOUND for an unknown job.
  absl::Status SetLastStep(int64_t id, const v1::StepMetrics& step);
  // Sets state and job; NOT_FOUND when absent.
  absl::Status SetWorkerState(const std::string& id, WorkerState state, const std::string& job);

  // --- inspection ---------------------------------------------------------------------------

  // `PRAGMA journal_mode` ("wal") and `PRAGMA user_version` of the open connection.
  absl::StatusOr<std::string> JournalMode();
  absl::StatusOr<int> SchemaVersion();

 private:
  Store(std::string path, StoreOptions options, sqlite3* db);

  absl::Status Initialize() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `body` between BEGIN IMMEDIATE and COMMIT, rolling back if it fails.
  absl::Status InTransaction(const std::function<absl::Status()>& body)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::optional<JobRow>> ReadJob(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AppendEvent(JobEventRow event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int64_t> Count(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const StoreOptions options_;
  absl::Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
};

}  // namespace switchyard::store

#endif  // SWITCHYARD_COORDINATOR_STORE_STORE_H_
