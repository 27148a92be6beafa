// File: coordinator/store/store.cc
#include "coordinator/store/store.h"

#include <sqlite3.h>

#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "common/status.h"
#include "coordinator/store/store_file.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace switchyard::store {
namespace {

using internal::PrepareFile;
using internal::QuickCheck;
using internal::SqliteError;

// Schema migrations: kMigrations[v] upgrades a file from user_version v to v + 1.
constexpr const char* kMigrations[] = {
    // 0 -> 1
    R"sql(
CREATE TABLE jobs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  request_id TEXT UNIQUE,
  spec BLOB NOT NULL,
  state INTEGER NOT NULL,
  generation INTEGER NOT NULL DEFAULT 0,
  restart_count INTEGER NOT NULL DEFAULT 0,
  failure_reason TEXT NOT NULL DEFAULT '',
  last_checkpoint_step INTEGER,
  create_time_us INTEGER NOT NULL,
  update_time_us INTEGER NOT NULL
);
CREATE INDEX jobs_by_state ON jobs (state, id);
CREATE TABLE job_events (
  job_id INTEGER NOT NULL REFERENCES jobs (id),
  sequence INTEGER NOT NULL,
  time_us INTEGER NOT NULL,
  state INTEGER NOT NULL,
  generation INTEGER NOT NULL,
  reason TEXT NOT NULL,
  message TEXT NOT NULL,
  PRIMARY KEY (job_id, sequence)
) WITHOUT ROWID;
CREATE TRIGGER job_events_no_update BEFORE UPDATE ON job_events
BEGIN SELECT RAISE(ABORT, 'job_events is append-only'); END;
CREATE TRIGGER job_events_no_delete BEFORE DELETE ON job_events
BEGIN SELECT RAISE(ABORT, 'job_events is append-only'); END;
CREATE TABLE workers (
  id TEXT PRIMARY KEY,
  host TEXT NOT NULL,
  gpu BLOB,
  version TEXT NOT NULL,
  state INTEGER NOT NULL,
  job TEXT,
  last_heartbeat_us INTEGER NOT NULL
);
)sql",
    // 1 -> 2: the plan the scheduler started the current generation with.
    R"sql(
ALTER TABLE jobs ADD COLUMN plan BLOB;
)sql",
    // 2 -> 3: rank 0's latest step report, saved by the scheduler (rate-limited).
    R"sql(
ALTER TABLE jobs ADD COLUMN last_step BLOB;
)sql",
    // 3 -> 4: a finished job (SUCCEEDED 5, FAILED 6, CANCELLED 7) may be deleted with its events
    // (DeleteJob); the events of any other job stay append-only.
    R"sql(
DROP TRIGGER job_events_no_delete;
CREATE TRIGGER job_events_no_delete BEFORE DELETE ON job_events
WHEN (SELECT state FROM jobs WHERE id = OLD.job_id) NOT IN (5, 6, 7)
BEGIN SELECT RAISE(ABORT, 'job_events is append-only (events go only with their finished job)'); END;
)sql",
    // 4 -> 5: rank 0's latest step report that carried a validation loss (Job.last_validation).
    R"sql(
ALTER TABLE jobs ADD COLUMN last_validation BLOB;
)sql",
};
static_assert(v1::Job::SUCCEEDED == 5 && v1::Job::FAILED == 6 && v1::Job::CANCELLED == 7,
              "migration 3 -> 4 names the finished states by number");
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == kSchemaVersion,
              "one migration per schema version");

// A prepared statement; finalized on destruction.
class Statement {
 public:
  static absl::StatusOr<Statement> Prepare(sqlite3* db, absl::string_view sql) {
    sqlite3_stmt* stmt = nullptr;
    int rc = sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr);
    if (rc != SQLITE_OK) {
      sqlite3_finalize(stmt);
      return SqliteError(db, rc, absl::StrCat("prepare \"", sql, "\""));
    }
    return Statement(db, stmt, sql);
  }
  Statement(Statement&& other) noexcept
      : db_(other.db_), stmt_(std::exchange(other.stmt_, nullptr)), sql_(std::move(other.sql_)) {}
  Statement& operator=(Statement&&) = delete;
  ~Statement() { sqlite3_finalize(stmt_); }

  absl::Status Bind(int i, int64_t value) {
    return Check(sqlite3_bind_int64(stmt_, i, value), "bind");
  }
  absl::Status BindText(int i, absl::string_view value) {
    return Check(
        sqlite3_bind_text(stmt_, i, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT),
        "bind");
  }
  absl::Status BindBlob(int i, const std::string& value) {
    return Check(
        sqlite3_bind_blob(stmt_, i, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT),
        "bind");
  }
  absl::Status BindNull(int i) { return Check(sqlite3_bind_null(stmt_, i), "bind"); }

  // true: a row is available; false: done.
  absl::StatusOr<bool> Step() {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqliteError(db_, rc, absl::StrCat("step \"", sql_, "\""));
  }
  // Steps a statement that returns no rows.
  absl::Status Run() {
    SY_ASSIGN_OR_RETURN(bool row, Step());
    (void)row;
    return absl::OkStatus();
  }

  bool IsNull(int col) { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }
  std::string Text(int col) {
    const void* data = sqlite3_column_blob(stmt_, col);
    int n = sqlite3_column_bytes(stmt_, col);
    return data == nullptr ? std::string() : std::string(static_cast<const char*>(data), n);
  }

 private:
  Statement(sqlite3* db, sqlite3_stmt* stmt, absl::string_view sql)
      : db_(db), stmt_(stmt), sql_(std::string(sql)) {}
  absl::Status Check(int rc, absl::string_view what) {
    if (rc == SQLITE_OK) return absl::OkStatus();
    return SqliteError(db_, rc, absl::StrCat(what, " \"", sql_, "\""));
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_;
  std::string sql_;
};

absl::Status Exec(sqlite3* db, const char* sql, absl::string_view what) {
  char* error = nullptr;
  int rc = sqlite3_exec(db, sql, nullptr, nullptr, &error);
  sqlite3_free(error);
  if (rc != SQLITE_OK) return SqliteError(db, rc, what);
  return absl::OkStatus();
}

int64_t Micros(absl::Time t) { return absl::ToUnixMicros(t); }
absl::Time FromMicros(int64_t us) { return absl::FromUnixMicros(us); }

absl::StatusOr<v1::Job::State> StateFromColumn(int64_t value, absl::string_view table) {
  if (value > 0 && value <= 1000 && v1::Job::State_IsValid(static_cast<int>(value))) {
    return static_cast<v1::Job::State>(value);
  }
  return absl::DataLossError(absl::StrCat(table, ".state holds ", value, ", not a Job.State"));
}

constexpr const char* kJobColumns =
    "id, request_id, spec, state, generation, restart_count, failure_reason, "
    "last_checkpoint_step, create_time_us, update_time_us, plan, last_step, last_validation";

// Every row `s` still yields, each converted by `from_row` (JobFromRow, EventFromRow, ...).
template <typename Row>
absl::StatusOr<std::vector<Row>> AllRows(Statement& s,
                                         absl::StatusOr<Row> (*from_row)(Statement&)) {
  std::vector<Row> rows;
  while (true) {
    SY_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return rows;
    SY_ASSIGN_OR_RETURN(Row r, from_row(s));
    rows.push_back(std::move(r));
  }
}

absl::StatusOr<JobRow> JobFromRow(Statement& s) {
  JobRow job;
  job.id = s.Int(0);
  if (!s.IsNull(1)) job.request_id = s.Text(1);
  std::string spec = s.Text(2);
  if (!job.spec.ParseFromString(spec)) {
    return absl::DataLossError(absl::StrCat("jobs.spec of job ", job.id, " does not parse"));
  }
  SY_ASSIGN_OR_RETURN(job.state, StateFromColumn(s.Int(3), "jobs"));
  job.generation = s.Int(4);
  job.restart_count = static_cast<int32_t>(s.Int(5));
  job.failure_reason = s.Text(6);
  if (!s.IsNull(7)) job.last_checkpoint_step = s.Int(7);
  job.create_time = FromMicros(s.Int(8));
  job.update_time = FromMicros(s.Int(9));
  if (!s.IsNull(10)) {
    v1::Plan plan;
    if (!plan.ParseFromString(s.Text(10))) {
      return absl::DataLossError(absl::StrCat("jobs.plan of job ", job.id, " does not parse"));
    }
    job.plan = std::move(plan);
  }
  for (const auto& [column, name, out] :
       {std::make_tuple(11, "last_step", &job.last_step),
        std::make_tuple(12, "last_validation", &job.last_validation)}) {
    if (s.IsNull(column)) continue;
    v1::StepMetrics step;
    if (!step.ParseFromString(s.Text(column))) {
      return absl::DataLossError(
          absl::StrCat("jobs.", name, " of job ", job.id, " does not parse"));
    }
    *out = std::move(step);
  }
  return job;
}

absl::StatusOr<WorkerRow> WorkerFromRow(Statement& s) {
  WorkerRow w;
  w.id = s.Text(0);
  w.host = s.Text(1);
  if (!s.IsNull(2)) {
    v1::GpuInfo gpu;
    if (!gpu.ParseFromString(s.Text(2))) {
      return absl::DataLossError(absl::StrCat("workers.gpu of worker ", w.id, " does not parse"));
    }
    w.gpu = std::move(gpu);
  }
  w.version = s.Text(3);
  int64_t state = s.Int(4);
  if (state < 1 || state > 4) {
    return absl::DataLossError(absl::StrCat("workers.state holds ", state, ", not a WorkerState"));
  }
  w.state = static_cast<WorkerState>(state);
  if (!s.IsNull(5)) w.job = s.Text(5);
  w.last_heartbeat = FromMicros(s.Int(6));
  return w;
}

std::string SerializeSpec(const v1::JobSpec& spec) {
  std::string bytes;
  // Deterministic, so equal specs have equal bytes in the file.
  google::protobuf::io::StringOutputStream stream(&bytes);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  spec.SerializeToCodedStream(&coded);
  coded.Trim();
  return bytes;
}

// Binds what InsertJob and UpdateJob both write: ?2 spec, ?3 state, ?4 generation,
// ?5 restart_count, ?6 failure_reason, ?7 last_checkpoint_step (NULL when unset).
absl::Status BindJobColumns(Statement& s, const JobRow& job) {
  SY_RETURN_IF_ERROR(s.BindBlob(2, SerializeSpec(job.spec)));
  SY_RETURN_IF_ERROR(s.Bind(3, job.state));
  SY_RETURN_IF_ERROR(s.Bind(4, job.generation));
  SY_RETURN_IF_ERROR(s.Bind(5, job.restart_count));
  SY_RETURN_IF_ERROR(s.BindText(6, job.failure_reason));
  if (job.last_checkpoint_step) return s.Bind(7, *job.last_checkpoint_step);
  return s.BindNull(7);
}

}  // namespace

const char* WorkerStateName(WorkerState state) {
  switch (state) {
    case WorkerState::kIdle:
      return "IDLE";
    case WorkerState::kAssigned:
      return "ASSIGNED";
    case WorkerState::kLost:
      return "LOST";
    case WorkerState::kDetached:
      return "DETACHED";
  }
  return "UNKNOWN";
}

Store::Store(std::string path, StoreOptions options, sqlite3* db)
    : path_(std::move(path)), options_(std::move(options)), db_(db) {}

Store::~Store() { sqlite3_close_v2(db_); }

template <typename Body>
auto Store::Guard(const Body& body) -> decltype(body()) {
  if (!corruption_.ok()) return corruption_;
  auto result = body();
  absl::Status status = status_internal::AsStatus(result);
  if (status.code() == absl::StatusCode::kDataLoss) MarkCorrupt(status);
  return result;
}

void Store::MarkCorrupt(const absl::Status& status) {
  if (!corruption_.ok()) return;
  corruption_ = absl::DataLossError(absl::StrCat(
      "store \"", path_, "\" is corrupt (found ",
      absl::FormatTime(options_.now(), absl::UTCTimeZone()),
      ") and refuses every call; restart the coordinator on a backup (reason: STORE_CORRUPT)"));
  SY_LOG(ERROR) << "store " << path_ << " is corrupt: " << status
                << "; every further store call fails; restart on a backup";
  if (options_.on_corruption) options_.on_corruption(corruption_);
}

absl::Status Store::Health() {
  absl::MutexLock lock(&mu_);
  return corruption_;
}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path, StoreOptions options) {
  if (path.empty()) return absl::InvalidArgumentError("store path: must not be empty");
  if (!options.now) return absl::InvalidArgumentError("StoreOptions.now: must be set");
  if (options.max_page_count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("StoreOptions.max_page_count (", options.max_page_count, ") must be >= 0"));
  }
  SY_ASSIGN_OR_RETURN(const bool missing, PrepareFile(path, options.create_if_missing));
  if (missing) {
    // Built under a temporary name and linked into place once its schema is written, so a crash
    // never leaves a half-made store at `path` (the next start would refuse it as empty).
    const std::string fresh = path + ".new";
    SY_RETURN_IF_ERROR(internal::CreateEmptyFile(fresh));
    {
      StoreOptions init = options;
      init.on_corruption = nullptr;
      SY_ASSIGN_OR_RETURN(std::unique_ptr<Store> made, OpenFile(fresh, std::move(init)));
    }  // closed: the write-ahead log is checkpointed into the file and removed
    SY_RETURN_IF_ERROR(internal::PublishFile(fresh, path));
    SY_LOG(INFO) << "created a new, empty store " << path;
  }
  return OpenFile(path, std::move(options));
}

absl::StatusOr<std::unique_ptr<Store>> Store::OpenFile(const std::string& path,
                                                       StoreOptions options) {
  sqlite3* db = nullptr;
  // No SQLITE_OPEN_CREATE: Open made the file if that was asked for.
  int rc =
      sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status status = SqliteError(db, rc, absl::StrCat("open \"", path, "\""));
    sqlite3_close_v2(db);
    return status;
  }
  std::unique_ptr<Store> store(new Store(path, std::move(options), db));
  absl::MutexLock lock(&store->mu_);
  absl::Status status = store->Initialize();
  if (!status.ok()) return Annotate(status, absl::StrCat("opening store \"", path, "\""));
  return store;
}

absl::Status Store::Initialize() {
  sqlite3_extended_result_codes(db_, 1);
  int rc =
      sqlite3_busy_timeout(db_, static_cast<int>(absl::ToInt64Milliseconds(options_.busy_timeout)));
  if (rc != SQLITE_OK) return SqliteError(db_, rc, "busy_timeout");
  SY_RETURN_IF_ERROR(QuickCheck(db_, path_));
  if (options_.max_page_count > 0) {
    std::string pragma = absl::StrCat("PRAGMA max_page_count=", options_.max_page_count);
    SY_RETURN_IF_ERROR(Exec(db_, pragma.c_str(), "PRAGMA max_page_count"));
  }
  {
    // journal_mode answers with the mode in force; anything but "wal" means WAL is unavailable
    // (e.g. an in-memory database), which we refuse rather than run without it.
    SY_ASSIGN_OR_RETURN(Statement s, Statement::Prepare(db_, "PRAGMA journal_mode=WAL"));
    SY_ASSIGN_OR_RETURN(bool row, s.Step());
    std::string mode = row ? s.Text(0) : "";
    if (mode != "wal") {
      return absl::FailedPreconditionError(
          absl::StrCat("journal_mode: wanted \"wal\", SQLite kept \"", mode, "\""));
    }
  }
  SY_RETURN_IF_ERROR(Exec(db_, "PRAGMA synchronous=NORMAL", "PRAGMA synchronous"));
  SY_RETURN_IF_ERROR(Exec(db_, "PRAGMA foreign_keys=ON", "PRAGMA foreign_keys"));
  return InTransaction([&]() -> absl::Status {
    SY_ASSIGN_OR_RETURN(Statement v, Statement::Prepare(db_, "PRAGMA user_version"));
    SY_ASSIGN_OR_RETURN(bool row, v.Step());
    int64_t version = row ? v.Int(0) : 0;
    if (version > kSchemaVersion) {
      return absl::FailedPreconditionError(absl::StrCat("schema version ", version,
                                                        " is newer than this binary's ",
                                                        kSchemaVersion, "; refusing to touch it"));
    }
    if (version < 0) {
      return absl::FailedPreconditionError(absl::StrCat("schema version ", version, " is invalid"));
    }
    if (version == 0) {
      SY_ASSIGN_OR_RETURN(
          Statement t,
          Statement::Prepare(db_,
                             "SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"));
      SY_ASSIGN_OR_RETURN(bool has, t.Step());
      if (has && t.Int(0) != 0) {
        return absl::FailedPreconditionError(
            "the file holds tables but no schema version: not a Switchyard store");
      }
    }
    for (int64_t v = version; v < kSchemaVersion; ++v) {
      SY_RETURN_IF_ERROR(Exec(db_, kMigrations[v], absl::StrCat("migration to version ", v + 1)));
    }
    if (version != kSchemaVersion) {
      std::string pragma = absl::StrCat("PRAGMA user_version=", kSchemaVersion);
      SY_RETURN_IF_ERROR(Exec(db_, pragma.c_str(), "PRAGMA user_version"));
    }
    return absl::OkStatus();
  });
}

absl::Status Store::InTransaction(const std::function<absl::Status()>& body) {
  SY_RETURN_IF_ERROR(Exec(db_, "BEGIN IMMEDIATE", "BEGIN IMMEDIATE"));
  absl::Status status = body();
  if (status.ok()) status = Exec(db_, "COMMIT", "COMMIT");
  if (!status.ok()) {
    // After a failed COMMIT SQLite may have rolled back already; ROLLBACK then reports "no
    // transaction is active", which changes nothing.
    if (sqlite3_get_autocommit(db_) == 0) (void)Exec(db_, "ROLLBACK", "ROLLBACK");
  }
  return status;
}

absl::StatusOr<std::optional<JobRow>> Store::ReadJob(int64_t id) {
  std::string sql = absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE id = ?1");
  SY_ASSIGN_OR_RETURN(Statement s, Statement::Prepare(db_, sql));
  SY_RETURN_IF_ERROR(s.Bind(1, id));
  SY_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<JobRow>();
  SY_ASSIGN_OR_RETURN(JobRow job, JobFromRow(s));
  return std::optional<JobRow>(std::move(job));
}

absl::Status Store::AppendEvent(JobEventRow event) {
  SY_ASSIGN_OR_RETURN(
      Statement s,
      Statement::Prepare(db_,
                         "INSERT INTO job_events (job_id, sequence, time_us, state, generation, "
                         "reason, message) SELECT ?1, COALESCE(MAX(sequence), 0) + 1, ?2, ?3, ?4, "
                         "?5, ?6 FROM job_events WHERE job_id = ?1"));
  SY_RETURN_IF_ERROR(s.Bind(1, event.job_id));
  SY_RETURN_IF_ERROR(s.Bind(2, Micros(options_.now())));
  SY_RETURN_IF_ERROR(s.Bind(3, event.state));
  SY_RETURN_IF_ERROR(s.Bind(4, event.generation));
  SY_RETURN_IF_ERROR(s.BindText(5, event.reason));
  SY_RETURN_IF_ERROR(s.BindText(6, event.message));
  return s.Run();
}

absl::StatusOr<InsertResult> Store::InsertJob(
    JobRow job, JobEventRow first_event,
    const std::function<absl::Status(int64_t id)>& before_commit) {
  if (job.state == v1::Job::STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError("job.state: must be set");
  }
  absl::MutexLock lock(&mu_);
  return Guard([&]() -> absl::StatusOr<InsertResult> {
    InsertResult result;
    SY_RETURN_IF_ERROR(InTransaction([&]() -> absl::Status {
      if (!job.request_id.empty()) {
        SY_ASSIGN_OR_RETURN(Statement q,
                            Statement::Prepare(db_, "SELECT id FROM jobs WHERE request_id = ?1"));
        SY_RETURN_IF_ERROR(q.BindText(1, job.request_id));
        SY_ASSIGN_OR_RETURN(bool found, q.Step());
        if (found) {
          SY_ASSIGN_OR_RETURN(std::optional<JobRow> existing, ReadJob(q.Int(0)));
          if (!existing) return absl::InternalError("job vanished inside a transaction");
          result.job = std::move(*existing);
          result.created = false;
          return absl::OkStatus();
        }
      }
      absl::Time now = options_.now();
      SY_ASSIGN_OR_RETURN(
          Statement s, Statement::Prepare(
                           db_,
                           "INSERT INTO jobs (request_id, spec, state, generation, restart_count, "
                           "failure_reason, last_checkpoint_step, create_time_us, update_time_us) "
                           "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)"));
      if (job.request_id.empty()) {
        SY_RETURN_IF_ERROR(s.BindNull(1));
      } else {
        SY_RETURN_IF_ERROR(s.BindText(1, job.request_id));
      }
      SY_RETURN_IF_ERROR(BindJobColumns(s, job));
      SY_RETURN_IF_ERROR(s.Bind(8, Micros(now)));
      SY_RETURN_IF_ERROR(s.Run());
      job.id = sqlite3_last_insert_rowid(db_);
      job.create_time = job.update_time = FromMicros(Micros(now));
      first_event.job_id = job.id;
      SY_RETURN_IF_ERROR(AppendEvent(first_event));
      if (before_commit) SY_RETURN_IF_ERROR(before_commit(job.id));
      result.job = std::move(job);
      result.created = true;
      return absl::OkStatus();
    }));
    return result;
  });
}

absl::StatusOr<JobRow> Store::GetJob(int64_t id) {
  absl::MutexLock lock(&mu_);
  return Guard([&]() -> absl::StatusOr<JobRow> {
    SY_ASSIGN_OR_RETURN(std::optional<JobRow> job, ReadJob(id));
    if (!job) return absl::NotFoundError(absl::StrCat("job ", id, " does not exist"));
    return std::move(*job);
  });
}

absl::StatusOr<std::vector<JobRow>> Store::ListJobs(v1::Job::State state, int64_t after_id,
                                                    int limit) {
  if (limit < 1)
    return absl::InvalidArgumentError(absl::StrCat("limit (", limit, ") must be >= 1"));
  absl::MutexLock lock(&mu_);
  return Guard([&]() -> absl::StatusOr<std::vector<JobRow>> {
    std::string sql = absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE id > ?1",
                                   state == v1::Job::STATE_UNSPECIFIED ? "" : " AND state = ?3",
                                   " ORDER BY id LIMIT ?2");
    SY_ASSIGN_OR_RETURN(Statement s, Statement::Prepare(db_, sql));
    SY_RETURN_IF_ERROR(s.Bind(1, after_id));
    SY_RETURN_IF_ERROR(s.Bind(2, limit));
    if (state != v1::Job::STATE_UNSPECIFIED) SY_RETURN_IF_ERROR(s.Bind(3, state));
    return AllRows(s, &JobFromRow);
  });
}

absl::StatusOr<JobRow> Store::UpdateJob(int64_t id, const JobMutation& mutate) {
  absl::MutexLock lock(&mu_);
  return Guard([&]() -> absl::StatusOr<JobRow> {
    JobRow written;
    SY_RETURN_IF_ERROR(InTransaction([&]() -> absl::Status {
      SY_ASSIGN_OR_RETURN(std::optional<JobRow> current, ReadJob(id));
      if (!current) return absl::NotFoundError(absl::StrCat("job ", id, " does not exist"));
      JobRow job = *current;
      SY_ASSIGN_OR_RETURN(JobEventRow event, mutate(job));
      if (job.state == v1::Job::STATE_UNSPECIFIED) {
        return absl::InvalidArgumentError("job.state: must be set");
      }
      // Identity and creation are not the mutation's to change.
      job.id = current->id;
      job.request_id = current->request_id;
      job.create_time = current->create_time;
      job.update_time = FromMicros(Micros(options_.now()));
      SY_ASSIGN_OR_RETURN(
          Statement s,
          Statement::Prepare(db_,
                             "UPDATE jobs SET spec = ?2, state = ?3, generation = ?4, "
                             "restart_count = ?5, failure_reason = ?6, last_checkpoint_step = ?7, "
                             "update_time_us = ?8, plan = ?9 WHERE id = ?1"));
      SY_RETURN_IF_ERROR(s.Bind(1, id));
      SY_RETURN_IF_ERROR(BindJobColumns(s, job));
      SY_RETURN_IF_ERROR(s.Bind(8, Micros(job.update_time)));
      if (job.plan) {
        SY_RETURN_IF_ERROR(s.BindBlob(9, job.plan->SerializeAsString()));
      } else {
        SY_RETURN_IF_ERROR(s.BindNull(9));
      }
      SY_RETURN_IF_ERROR(s.Run());
      event.job_id = id;
      SY_RETURN_IF_ERROR(AppendEvent(event));
      written = std::move(job);
      return absl::OkStatus();
    }));
    return written;
  });
}

absl::StatusOr<JobRow> Store::DeleteJob(int64_t id,
                                        const std::function<absl::Status(const JobRow&)>& check) {
  absl::MutexLock lock(&mu_);
  return Guard([&]() -> absl::StatusOr<JobRow> {
    JobRow deleted;
    SY_RETURN_IF_ERROR(InTransaction([&]() -> absl::Status {
      SY_ASSIGN_OR_RETURN(std::optional<JobRow> current, ReadJob(id));
      if (!current) return absl::NotFoundError(absl::StrCat("job ", id, " does not exist"));
      if (check) SY_RETURN_IF_ERROR(check(*current));
      // Events first: the foreign key forbids removing a job that still has events.
      SY_ASSIGN_OR_RETURN(Statement events,
                          Statement::Prepare(db_, "DELETE FROM job_events WHERE job_id = ?1"));
      SY_RETURN_IF_ERROR(events.Bind(1, id));
      SY_RETURN_IF_ERROR(events.Run());
      SY_ASSIGN_OR_RETURN(Statement job, Statement::Prepare(db_, "DELETE FROM jobs WHERE id = ?1"));
      SY_RETURN_IF_ERROR(job.Bind(1, id));
      SY_RETURN_IF_ERROR(job.Run());
      deleted = std::move(*current);
      return absl::OkStatus();
    }));
    return deleted;
  });
}

namespace {

// Columns of job_events as ListJobEvents and LastJobEvent select them.
constexpr char kEventColumns[] = "job_id, sequence, time_us, state, generation, reason, message";

absl::StatusOr<JobEventRow> EventFromRow(Statement& s) {
  JobEventRow e;
  e.job_id = s.Int(0);
  e.sequence = s.Int(1);
  e.time = FromMicros(s.Int(2));
  SY_ASSIGN_OR_RETURN(e.state, StateFromColumn(s.Int(3), "job_events"));
  e.generation = s.Int(4);
  e.reason = s.Text(5);
  e.message = s.Text(6);
  return e;
}

}  // namespace

absl::StatusOr<std::vector<JobEventRow>> Store::ListJobEvents(int64_t job_id) {
  absl::MutexLock lock(&mu_);
  return Guard([&]() -> absl::StatusOr<std::vector<JobEventRow>> {
    SY_ASSIGN_OR_RETURN(
        Statement s,
        Statement::Prepare(db_,
                           absl::StrCat("SELECT ", kEventColumns,
                                        " FROM job_events WHERE job_id = ?1 ORDER BY sequence")));
    SY_RETURN_IF_ERROR(s.Bind(1, job_id));
    return AllRows(s, &EventFromRow);
  });
}

absl::StatusOr<std::optional<JobEventRow>> Store::LastJobEvent(int64_t job_id) {
  absl::MutexLock lock(&mu_);
  return Guard([&]() -> absl::StatusOr<std::optional<JobEventRow>> {
    SY_ASSIGN_OR_RETURN(
        Statement s,
        Statement::Prepare(
            db_,
            absl::StrCat("SELECT ", kEventColumns,
                         " FROM job_events WHERE job_id = ?1 ORDER BY sequence DESC LIMIT 1")));
    SY_RETURN_IF_ERROR(s.Bind(1, job_id));
    SY_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return std::optional<JobEventRow>();
    SY_ASSIGN_OR_RETURN(JobEventRow e, EventFromRow(s));
    return std::optional<JobEventRow>(std::move(e));
  });
}

absl::StatusOr<int64_t> Store::Count(const char* sql) {
  SY_ASSIGN_OR_RETURN(Statement s, Statement::Prepare(db_, sql));
  SY_ASSIGN_OR_RETURN(bool row, s.Step());
  return row ? s.Int(0) : 0;
}

absl::StatusOr<int64_t> Store::CountJobs() {
  absl::MutexLock lock(&mu_);
  return Guard([&]() -> absl::StatusOr<int64_t> { return Count("SELECT count(*) FROM jobs"); });
}

absl::StatusOr<int64_t> Store::CountJobEvents() {
  absl::MutexLock lock(&mu_);
  return Guard(
      [&]() -> absl::StatusOr<int64_t> { return Count("SELECT count(*) FROM job_events"); });
}

absl::Status Store::UpsertWorker(const WorkerRow& worker) {
  if (worker.id.empty()) return absl::InvalidArgumentError("worker.id: must not be empty");
  absl::MutexLock lock(&mu_);
  return Guard([&]() -> absl::Status {
    SY_ASSIGN_OR_RETURN(
        Statement s,
        Statement::Prepare(db_,
                           "INSERT OR REPLACE INTO workers (id, host, gpu, version, state, job, "
                           "last_heartbeat_us) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"));
    SY_RETURN_IF_ERROR(s.BindText(1, worker.id));
    SY_RETURN_IF_ERROR(s.BindText(2, worker.host));
    if (worker.gpu) {
      SY_RETURN_IF_ERROR(s.BindBlob(3, worker.gpu->SerializeAsString()));
    } else {
      SY_RETURN_IF_ERROR(s.BindNull(3));
    }
    SY_RETURN_IF_ERROR(s.BindText(4, worker.version));
    SY_RETURN_IF_ERROR(s.Bind(5, static_cast<int64_t>(worker.state)));
    if (worker.job.empty()) {
      SY_RETURN_IF_ERROR(s.BindNull(6));
    } else {
      SY_RETURN_IF_ERROR(s.BindText(6, worker.job));
    }
    SY_RETURN_IF_ERROR(s.Bind(7, Micros(worker.last_heartbeat)));
    return s.Run();
  });
}

absl::StatusOr<WorkerRow> Store::GetWorker(const std::string& id) {
  absl::MutexLock lock(&mu_);
  return Guard([&]() -> absl::StatusOr<WorkerRow> {
    SY_ASSIGN_OR_RETURN(Statement s,
                        Statement::Prepare(db_,
                                           "SELECT id, host, gpu, version, state, job, "
                                           "last_heartbeat_us FROM workers WHERE id = ?1"));
    SY_RETURN_IF_ERROR(s.BindText(1, id));
    SY_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return absl::NotFoundError(absl::StrCat("worker \"", id, "\" does not exist"));
    return WorkerFromRow(s);
  });
}

absl::StatusOr<std::vector<WorkerRow>> Store::ListWorkers() {
  absl::MutexLock lock(&mu_);
  return Guard([&]() -> absl::StatusOr<std::vector<WorkerRow>> {
    SY_ASSIGN_OR_RETURN(Statement s,
                        Statement::Prepare(db_,
                                           "SELECT id, host, gpu, version, state, job, "
                                           "last_heartbeat_us FROM workers ORDER BY id"));
    return AllRows(s, &WorkerFromRow);
  });
}

absl::Status Store::RecordHeartbeat(const std::string& id) {
  absl::MutexLock lock(&mu_);
  return Guard([&]() -> absl::Status {
    SY_ASSIGN_OR_RETURN(
        Statement s,
        Statement::Prepare(db_, "UPDATE workers SET last_heartbeat_us = ?2 WHERE id = ?1"));
    SY_RETURN_IF_ERROR(s.BindText(1, id));
    SY_RETURN_IF_ERROR(s.Bind(2, Micros(options_.now())));
    SY_RETURN_IF_ERROR(s.Run());
    if (sqlite3_changes(db_) == 0) {
      return absl::NotFoundError(absl::StrCat("worker \"", id, "\" does not exist"));
    }
    return absl::OkStatus();
  });
}

absl::Status Store::SetLastStep(int64_t id, const v1::StepMetrics& step) {
  return SetStepColumn(id, "last_step", step);
}

absl::Status Store::SetLastValidation(int64_t id, const v1::StepMetrics& step) {
  return SetStepColumn(id, "last_validation", step);
}

absl::Status Store::SetStepColumn(int64_t id, const char* column, const v1::StepMetrics& step) {
  absl::MutexLock lock(&mu_);
  return Guard([&]() -> absl::Status {
    const std::string sql = absl::StrCat("UPDATE jobs SET ", column, " = ?2 WHERE id = ?1");
    SY_ASSIGN_OR_RETURN(Statement s, Statement::Prepare(db_, sql));
    SY_RETURN_IF_ERROR(s.Bind(1, id));
    SY_RETURN_IF_ERROR(s.BindBlob(2, step.SerializeAsString()));
    SY_RETURN_IF_ERROR(s.Run());
    if (sqlite3_changes(db_) == 0) {
      return absl::NotFoundError(absl::StrCat("job ", id, " does not exist"));
    }
    return absl::OkStatus();
  });
}

absl::Status Store::SetWorkerState(const std::string& id, WorkerState state,
                                   const std::string& job) {
  absl::MutexLock lock(&mu_);
  return Guard([&]() -> absl::Status {
    SY_ASSIGN_OR_RETURN(
        Statement s,
        Statement::Prepare(db_, "UPDATE workers SET state = ?2, job = ?3 WHERE id = ?1"));
    SY_RETURN_IF_ERROR(s.BindText(1, id));
    SY_RETURN_IF_ERROR(s.Bind(2, static_cast<int64_t>(state)));
    if (job.empty()) {
      SY_RETURN_IF_ERROR(s.BindNull(3));
    } else {
      SY_RETURN_IF_ERROR(s.BindText(3, job));
    }
    SY_RETURN_IF_ERROR(s.Run());
    if (sqlite3_changes(db_) == 0) {
      return absl::NotFoundError(absl::StrCat("worker \"", id, "\" does not exist"));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<BackupResult> Store::Backup(const std::string& dest_path) {
  if (dest_path.empty()) return absl::InvalidArgumentError("backup path: must not be empty");
  if (dest_path == path_) {
    return absl::InvalidArgumentError(
        absl::StrCat("backup path \"", dest_path, "\" is the store itself"));
  }
  absl::MutexLock lock(&mu_);
  if (!corruption_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "not backing up store \"", path_, "\": it is corrupt (", corruption_.message(), ")"));
  }
  absl::StatusOr<BackupResult> result = internal::BackupDatabase(db_, dest_path);
  // Only a read of this store's own pages says DATA_LOSS (the copy's quick_check is
  // FAILED_PRECONDITION-free: see BackupDatabase).
  if (result.status().code() == absl::StatusCode::kDataLoss) MarkCorrupt(result.status());
  return result;
}

absl::StatusOr<std::string> Store::JournalMode() {
  absl::MutexLock lock(&mu_);
  return Guard([&]() -> absl::StatusOr<std::string> {
    SY_ASSIGN_OR_RETURN(Statement s, Statement::Prepare(db_, "PRAGMA journal_mode"));
    SY_ASSIGN_OR_RETURN(bool row, s.Step());
    return row ? s.Text(0) : std::string();
  });
}

absl::StatusOr<int> Store::SchemaVersion() {
  absl::MutexLock lock(&mu_);
  return Guard([&]() -> absl::StatusOr<int> {
    SY_ASSIGN_OR_RETURN(int64_t v, Count("PRAGMA user_version"));
    return static_cast<int>(v);
  });
}

}  // namespace switchyard::store
