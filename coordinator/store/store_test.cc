// File: coordinator/store/store_test.cc
//
// Real SQLite files in the test's temporary directory; reopened to check durability and read back
// through a second, raw sqlite3 connection to check what is actually in the file.
#include "coordinator/store/store.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/store/testing/raw_sqlite.h"
#include "gtest/gtest.h"

namespace switchyard::store {
namespace {

std::string TempFile(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
  for (const char* suffix : {"", "-wal", "-shm"}) std::remove((path + suffix).c_str());
  return path;
}

// A fake clock that advances one second per reading.
struct FakeClock {
  std::atomic<int64_t> seconds{1'700'000'000};
  StoreOptions Options() {
    StoreOptions options;
    options.now = [this] { return absl::FromUnixSeconds(seconds.fetch_add(1)); };
    return options;
  }
};

// One scalar answer of `sql` over a separate raw connection to `path`.
std::string RawQuery(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  std::string out;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW) {
    const unsigned char* text = sqlite3_column_text(stmt, 0);
    out = text != nullptr ? reinterpret_cast<const char*>(text) : "";
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return out;
}

using store::testing::RawExec;  // coordinator/store/testing/raw_sqlite.h

v1::JobSpec Spec(const std::string& name, int hidden) {
  v1::JobSpec spec;
  spec.set_display_name(name);
  spec.mutable_model()->set_hidden_size(hidden);
  spec.mutable_model()->set_num_attention_heads(8);
  spec.mutable_model()->set_num_experts(8);
  spec.mutable_training()->set_train_iters(100);
  spec.set_max_restarts(2);
  return spec;
}

JobRow NewJob(const std::string& name, const std::string& request_id = "") {
  JobRow job;
  job.spec = Spec(name, 512);
  job.request_id = request_id;
  job.state = v1::Job::PENDING;
  return job;
}

JobEventRow Created() {
  JobEventRow e;
  e.state = v1::Job::PENDING;
  e.reason = "CREATED";
  e.message = "job created";
  return e;
}

TEST(StoreTest, RoundTripJobAndEvents) {
  FakeClock clock;
  std::string path = TempFile("round_trip.db");
  auto store = Store::Open(path, clock.Options());
  ASSERT_TRUE(store.ok()) << store.status();

  JobRow job = NewJob("a");
  job.last_checkpoint_step = std::nullopt;
  auto inserted = (*store)->InsertJob(job, Created());
  ASSERT_TRUE(inserted.ok()) << inserted.status();
  EXPECT_TRUE(inserted->created);
  EXPECT_GT(inserted->job.id, 0);

  auto got = (*store)->GetJob(inserted->job.id);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->spec.SerializeAsString(), job.spec.SerializeAsString());
  EXPECT_EQ(got->state, v1::Job::PENDING);
  EXPECT_FALSE(got->last_checkpoint_step.has_value());
  EXPECT_EQ(got->create_time, got->update_time);

  auto updated = (*store)->UpdateJob(got->id, [](JobRow& j) -> absl::StatusOr<JobEventRow> {
    j.state = v1::Job::STARTING;
    j.generation = 1;
    j.last_checkpoint_step = 40;
    j.failure_reason = "none";
    j.id = 999;  // ignored: identity is not the mutation's to change
    JobEventRow e;
    e.state = j.state;
    e.generation = j.generation;
    e.reason = "SCHEDULED";
    return e;
  });
  ASSERT_TRUE(updated.ok()) << updated.status();
  got = (*store)->GetJob(inserted->job.id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->state, v1::Job::STARTING);
  EXPECT_EQ(got->generation, 1);
  EXPECT_EQ(got->last_checkpoint_step, 40);
  EXPECT_EQ(got->failure_reason, "none");
  EXPECT_GT(got->update_time, got->create_time);

  auto events = (*store)->ListJobEvents(got->id);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].sequence, 1);
  EXPECT_EQ((*events)[0].reason, "CREATED");
  EXPECT_EQ((*events)[1].sequence, 2);
  EXPECT_EQ((*events)[1].state, v1::Job::STARTING);
  EXPECT_EQ((*events)[1].generation, 1);
  EXPECT_LT((*events)[0].time, (*events)[1].time);

  // LastJobEvent (GetJob's last_event) is the event of the highest sequence, read alone.
  auto last = (*store)->LastJobEvent(got->id);
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_TRUE(last->has_value());
  EXPECT_EQ((*last)->sequence, 2);
  EXPECT_EQ((*last)->reason, "SCHEDULED");
  EXPECT_EQ((*last)->state, v1::Job::STARTING);
  EXPECT_EQ((*last)->time, (*events)[1].time);
  auto none = (*store)->LastJobEvent(12345);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());

  EXPECT_EQ((*store)->GetJob(12345).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*store)->UpdateJob(12345, [](JobRow&) { return JobEventRow(); }).status().code(),
            absl::StatusCode::kNotFound);
  std::printf("job %lld: %zu events, state %s\n", static_cast<long long>(got->id), events->size(),
              v1::Job::State_Name(got->state).c_str());
}

TEST(StoreTest, FailedMutationWritesNothing) {
  FakeClock clock;
  std::string path = TempFile("rollback.db");
  auto store = Store::Open(path, clock.Options());
  ASSERT_TRUE(store.ok()) << store.status();
  auto inserted = (*store)->InsertJob(NewJob("a"), Created());
  ASSERT_TRUE(inserted.ok());
  auto result = (*store)->UpdateJob(inserted->job.id, [](JobRow& j) -> absl::StatusOr<JobEventRow> {
    j.state = v1::Job::FAILED;
    return absl::FailedPreconditionError("refused");
  });
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*store)->GetJob(inserted->job.id)->state, v1::Job::PENDING);
  EXPECT_EQ(*(*store)->CountJobEvents(), 1);
  // A mutation that leaves no state is refused too.
  result = (*store)->UpdateJob(inserted->job.id, [](JobRow& j) -> absl::StatusOr<JobEventRow> {
    j.state = v1::Job::STATE_UNSPECIFIED;
    return JobEventRow();
  });
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*(*store)->CountJobEvents(), 1);
}

// A failure after the first write of a transaction (here: a trigger that aborts the event insert)
// must undo the whole change: no job row without its event, no state change without its event.
TEST(StoreTest, FailureInsideATransactionUndoesEveryRow) {
  FakeClock clock;
  std::string path = TempFile("atomic.db");
  auto store = Store::Open(path, clock.Options());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(RawExec(path,
                    "CREATE TRIGGER boom BEFORE INSERT ON job_events WHEN NEW.reason = 'BOOM' "
                    "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"),
            "");
  JobEventRow boom = Created();
  boom.reason = "BOOM";
  auto inserted = (*store)->InsertJob(NewJob("a", "req-boom"), boom);
  EXPECT_FALSE(inserted.ok());
  std::printf("insert with failing event: %s\n", inserted.status().ToString().c_str());
  EXPECT_EQ(*(*store)->CountJobs(), 0);
  EXPECT_EQ(*(*store)->CountJobEvents(), 0);

  auto ok = (*store)->InsertJob(NewJob("a", "req-boom"), Created());  // the request id is free
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->created);
  auto updated = (*store)->UpdateJob(ok->job.id, [](JobRow& j) -> absl::StatusOr<JobEventRow> {
    j.state = v1::Job::STARTING;
    j.generation = 1;
    JobEventRow e;
    e.state = j.state;
    e.reason = "BOOM";
    return e;
  });
  EXPECT_FALSE(updated.ok());
  std::printf("update with failing event: %s\n", updated.status().ToString().c_str());
  auto job = (*store)->GetJob(ok->job.id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state, v1::Job::PENDING);
  EXPECT_EQ(job->generation, 0);
  EXPECT_EQ(job->update_time, ok->job.update_time);
  EXPECT_EQ(*(*store)->CountJobEvents(), 1);
  // The connection is usable afterwards (no transaction left open).
  ASSERT_TRUE((*store)->InsertJob(NewJob("b"), Created()).ok());
  EXPECT_EQ(*(*store)->CountJobs(), 2);
}

// Another connection holding the write lock past busy_timeout makes writes UNAVAILABLE (retryable)
// without writing anything; reads still work under WAL.
TEST(StoreTest, LockedDatabaseIsUnavailable) {
  std::string path = TempFile("locked.db");
  StoreOptions options;
  options.busy_timeout = absl::Milliseconds(200);
  auto store = Store::Open(path, options);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->InsertJob(NewJob("a"), Created()).ok());
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  absl::Time start = absl::Now();
  auto blocked = (*store)->InsertJob(NewJob("b"), Created());
  absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(blocked.status().code(), absl::StatusCode::kUnavailable) << blocked.status();
  EXPECT_GE(waited, absl::Milliseconds(150));
  EXPECT_EQ((*store)->ListJobs(v1::Job::STATE_UNSPECIFIED, 0, 10)->size(), 1u);
  ASSERT_EQ(sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  EXPECT_TRUE((*store)->InsertJob(NewJob("b"), Created()).ok());
  EXPECT_EQ(*(*store)->CountJobs(), 2);
  std::printf("locked for %s: %s\n", absl::FormatDuration(waited).c_str(),
              blocked.status().ToString().c_str());
}

TEST(StoreTest, RequestIdReturnsExistingJob) {
  FakeClock clock;
  std::string path = TempFile("request_id.db");
  auto store = Store::Open(path, clock.Options());
  ASSERT_TRUE(store.ok()) << store.status();
  auto first = (*store)->InsertJob(NewJob("a", "req-1"), Created());
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->created);
  auto second = (*store)->InsertJob(NewJob("b", "req-1"), Created());
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->created);
  EXPECT_EQ(second->job.id, first->job.id);
  EXPECT_EQ(second->job.spec.display_name(), "a");
  auto third = (*store)->InsertJob(NewJob("c", "req-2"), Created());
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(third->created);
  // Jobs without a request id never collide.
  ASSERT_TRUE((*store)->InsertJob(NewJob("d"), Created()).ok());
  ASSERT_TRUE((*store)->InsertJob(NewJob("e"), Created()).ok());
  EXPECT_EQ(*(*store)->CountJobs(), 4);
  EXPECT_EQ(*(*store)->CountJobEvents(), 4);
}

TEST(StoreTest, ListJobsFiltersAndPages) {
  FakeClock clock;
  std::string path = TempFile("list.db");
  auto store = Store::Open(path, clock.Options());
  ASSERT_TRUE(store.ok()) << store.status();
  for (int i = 0; i < 10; ++i) {
    JobRow job = NewJob(absl::StrCat("j", i));
    if (i % 3 == 0) job.state = v1::Job::RUNNING;
    ASSERT_TRUE((*store)->InsertJob(job, Created()).ok());
  }
  auto all = (*store)->ListJobs(v1::Job::STATE_UNSPECIFIED, 0, 100);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 10u);
  auto running = (*store)->ListJobs(v1::Job::RUNNING, 0, 100);
  ASSERT_TRUE(running.ok());
  EXPECT_EQ(running->size(), 4u);
  auto page = (*store)->ListJobs(v1::Job::STATE_UNSPECIFIED, (*all)[3].id, 2);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].id, (*all)[4].id);
  EXPECT_EQ((*page)[1].id, (*all)[5].id);
  EXPECT_EQ((*store)->ListJobs(v1::Job::STATE_UNSPECIFIED, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StoreTest, ReopenKeepsJobsEventsAndWorkers) {
  FakeClock clock;
  std::string path = TempFile("reopen.db");
  int64_t id = 0;
  {
    auto store = Store::Open(path, clock.Options());
    ASSERT_TRUE(store.ok()) << store.status();
    auto inserted = (*store)->InsertJob(NewJob("durable", "req-durable"), Created());
    ASSERT_TRUE(inserted.ok());
    id = inserted->job.id;
    ASSERT_TRUE((*store)
                    ->UpdateJob(id,
                                [](JobRow& j) -> absl::StatusOr<JobEventRow> {
                                  j.state = v1::Job::RUNNING;
                                  j.generation = 3;
                                  j.restart_count = 2;
                                  j.last_checkpoint_step = 700;
                                  JobEventRow e;
                                  e.state = j.state;
                                  e.generation = 3;
                                  e.reason = "ALL_WORKERS_READY";
                                  return e;
                                })
                    .ok());
    WorkerRow gpu_worker;
    gpu_worker.id = "w-gpu";
    gpu_worker.host = "node-1";
    gpu_worker.version = "0.1";
    gpu_worker.gpu.emplace();
    gpu_worker.gpu->set_name("NVIDIA H100");
    gpu_worker.gpu->set_memory_bytes(int64_t{80} << 30);
    gpu_worker.gpu->set_compute_capability_major(9);
    ASSERT_TRUE((*store)->UpsertWorker(gpu_worker).ok());
    WorkerRow cpu_worker;
    cpu_worker.id = "w-cpu";
    cpu_worker.host = "node-2";
    ASSERT_TRUE((*store)->UpsertWorker(cpu_worker).ok());
    ASSERT_TRUE((*store)->SetWorkerState("w-gpu", WorkerState::kAssigned, "jobs/1").ok());
    ASSERT_TRUE((*store)->RecordHeartbeat("w-gpu").ok());
  }  // closed here
  auto store = Store::Open(path, clock.Options());
  ASSERT_TRUE(store.ok()) << store.status();
  auto job = (*store)->GetJob(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.display_name(), "durable");
  EXPECT_EQ(job->request_id, "req-durable");
  EXPECT_EQ(job->state, v1::Job::RUNNING);
  EXPECT_EQ(job->generation, 3);
  EXPECT_EQ(job->restart_count, 2);
  EXPECT_EQ(job->last_checkpoint_step, 700);
  auto events = (*store)->ListJobEvents(id);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[1].reason, "ALL_WORKERS_READY");
  auto workers = (*store)->ListWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 2u);
  EXPECT_EQ((*workers)[0].id, "w-cpu");
  EXPECT_FALSE((*workers)[0].gpu.has_value());
  EXPECT_EQ((*workers)[0].state, WorkerState::kIdle);
  EXPECT_EQ((*workers)[1].id, "w-gpu");
  ASSERT_TRUE((*workers)[1].gpu.has_value());
  EXPECT_EQ((*workers)[1].gpu->name(), "NVIDIA H100");
  EXPECT_EQ((*workers)[1].gpu->memory_bytes(), int64_t{80} << 30);
  EXPECT_EQ((*workers)[1].state, WorkerState::kAssigned);
  EXPECT_EQ((*workers)[1].job, "jobs/1");
  EXPECT_GT((*workers)[1].last_heartbeat, absl::FromUnixSeconds(1'700'000'000));
  // The next event continues the sequence after the reopen.
  ASSERT_TRUE((*store)
                  ->UpdateJob(id,
                              [](JobRow& j) -> absl::StatusOr<JobEventRow> {
                                j.state = v1::Job::SUCCEEDED;
                                JobEventRow e;
                                e.state = j.state;
                                e.reason = "DONE";
                                return e;
                              })
                  .ok());
  events = (*store)->ListJobEvents(id);
  ASSERT_EQ(events->size(), 3u);
  EXPECT_EQ((*events)[2].sequence, 3);
  EXPECT_EQ((*store)->GetWorker("nobody").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*store)->RecordHeartbeat("nobody").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*store)->SetWorkerState("nobody", WorkerState::kLost, "").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ((*store)->UpsertWorker(WorkerRow()).code(), absl::StatusCode::kInvalidArgument);
  std::printf("reopened %s: job %lld %s gen %lld, %zu events, %zu workers\n", path.c_str(),
              static_cast<long long>(id), v1::Job::State_Name(job->state).c_str(),
              static_cast<long long>(job->generation), events->size(), workers->size());
}

// A file of schema version 1 (made here by dropping the v2, v3 and v5 columns from a current
// one, the exact v1 table) opens, is upgraded to kSchemaVersion, keeps its job, and takes a plan,
// a last step and a last validation again.
TEST(StoreTest, UpgradesAVersion1File) {
  std::string path = TempFile("v1.db");
  int64_t id = 0;
  {
    auto store = Store::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    auto inserted = (*store)->InsertJob(NewJob("old"), Created());
    ASSERT_TRUE(inserted.ok()) << inserted.status();
    id = inserted->job.id;
  }
  ASSERT_EQ(RawExec(path,
                    "ALTER TABLE jobs DROP COLUMN last_validation; "
                    "ALTER TABLE jobs DROP COLUMN last_step; ALTER TABLE jobs DROP COLUMN plan; "
                    "PRAGMA user_version=1;"),
            "");
  ASSERT_EQ(RawQuery(path, "PRAGMA user_version"), "1");
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto version = (*store)->SchemaVersion();
  ASSERT_TRUE(version.ok());
  EXPECT_EQ(*version, kSchemaVersion);
  auto job = (*store)->GetJob(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.display_name(), "old");
  EXPECT_FALSE(job->plan.has_value());
  EXPECT_FALSE(job->last_step.has_value());
  v1::StepMetrics step;
  step.set_step(5);
  ASSERT_TRUE((*store)->SetLastStep(id, step).ok());
  job = (*store)->GetJob(id);
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(job->last_step.has_value());
  EXPECT_EQ(job->last_step->step(), 5);
  EXPECT_FALSE(job->last_validation.has_value());
  // The v5 column: a validation report is kept apart from the (overwritten) last step.
  v1::StepMetrics validated;
  validated.set_step(4);
  validated.set_validation_loss(2.5);
  ASSERT_TRUE((*store)->SetLastValidation(id, validated).ok());
  step.set_step(6);
  ASSERT_TRUE((*store)->SetLastStep(id, step).ok());
  job = (*store)->GetJob(id);
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(job->last_validation.has_value());
  EXPECT_EQ(job->last_validation->step(), 4);
  EXPECT_EQ(job->last_validation->validation_loss(), 2.5);
  EXPECT_EQ(job->last_step->step(), 6);
  EXPECT_EQ((*store)->SetLastValidation(id + 1000, validated).code(), absl::StatusCode::kNotFound);
  std::printf("v1 file upgraded to v%d; job %lld kept; last step %lld stored after the upgrade\n",
              *version, static_cast<long long>(id), static_cast<long long>(job->last_step->step()));
}

TEST(StoreTest, WalModeAndSchemaVersionAreInTheFile) {
  std::string path = TempFile("wal.db");
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->InsertJob(NewJob("a"), Created()).ok());
  EXPECT_EQ(*(*store)->JournalMode(), "wal");
  EXPECT_EQ(*(*store)->SchemaVersion(), kSchemaVersion);
  // A second connection sees the persistent WAL mode and the version in the file header.
  std::string mode = RawQuery(path, "PRAGMA journal_mode");
  std::string version = RawQuery(path, "PRAGMA user_version");
  EXPECT_EQ(mode, "wal");
  EXPECT_EQ(version, absl::StrCat(kSchemaVersion));
  std::ifstream wal(path + "-wal");
  EXPECT_TRUE(wal.good()) << "no write-ahead log next to " << path;
  std::printf("journal_mode=%s user_version=%s (-wal file present: %d)\n", mode.c_str(),
              version.c_str(), wal.good());
}

TEST(StoreTest, EventsAreAppendOnly) {
  std::string path = TempFile("append_only.db");
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->InsertJob(NewJob("a"), Created()).ok());
  std::string update_error = RawExec(path, "UPDATE job_events SET reason = 'X'");
  std::string delete_error = RawExec(path, "DELETE FROM job_events");
  EXPECT_NE(update_error.find("append-only"), std::string::npos) << update_error;
  EXPECT_NE(delete_error.find("append-only"), std::string::npos) << delete_error;
  EXPECT_EQ(*(*store)->CountJobEvents(), 1);
  std::printf("UPDATE refused: %s; DELETE refused: %s\n", update_error.c_str(),
              delete_error.c_str());
}

TEST(StoreTest, RefusesNewerSchemaForeignDatabasesAndGarbage) {
  std::string newer = TempFile("newer.db");
  ASSERT_TRUE(Store::Open(newer).ok());
  EXPECT_EQ(RawExec(newer, absl::StrCat("PRAGMA user_version=", kSchemaVersion + 1)), "");
  auto opened = Store::Open(newer);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition) << opened.status();
  std::printf("newer: %s\n", opened.status().ToString().c_str());

  std::string foreign = TempFile("foreign.db");
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(foreign.c_str(), &db), SQLITE_OK);
    sqlite3_close(db);
  }
  EXPECT_EQ(RawExec(foreign, "CREATE TABLE other (x INTEGER)"), "");
  opened = Store::Open(foreign);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition) << opened.status();
  EXPECT_EQ(RawQuery(foreign, "SELECT count(*) FROM sqlite_master WHERE name = 'jobs'"), "0");
  std::printf("foreign: %s\n", opened.status().ToString().c_str());

  std::string garbage = TempFile("garbage.db");
  {
    std::ofstream out(garbage);
    out << std::string(4096, 'x');
  }
  opened = Store::Open(garbage);
  EXPECT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss) << opened.status();
  EXPECT_NE(opened.status().message().find("is not a SQLite database"), std::string::npos)
      << opened.status();
  std::printf("garbage: %s\n", opened.status().ToString().c_str());

  EXPECT_EQ(Store::Open("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(Store::Open("/nonexistent-dir/x/y.db").ok());
}

// Two connections (as two coordinator processes would have) and two threads sharing one
// connection insert concurrently; every job and event must land exactly once.
TEST(StoreTest, ConcurrentInsertsDoNotCorrupt) {
  std::string path = TempFile("concurrent.db");
  auto a = Store::Open(path);
  auto b = Store::Open(path);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  constexpr int kPerThread = 100;
  std::atomic<int> failures{0};
  auto work = [&](Store* store, const std::string& prefix) {
    for (int i = 0; i < kPerThread; ++i) {
      // Every other job carries a request id, and both sides race on the shared ones.
      std::string request_id = i % 2 == 0 ? absl::StrCat("shared-", i) : "";
      auto r = store->InsertJob(NewJob(absl::StrCat(prefix, i), request_id), Created());
      if (!r.ok()) {
        ++failures;
        std::printf("insert failed: %s\n", r.status().ToString().c_str());
      }
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(work, a->get(), "a");
  threads.emplace_back(work, a->get(), "a2");
  threads.emplace_back(work, b->get(), "b");
  threads.emplace_back(work, b->get(), "b2");
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  // 4 threads x 50 jobs without request id + 50 shared request ids, each created once.
  const int64_t expected = 4 * kPerThread / 2 + kPerThread / 2;
  auto jobs = (*a)->ListJobs(v1::Job::STATE_UNSPECIFIED, 0, 1000);
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(static_cast<int64_t>(jobs->size()), expected);
  EXPECT_EQ(*(*b)->CountJobEvents(), expected);
  std::set<int64_t> ids;
  std::set<std::string> request_ids;
  for (const JobRow& j : *jobs) {
    ids.insert(j.id);
    if (!j.request_id.empty()) {
      EXPECT_TRUE(request_ids.insert(j.request_id).second);
    }
    auto events = (*b)->ListJobEvents(j.id);
    ASSERT_TRUE(events.ok());
    EXPECT_EQ(events->size(), 1u);
  }
  EXPECT_EQ(static_cast<int64_t>(ids.size()), expected);
  EXPECT_EQ(request_ids.size(), static_cast<size_t>(kPerThread / 2));
  EXPECT_EQ(RawQuery(path, "PRAGMA integrity_check"), "ok");
  std::printf("%lld jobs, %zu distinct request ids, integrity_check ok\n",
              static_cast<long long>(expected), request_ids.size());
}

// --- integrity, corruption, full disk, backups, deletion, permissions ------------------------

constexpr int kPageSize = 4096;  // SQLite's default, which the store keeps

// A store of `n` jobs whose specs are large enough (about 600 bytes) to spread the jobs table
// over many pages; closed, so everything is checkpointed into the main file.
void FillStore(const std::string& path, int n) {
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  for (int i = 0; i < n; ++i) {
    JobRow job = NewJob(absl::StrCat("job-", i, "-", std::string(600, 'p')));
    ASSERT_TRUE((*store)->InsertJob(job, Created()).ok());
  }
}

int64_t FileSize(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

int Mode(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 0777) : -1;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Overwrites page `page` (1-based) of `path` with garbage; returns false when the file is shorter.
bool CorruptPage(const std::string& path, int64_t page) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  if (!f || FileSize(path) < page * kPageSize) return false;
  f.seekp((page - 1) * kPageSize);
  f.write(std::string(kPageSize, '\xa5').data(), kPageSize);
  return static_cast<bool>(f);
}

void ExpectRefused(const std::string& label, const std::string& path, absl::StatusCode code,
                   const std::string& problem) {
  const std::string before = ReadAll(path);
  StoreOptions options;
  options.create_if_missing = false;
  auto opened = Store::Open(path, options);
  EXPECT_EQ(opened.status().code(), code) << label << ": " << opened.status();
  EXPECT_NE(opened.status().message().find(path), std::string::npos)
      << label << " does not name the file: " << opened.status();
  EXPECT_NE(opened.status().message().find(problem), std::string::npos)
      << label << " does not say \"" << problem << "\": " << opened.status();
  EXPECT_EQ(ReadAll(path), before) << label << ": the refused file was changed";
  std::printf("%s (%lld bytes): %s\n", label.c_str(), static_cast<long long>(FileSize(path)),
              opened.status().ToString().c_str());
}

TEST(StoreIntegrityTest, MissingEmptyTruncatedAndCorruptStoresAreRefused) {
  // Missing, without create_if_missing: NOT_FOUND, and no file appears.
  std::string missing = TempFile("missing.db");
  StoreOptions no_create;
  no_create.create_if_missing = false;
  auto opened = Store::Open(missing, no_create);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kNotFound) << opened.status();
  EXPECT_NE(opened.status().message().find("--create-store"), std::string::npos);
  EXPECT_EQ(FileSize(missing), -1) << "a refused open created the file";
  std::printf("missing: %s\n", opened.status().ToString().c_str());

  // Empty (0 bytes): refused even with create_if_missing (SQLite would take it as a new store).
  std::string empty = TempFile("empty.db");
  { std::ofstream touch(empty); }
  ExpectRefused("empty", empty, absl::StatusCode::kDataLoss, "is empty (0 bytes)");
  EXPECT_EQ(Store::Open(empty).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(FileSize(empty), 0);

  // Truncated at a page boundary (half its pages) and mid-page.
  std::string full = TempFile("full.db");
  FillStore(full, 300);
  const int64_t size = FileSize(full);
  const int64_t pages = size / kPageSize;
  ASSERT_GE(pages, 20) << "the test store should span many pages";
  std::printf("store of 300 jobs: %lld bytes, %lld pages\n", static_cast<long long>(size),
              static_cast<long long>(pages));
  std::string truncated = TempFile("truncated.db");
  std::string odd = TempFile("truncated_odd.db");
  {
    std::string bytes = ReadAll(full);
    std::ofstream(truncated, std::ios::binary) << bytes.substr(0, (pages / 2) * kPageSize);
    std::ofstream(odd, std::ios::binary) << bytes.substr(0, size - 1000);
  }
  ExpectRefused("truncated to half", truncated, absl::StatusCode::kDataLoss, "is truncated");
  ExpectRefused("truncated mid-page", odd, absl::StatusCode::kDataLoss, "is truncated");

  // A garbage page in the middle: quick_check finds it.
  std::string corrupt = TempFile("corrupt_page.db");
  std::ofstream(corrupt, std::ios::binary) << ReadAll(full);
  ASSERT_TRUE(CorruptPage(corrupt, pages / 2));
  ExpectRefused("garbage page in the middle", corrupt, absl::StatusCode::kDataLoss,
                "is corrupt: quick_check");

  // The intact original still opens with all its jobs.
  auto store = Store::Open(full, no_create);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(*(*store)->CountJobs(), 300);
}

TEST(StoreIntegrityTest, CorruptionWhileServingIsDataLossOnceAndSticks) {
  std::string path = TempFile("corrupt_serving.db");
  FillStore(path, 300);
  const int64_t pages = FileSize(path) / kPageSize;
  int callbacks = 0;
  absl::Status reported;
  StoreOptions options;
  options.create_if_missing = false;
  options.on_corruption = [&](const absl::Status& s) {
    ++callbacks;
    reported = s;
  };
  auto store = Store::Open(path, options);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Health().ok());
  ASSERT_TRUE(CorruptPage(path, pages / 2));
  // Another connection's commit makes this connection drop its page cache (WAL index changed), so
  // the next read comes from the damaged file.
  ASSERT_EQ(RawExec(path,
                    "INSERT INTO workers (id, host, version, state, last_heartbeat_us) "
                    "VALUES ('w', 'h', 'v', 1, 0)"),
            "");
  auto listed = (*store)->ListJobs(v1::Job::STATE_UNSPECIFIED, 0, 1000);
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kDataLoss) << listed.status();
  EXPECT_EQ(callbacks, 1);
  EXPECT_EQ(reported.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(reported.message().find(path), std::string::npos) << reported;
  // Every later call, even one that would not touch the bad page, gets the same DATA_LOSS; the
  // callback is not called again.
  auto worker = (*store)->GetWorker("w");
  EXPECT_EQ(worker.status().code(), absl::StatusCode::kDataLoss) << worker.status();
  EXPECT_EQ((*store)->Health().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(callbacks, 1);
  for (const absl::Status& s : {listed.status(), worker.status(), (*store)->Health()}) {
    EXPECT_NE(s.message().find(path), std::string::npos) << s;
    EXPECT_FALSE(absl::StrContains(s.message(), "SELECT")) << "SQL in a message: " << s;
  }
  // No backup of a corrupt store.
  auto backup = (*store)->Backup(TempFile("corrupt_serving.backup"));
  EXPECT_EQ(backup.status().code(), absl::StatusCode::kFailedPrecondition) << backup.status();
  std::printf("first error: %s\nlater calls: %s\n", listed.status().ToString().c_str(),
              worker.status().ToString().c_str());
}

TEST(StoreIntegrityTest, FullStoreIsResourceExhaustedNamingItWithoutSql) {
  std::string path = TempFile("tiny.db");
  StoreOptions options;
  options.max_page_count = 12;  // a few pages past the empty schema's
  auto store = Store::Open(path, options);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::Status full;
  int inserted = 0;
  for (int i = 0; i < 1000 && full.ok(); ++i) {
    full = (*store)->InsertJob(NewJob(std::string(2000, 'x')), Created()).status();
    if (full.ok()) ++inserted;
  }
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find(path), std::string::npos) << full;
  EXPECT_TRUE(absl::StrContains(full.message(), "(reason: STORE_FULL)")) << full;
  for (const char* sql : {"INSERT", "SELECT", "jobs (", "VALUES"}) {
    EXPECT_FALSE(absl::StrContains(full.message(), sql)) << "SQL text in: " << full;
  }
  // Nothing half-written: every job has its event; the store still serves reads and is healthy.
  EXPECT_EQ(*(*store)->CountJobs(), inserted);
  EXPECT_EQ(*(*store)->CountJobEvents(), inserted);
  EXPECT_TRUE((*store)->Health().ok());
  std::printf("%d jobs fit in 12 pages; then: %s\n", inserted, full.ToString().c_str());
}

TEST(StoreBackupTest, BackupThenRestoreLosesNoJob) {
  std::string path = TempFile("live.db");
  std::string backup = TempFile("live.backup.db");
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  for (int i = 0; i < 50; ++i) {
    auto r = (*store)->InsertJob(NewJob(absl::StrCat("job-", i)), Created());
    ASSERT_TRUE(r.ok()) << r.status();
    if (i % 5 == 0) {
      ASSERT_TRUE((*store)
                      ->UpdateJob(r->job.id,
                                  [](JobRow& j) -> absl::StatusOr<JobEventRow> {
                                    j.state = v1::Job::CANCELLED;
                                    JobEventRow e;
                                    e.state = j.state;
                                    e.reason = "CANCELLED_BY_USER";
                                    return e;
                                  })
                      .ok());
    }
  }
  // A previous backup is replaced whole.
  { std::ofstream(backup) << "old backup"; }
  auto result = (*store)->Backup(backup);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(FileSize(backup), result->bytes);
  EXPECT_GT(result->pages, 0);
  EXPECT_EQ(Mode(backup), 0600);
  EXPECT_EQ(FileSize(backup + ".tmp"), -1) << "the temporary file was left behind";
  // Writes after the backup are not in it.
  ASSERT_TRUE((*store)->InsertJob(NewJob("after"), Created()).ok());

  StoreOptions no_create;
  no_create.create_if_missing = false;
  auto restored = Store::Open(backup, no_create);
  ASSERT_TRUE(restored.ok()) << restored.status();
  auto original = (*store)->ListJobs(v1::Job::STATE_UNSPECIFIED, 0, 1000);
  auto copy = (*restored)->ListJobs(v1::Job::STATE_UNSPECIFIED, 0, 1000);
  ASSERT_TRUE(original.ok() && copy.ok());
  ASSERT_EQ(copy->size(), 50u);
  ASSERT_EQ(original->size(), 51u);
  for (size_t i = 0; i < copy->size(); ++i) {
    const JobRow& a = (*original)[i];
    const JobRow& b = (*copy)[i];
    EXPECT_EQ(a.id, b.id);
    EXPECT_EQ(a.state, b.state);
    EXPECT_EQ(a.spec.SerializeAsString(), b.spec.SerializeAsString());
    EXPECT_EQ((*store)->ListJobEvents(a.id)->size(), (*restored)->ListJobEvents(b.id)->size());
  }
  EXPECT_EQ(*(*restored)->JournalMode(), "wal");
  // The restored store goes on assigning ids after the highest one ever used.
  auto next = (*restored)->InsertJob(NewJob("next"), Created());
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->job.id, copy->back().id + 1);
  std::printf("backup: %lld bytes, %lld pages in %s; restored %zu jobs, %lld events\n",
              static_cast<long long>(result->bytes), static_cast<long long>(result->pages),
              absl::FormatDuration(result->elapsed).c_str(), copy->size(),
              static_cast<long long>(*(*restored)->CountJobEvents()));
}

TEST(StoreDeleteTest, DeletesJobAndEventsOnlyWhenCheckPassesAndNeverReusesIds) {
  std::string path = TempFile("delete.db");
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto a = (*store)->InsertJob(NewJob("a"), Created());
  auto b = (*store)->InsertJob(NewJob("b"), Created());
  ASSERT_TRUE(a.ok() && b.ok());
  auto finish = [](JobRow& j) -> absl::StatusOr<JobEventRow> {
    j.state = v1::Job::SUCCEEDED;
    JobEventRow e;
    e.state = j.state;
    e.reason = "COMPLETED";
    return e;
  };
  ASSERT_TRUE((*store)->UpdateJob(b->job.id, finish).ok());
  // A failing check deletes nothing.
  auto refused = (*store)->DeleteJob(
      b->job.id, [](const JobRow&) { return absl::FailedPreconditionError("no"); });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*(*store)->CountJobs(), 2);
  EXPECT_EQ(*(*store)->CountJobEvents(), 3);
  // The schema itself refuses to drop a PENDING job's events, whatever the caller checks.
  auto pending = (*store)->DeleteJob(a->job.id, nullptr);
  EXPECT_EQ(pending.status().code(), absl::StatusCode::kFailedPrecondition) << pending.status();
  EXPECT_TRUE(absl::StrContains(pending.status().message(), "append-only")) << pending.status();
  EXPECT_EQ(*(*store)->CountJobs(), 2);
  // The finished job goes with its events.
  auto deleted = (*store)->DeleteJob(b->job.id, nullptr);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->spec.display_name(), "b");
  EXPECT_EQ((*store)->GetJob(b->job.id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE((*store)->ListJobEvents(b->job.id)->empty());
  EXPECT_EQ(*(*store)->CountJobEvents(), 1);
  EXPECT_EQ((*store)->DeleteJob(b->job.id, nullptr).status().code(), absl::StatusCode::kNotFound);
  // b had the highest id; the next job still gets a new one.
  auto c = (*store)->InsertJob(NewJob("c"), Created());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->job.id, b->job.id + 1);
  std::printf("deleted job %lld (SUCCEEDED, 2 events); PENDING refused: %s; next id %lld\n",
              static_cast<long long>(b->job.id), pending.status().ToString().c_str(),
              static_cast<long long>(c->job.id));
}

TEST(StorePermissionsTest, StoreAndItsWalAreOwnerOnly) {
  const mode_t old_umask = umask(022);
  std::string path = TempFile("perm.db");
  {
    auto store = Store::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->InsertJob(NewJob("a"), Created()).ok());
    EXPECT_EQ(Mode(path), 0600);
    EXPECT_EQ(Mode(path + "-wal"), 0600);
    EXPECT_EQ(Mode(path + "-shm"), 0600);
    // The new store was built as perm.db.new and linked into place; nothing of it is left.
    for (const char* suffix : {".new", ".new-wal", ".new-shm"}) {
      EXPECT_EQ(Mode(path + suffix), -1) << path << suffix << " was left behind";
    }
  }
  // An existing store readable by others is tightened on open.
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(Mode(path), 0600);
  umask(old_umask);
  std::printf("store, -wal, -shm: %o %o %o\n", Mode(path), Mode(path + "-wal"),
              Mode(path + "-shm"));
}

}  // namespace
}  // namespace switchyard::store
