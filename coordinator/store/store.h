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
//               last_validation BLOB (serialized v1::StepMetrics, rank 0's latest report that
//               carried a validation loss; NULL: none; v5)
//   job_events  (job_id, sequence) primary key, sequence 1, 2, ... per job; time_us, state,
//               generation, reason, message. Append-only: triggers abort UPDATE, and DELETE
//               unless the job is finished (SUCCEEDED, FAILED, CANCELLED; DeleteJob; v4).
//   workers     id TEXT PRIMARY KEY, host, gpu BLOB (serialized v1::GpuInfo, NULL on CPU
//               workers), version, state, job (NULL: unassigned), last_heartbeat_us
//
// Promises:
// - Open refuses, naming the file and the problem, a store that is missing (NOT_FOUND, unless
//   StoreOptions::create_if_missing: a new store is made as `path`.new, mode 0600, and linked into
//   place once its schema is written, never over an existing file), and with DATA_LOSS
//   one that is empty (0 bytes), not SQLite, shorter than its header says (truncated; checked
//   when no non-empty -wal file is beside it, since SQLite completes an interrupted checkpoint
//   from it), or that fails `PRAGMA quick_check`. It never replaces or reinitializes an existing
//   file. An existing store (and its -wal and -shm files, which SQLite creates with the store's
//   mode) readable by others is chmod-ed to 0600, with a warning in the log.
// - Corruption found while serving (SQLite's CORRUPT or NOTADB, or a row that does not parse:
//   DATA_LOSS from any method) is logged once with the file name and calls
//   StoreOptions::on_corruption once; from then on every method returns that DATA_LOSS without
//   touching the file (writing into a corrupt b-tree can spread the damage), and Health() says so.
// - The database runs in WAL mode (persistent in the file) with synchronous=NORMAL and foreign
//   keys on; every change that touches more than one row runs in one IMMEDIATE transaction, so a
//   crash or an error leaves either all of it or none.
// - Opening a file of an older schema version upgrades it in one transaction; a file of a newer
//   version, or one that is not a Switchyard store, is FAILED_PRECONDITION and is left untouched.
// - SQLite errors become absl::Status once, here: busy/locked UNAVAILABLE (reason STORE_BUSY),
//   full disk or max_page_count RESOURCE_EXHAUSTED (STORE_FULL), corrupt DATA_LOSS
//   (STORE_CORRUPT), I/O error UNAVAILABLE (STORE_IO_ERROR), constraint FAILED_PRECONDITION,
//   anything else INTERNAL. Messages name the store file and never carry SQL (API clients see
//   them); the failing statement and SQLite's own message go to the log. No exception escapes.
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

inline constexpr int kSchemaVersion = 5;

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
  std::optional<v1::Plan> plan;              // the current generation's plan (set when it starts)
  std::optional<v1::StepMetrics> last_step;  // SetLastStep's latest (no event, no update_time)
  std::optional<v1::StepMetrics> last_validation;  // SetLastValidation's latest (likewise)
  absl::Time create_time = absl::UnixEpoch();      // set by InsertJob
  absl::Time update_time = absl::UnixEpoch();      // set by InsertJob and UpdateJob
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
  // Create the file (mode 0600) when it does not exist. Off, a missing file is NOT_FOUND: the
  // coordinator turns this on only with --create-store, so a wrong path or a lost volume is an
  // error instead of a new, empty store.
  bool create_if_missing = true;
  // > 0: `PRAGMA max_page_count`, a cap on the file's size in pages (writes beyond it fail as a
  // full disk does: RESOURCE_EXHAUSTED). 0: SQLite's default (no practical cap).
  int64_t max_page_count = 0;
  // Called once, from the thread whose call found it, with the first DATA_LOSS (under the store's
  // lock: it must not call back into the Store).
  std::function<void(const absl::Status&)> on_corruption;
};

// What Backup wrote.
struct BackupResult {
  int64_t bytes = 0;
  int64_t pages = 0;
  absl::Duration elapsed;
};

// The outcome of InsertJob.
struct InsertResult {
  JobRow job;
  bool created = false;  // false: `request_id` already named `job`, nothing was written
};

class Store {
 public:
  // Opens the store at `path` (creating it if missing and options.create_if_missing), checks its
  // integrity and upgrades its schema to kSchemaVersion. See "Promises" for the refusals.
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
  // `before_commit` (optional) runs inside the transaction with the new job's id, after both rows
  // are written: an error from it rolls the insert back and is returned (CreateJob makes the job's
  // checkpoint directory there, so a job never exists without it).
  absl::StatusOr<InsertResult> InsertJob(
      JobRow job, JobEventRow first_event,
      const std::function<absl::Status(int64_t id)>& before_commit = nullptr);

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

  // In one IMMEDIATE transaction: reads job `id` (NOT_FOUND if absent), calls `check` on it (its
  // error is returned and nothing is deleted), then deletes the job and all its events. Returns
  // the row as it was. The schema lets only a finished job's events be deleted (FAILED_PRECONDITION
  // otherwise). Ids are AUTOINCREMENT: a deleted job's id is never assigned again.
  absl::StatusOr<JobRow> DeleteJob(int64_t id,
                                   const std::function<absl::Status(const JobRow&)>& check);

  // The job's events in sequence order (empty when the job has none or does not exist).
  absl::StatusOr<std::vector<JobEventRow>> ListJobEvents(int64_t job_id);

  // The job's event of the highest sequence, nullopt when it has none or does not exist. One
  // indexed row, not the log: GetJob shows only the last event, and a job's log grows with every
  // restart and wait reason.
  absl::StatusOr<std::optional<JobEventRow>> LastJobEvent(int64_t job_id);

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
  // Overwrites job `id`'s last_validation (rank 0's latest step report with a validation loss),
  // as SetLastStep does last_step.
  absl::Status SetLastValidation(int64_t id, const v1::StepMetrics& step);
  // Sets state and job; NOT_FOUND when absent.
  absl::Status SetWorkerState(const std::string& id, WorkerState state, const std::string& job);

  // --- health and backups --------------------------------------------------------------------

  // OK, or the DATA_LOSS that marked the store corrupt.
  absl::Status Health();

  // Copies the store with SQLite's online backup API into `dest_path`, atomically: the copy is
  // written to `dest_path`.tmp (mode 0600), passes quick_check, is fsync-ed, then renamed over
  // `dest_path`; a failure leaves any previous backup as it was. The store's lock is held for the
  // copy, so other calls wait for it. FAILED_PRECONDITION once the store is marked corrupt (a
  // backup must never replace a good one with a damaged copy). A backup opens as a store
  // (restore: start the coordinator with --store on it).
  absl::StatusOr<BackupResult> Backup(const std::string& dest_path);

  // --- inspection ---------------------------------------------------------------------------

  // `PRAGMA journal_mode` ("wal") and `PRAGMA user_version` of the open connection.
  absl::StatusOr<std::string> JournalMode();
  absl::StatusOr<int> SchemaVersion();

 private:
  Store(std::string path, StoreOptions options, sqlite3* db);
  // Open after the file checks: SQLite open, quick_check, schema.
  static absl::StatusOr<std::unique_ptr<Store>> OpenFile(const std::string& path,
                                                         StoreOptions options);

  absl::Status Initialize() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `body` between BEGIN IMMEDIATE and COMMIT, rolling back if it fails.
  absl::Status InTransaction(const std::function<absl::Status()>& body)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::optional<JobRow>> ReadJob(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AppendEvent(JobEventRow event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int64_t> Count(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SetLastStep / SetLastValidation: `column` is one of those two names (never user input).
  absl::Status SetStepColumn(int64_t id, const char* column, const v1::StepMetrics& step);
  // Runs a public method's body: refuses it once the store is corrupt, and marks the store
  // corrupt (log, on_corruption) when the body returns DATA_LOSS.
  template <typename Body>
  auto Guard(const Body& body) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> decltype(body());
  void MarkCorrupt(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const StoreOptions options_;
  absl::Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
  absl::Status corruption_ ABSL_GUARDED_BY(mu_);  // OK until DATA_LOSS is seen
};

}  // namespace switchyard::store

#endif  // SWITCHYARD_COORDINATOR_STORE_STORE_H_
