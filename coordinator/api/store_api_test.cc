// File: coordinator/api/store_api_test.cc
//
// The store as API clients see it, through an in-process CoordinatorServer on loopback over a real
// SQLite file: DeleteJob on every state over gRPC and REST (with and without its checkpoints), a
// full store (max_page_count) answering STORE_FULL and never NO_FEASIBLE_PLAN or SQL, and
// corruption found while serving turning gRPC health and /healthz NOT_SERVING.
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "coordinator/api/api_status.h"
#include "coordinator/api/api_test_util.h"
#include "coordinator/store/testing/raw_sqlite.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "switchyard/v1/job.grpc.pb.h"

namespace switchyard::api {
namespace {

using Json = nlohmann::json;
using testing::Context;
using testing::kToken;

httplib::Headers Auth() { return {{"Authorization", absl::StrCat("Bearer ", kToken)}}; }

using store::testing::RawExec;  // coordinator/store/testing/raw_sqlite.h

// The first column of the first row of `sql` over a raw connection.
int64_t RawCount(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  int64_t out = -1;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW) {
    out = sqlite3_column_int64(stmt, 0);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return out;
}

void ExpectNoSql(const std::string& message) {
  for (const char* sql : {"SELECT", "INSERT", "UPDATE ", "DELETE FROM", "VALUES", "sqlite:"}) {
    EXPECT_FALSE(absl::StrContains(message, sql)) << "SQL text in a client message: " << message;
  }
}

class StoreApiTest : public ::testing::Test {
 protected:
  void Start(const std::string& store_name,
             const std::function<void(ServerOptions&)>& adjust = {}) {
    store_path_ = testing::FreshPath(store_name);
    server_ = testing::StartServer(store_name, [&](ServerOptions& options) {
      options.workers = false;  // no scheduler: the test drives every transition itself
      if (adjust) adjust(options);
    });
    ASSERT_NE(server_, nullptr);
    channel_ = testing::Channel(server_->grpc_port());
    stub_ = v1::JobService::NewStub(channel_);
    http_ = std::make_unique<httplib::Client>("127.0.0.1", server_->http_port());
  }

  // A job of testing::ValidSpec; `own_save` keeps its training.save (a directory the spec chose),
  // otherwise it is cleared so that the coordinator's checkpoint root applies.
  std::string Create(const std::string& display_name, bool own_save = false) {
    v1::CreateJobRequest request;
    *request.mutable_spec() = testing::ValidSpec(display_name);
    if (!own_save) request.mutable_spec()->mutable_training()->clear_save();
    v1::Job job;
    auto context = Context();
    grpc::Status s = stub_->CreateJob(context.get(), request, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job.name();
  }

  // Drives `name` from PENDING to `state` through the hub, as the scheduler would.
  void DriveTo(const std::string& name, v1::Job::State state) {
    jobs::JobHub* hub = server_->hub();
    auto go = [&](v1::Job::State to, const char* reason) {
      auto job = hub->Transition(name, to, reason);
      ASSERT_TRUE(job.ok()) << job.status();
    };
    switch (state) {
      case v1::Job::PENDING:
        return;
      case v1::Job::CANCELLED:
        return go(v1::Job::CANCELLED, "CANCELLED_BY_USER");
      case v1::Job::FAILED:
        return go(v1::Job::FAILED, "NO_FEASIBLE_PLAN");
      default:
        break;
    }
    go(v1::Job::STARTING, "SCHEDULED");
    if (state == v1::Job::STARTING) return;
    go(v1::Job::RUNNING, "ALL_RANKS_RUNNING");
    if (state == v1::Job::RUNNING) return;
    go(state, state == v1::Job::SUCCEEDED ? "COMPLETED" : "WORKER_LOST");
  }

  grpc::Status Delete(const std::string& name, bool checkpoints = false,
                      bool allow_missing = false) {
    v1::DeleteJobRequest request;
    request.set_name(name);
    request.set_delete_checkpoints(checkpoints);
    request.set_allow_missing(allow_missing);
    google::protobuf::Empty empty;
    auto context = Context();
    return stub_->DeleteJob(context.get(), request, &empty);
  }

  int64_t EventsOf(const std::string& name) {
    return RawCount(store_path_, absl::StrCat("SELECT count(*) FROM job_events WHERE job_id = ",
                                              name.substr(name.find('/') + 1)));
  }

  std::string store_path_;
  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> stub_;
  std::unique_ptr<httplib::Client> http_;
};

TEST_F(StoreApiTest, DeleteJobOnEveryStateOverGrpcAndRest) {
  const std::string checkpoint_root = testing::FreshPath("delete_checkpoints");
  std::filesystem::remove_all(checkpoint_root);
  Start("delete_api.db",
        [&](ServerOptions& options) { options.checkpoint_root = checkpoint_root; });

  // Unfinished jobs: FAILED_PRECONDITION naming the state, over both APIs; nothing is deleted.
  for (v1::Job::State state :
       {v1::Job::PENDING, v1::Job::STARTING, v1::Job::RUNNING, v1::Job::RESTARTING}) {
    const std::string name = Create(absl::StrCat("unfinished-", v1::Job::State_Name(state)));
    DriveTo(name, state);
    const int64_t events = EventsOf(name);
    grpc::Status s = Delete(name, /*checkpoints=*/true);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), v1::Job::State_Name(state)))
        << s.error_message();
    auto r = http_->Delete(absl::StrCat("/v1/", name), Auth());
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_EQ(Json::parse(r->body)["error"]["status"], "FAILED_PRECONDITION") << r->body;
    EXPECT_TRUE(server_->hub()->GetJob(name).ok());
    EXPECT_EQ(EventsOf(name), events);
    std::printf("%-10s %s: gRPC %s | REST %d\n", v1::Job::State_Name(state).c_str(), name.c_str(),
                s.error_message().c_str(), r->status);
  }

  // SUCCEEDED over gRPC: the job and its events go.
  const std::string succeeded = Create("succeeded");
  DriveTo(succeeded, v1::Job::SUCCEEDED);
  ASSERT_GE(EventsOf(succeeded), 4);
  grpc::Status s = Delete(succeeded);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(server_->hub()->GetJob(succeeded).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(EventsOf(succeeded), 0);
  // Deleting again: NOT_FOUND, or OK with allow_missing.
  EXPECT_EQ(Delete(succeeded).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Delete(succeeded, false, /*allow_missing=*/true).ok());

  // FAILED over REST, checkpoints kept without the flag.
  const std::string failed = Create("failed");
  DriveTo(failed, v1::Job::FAILED);
  const std::string failed_dir =
      absl::StrCat(checkpoint_root, "/jobs/", failed.substr(failed.find('/') + 1));
  std::filesystem::create_directories(failed_dir + "/iter_0000010");
  std::ofstream(failed_dir + "/iter_0000010/model.safetensors") << "weights";
  auto r = http_->Delete(absl::StrCat("/v1/", failed), Auth());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->body, "{}");
  EXPECT_TRUE(std::filesystem::exists(failed_dir + "/iter_0000010/model.safetensors"));
  r = http_->Delete(absl::StrCat("/v1/", failed), Auth());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404) << r->body;
  r = http_->Delete(absl::StrCat("/v1/", failed, "?allow_missing=true"), Auth());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;

  // CANCELLED over REST with delete_checkpoints: the directory goes too.
  const std::string cancelled = Create("cancelled");
  DriveTo(cancelled, v1::Job::CANCELLED);
  const std::string cancelled_dir =
      absl::StrCat(checkpoint_root, "/jobs/", cancelled.substr(cancelled.find('/') + 1));
  std::filesystem::create_directories(cancelled_dir + "/iter_0000020");
  std::ofstream(cancelled_dir + "/iter_0000020/model.safetensors") << "weights";
  r = http_->Delete(absl::StrCat("/v1/", cancelled, "?delete_checkpoints=true"), Auth());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_FALSE(std::filesystem::exists(cancelled_dir));
  EXPECT_TRUE(std::filesystem::exists(failed_dir)) << "another job's checkpoints were removed";
  EXPECT_EQ(EventsOf(cancelled), 0);

  // A spec that chose its own training.save: a directory inside the job's
  // (common/config/job_paths.h), removed with it.
  const std::string own = Create("own-save", /*own_save=*/true);
  DriveTo(own, v1::Job::CANCELLED);
  const std::string own_dir =
      absl::StrCat(checkpoint_root, "/jobs/", own.substr(own.find('/') + 1));
  const std::string own_save = own_dir + "/" + testing::ValidSpec("x").training().save();
  std::filesystem::create_directories(own_save + "/iter_0000030");
  std::ofstream(own_save + "/iter_0000030/model.safetensors") << "weights";
  s = Delete(own, /*checkpoints=*/true);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(std::filesystem::exists(own_dir));
  EXPECT_TRUE(std::filesystem::exists(failed_dir)) << "another job's checkpoints were removed";
  std::printf("own training.save %s removed with its job directory\n", own_save.c_str());

  // Bad query parameters name themselves; no token is UNAUTHENTICATED.
  r = http_->Delete(absl::StrCat("/v1/", cancelled, "?force=yes"), Auth());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_TRUE(absl::StrContains(r->body, "force: unknown query parameter")) << r->body;
  r = http_->Delete(absl::StrCat("/v1/", cancelled, "?delete_checkpoints=1"), Auth());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_TRUE(absl::StrContains(r->body, "delete_checkpoints: \\\"1\\\" is not a boolean"))
      << r->body;
  r = http_->Delete(absl::StrCat("/v1/", cancelled));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);

  // A deleted job's id is never assigned again, even the highest one.
  const std::string last = Create("last");
  DriveTo(last, v1::Job::CANCELLED);
  ASSERT_TRUE(Delete(last).ok());
  const std::string next = Create("next");
  auto id = [](const std::string& n) { return std::stoll(n.substr(n.find('/') + 1)); };
  EXPECT_EQ(id(next), id(last) + 1);
  std::printf("deleted %s (gRPC), %s (REST), %s with its checkpoints (REST); %s after %s\n",
              succeeded.c_str(), failed.c_str(), cancelled.c_str(), next.c_str(), last.c_str());
}

TEST_F(StoreApiTest, FullStoreIsStoreFullNeverNoFeasiblePlanOrSql) {
  Start("full_api.db", [](ServerOptions& options) { options.store_max_page_count = 14; });
  const std::string body =
      Json({{"spec", Json::parse(JobSpecToJson(testing::ValidSpec("filler")))}}).dump();
  int created = 0;
  int status = 200;
  std::string response;
  for (int i = 0; i < 500 && status == 200; ++i) {
    auto r = http_->Post("/v1/jobs", Auth(), body, "application/json");
    ASSERT_TRUE(r);
    status = r->status;
    response = r->body;
    if (status == 200) ++created;
  }
  ASSERT_NE(status, 200) << "500 jobs fit in 14 pages?";
  Json error = Json::parse(response)["error"];
  EXPECT_EQ(status, 507) << response;
  EXPECT_EQ(error["status"], "RESOURCE_EXHAUSTED");
  EXPECT_EQ(error["reason"], "STORE_FULL");
  const std::string message = error["message"];
  EXPECT_TRUE(absl::StrContains(message, store_path_)) << message;
  EXPECT_FALSE(absl::StrContains(message, "NO_FEASIBLE_PLAN")) << message;
  ExpectNoSql(message);

  v1::CreateJobRequest request;
  *request.mutable_spec() = testing::ValidSpec("grpc-filler");
  v1::Job job;
  auto context = Context();
  grpc::Status s = stub_->CreateJob(context.get(), request, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_EQ(ReasonOf(s.error_message()), "STORE_FULL") << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), store_path_)) << s.error_message();
  ExpectNoSql(s.error_message());

  // A full store is not a corrupt one: reads work, health stays SERVING.
  auto list = http_->Get("/v1/jobs?page_size=1000", Auth());
  ASSERT_TRUE(list);
  EXPECT_EQ(list->status, 200);
  EXPECT_EQ(Json::parse(list->body)["jobs"].size(), static_cast<size_t>(created));
  auto health = http_->Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  std::printf("%d jobs fit; then HTTP %d %s\ngRPC: %d %s\n", created, status, response.c_str(),
              s.error_code(), s.error_message().c_str());
}

TEST_F(StoreApiTest, CorruptionWhileServingTurnsHealthNotServing) {
  Start("corrupt_api.db");
  const std::string kCheck = "/grpc.health.v1.Health/Check";
  std::string out;
  ASSERT_TRUE(testing::RawUnary(channel_.get(), kCheck, testing::HealthRequest(""), &out).ok());
  ASSERT_EQ(out, testing::kServingResponse);
  std::vector<std::string> names;
  for (int i = 0; i < 300; ++i) {
    auto job = server_->hub()->CreateJob([&] {
      v1::CreateJobRequest request;
      *request.mutable_spec() = testing::ValidSpec(absl::StrCat("job-", i));
      return request;
    }());
    ASSERT_TRUE(job.ok()) << job.status();
    names.push_back(job->name());
  }
  // Move every page into the main file, damage a page in its middle, then commit something from
  // another connection so that the server's connection drops its page cache.
  ASSERT_EQ(RawExec(store_path_, "PRAGMA wal_checkpoint(TRUNCATE)"), "");
  struct stat st {};
  ASSERT_EQ(stat(store_path_.c_str(), &st), 0);
  const int64_t pages = st.st_size / 4096;
  ASSERT_GE(pages, 20);
  {
    std::fstream f(store_path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp((pages / 2) * 4096);
    f.write(std::string(4096, '\xa5').data(), 4096);
  }
  ASSERT_EQ(RawExec(store_path_,
                    "INSERT INTO workers (id, host, version, state, "
                    "last_heartbeat_us) VALUES ('w', 'h', 'v', 1, 0)"),
            "");

  // The hostile test's 300 cancels: each fails DATA_LOSS naming the store, none with SQL.
  int data_loss = 0;
  std::string first;
  for (const std::string& name : names) {
    v1::CancelJobRequest request;
    request.set_name(name);
    v1::Job job;
    auto context = Context();
    grpc::Status s = stub_->CancelJob(context.get(), request, &job);
    if (s.error_code() == grpc::StatusCode::DATA_LOSS) ++data_loss;
    if (first.empty() && !s.ok()) first = s.error_message();
    EXPECT_TRUE(s.ok() || absl::StrContains(s.error_message(), store_path_)) << s.error_message();
    ExpectNoSql(s.error_message());
  }
  EXPECT_GE(data_loss, 1) << "the damaged page was never read";
  EXPECT_FALSE(server_->StoreHealth().ok());

  ASSERT_TRUE(testing::RawUnary(channel_.get(), kCheck, testing::HealthRequest(""), &out).ok());
  EXPECT_EQ(out, std::string("\x08\x02", 2)) << "gRPC health is not NOT_SERVING";
  ASSERT_TRUE(testing::RawUnary(channel_.get(), kCheck,
                                testing::HealthRequest("switchyard.v1.JobService"), &out)
                  .ok());
  EXPECT_EQ(out, std::string("\x08\x02", 2));
  auto health = http_->Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_TRUE(absl::StrContains(health->body, store_path_)) << health->body;
  auto get = http_->Get(absl::StrCat("/v1/", names[0]), Auth());
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 500) << get->body;
  EXPECT_EQ(Json::parse(get->body)["error"]["status"], "DATA_LOSS");
  std::printf("%d of %zu cancels DATA_LOSS; first: %s\n/healthz %d: %s", data_loss, names.size(),
              first.c_str(), health->status, health->body.c_str());
}

// With the worker side on, CreateJob creates <checkpoint-root>/jobs/<id> (0700) in the
// transaction that stores the job (Kubernetes subPath mounts then find it); when the directory
// cannot be made, CreateJob fails naming it and nothing is stored.
TEST_F(StoreApiTest, CreateJobMakesTheJobDirectoryOrStoresNothing) {
  const std::string root = testing::FreshPath("create_dirs_root");
  std::filesystem::remove_all(root);
  Start("create_dirs.db", [&](ServerOptions& options) {
    options.workers = true;
    options.checkpoint_root = root;
  });
  const std::string name = Create("with-directory");
  const std::string dir = absl::StrCat(root, "/jobs/", name.substr(name.find('/') + 1));
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0) << dir;
  std::printf("%s -> %s mode %o\n", name.c_str(), dir.c_str(), st.st_mode & 0777);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  // <root>/jobs replaced by a file: the next job's directory cannot be made.
  std::filesystem::remove_all(root + "/jobs");
  std::ofstream(root + "/jobs") << "not a directory";
  const int64_t jobs_before = RawCount(store_path_, "SELECT COUNT(*) FROM jobs");
  // Events of other jobs than the first only: the scheduler may still append the first job's
  // (e.g. WAITING_FOR_WORKERS) while this runs.
  const std::string other_events = absl::StrCat("SELECT COUNT(*) FROM job_events WHERE job_id <> ",
                                                name.substr(name.find('/') + 1));
  const int64_t events_before = RawCount(store_path_, other_events);
  v1::CreateJobRequest request;
  *request.mutable_spec() = testing::ValidSpec("no-directory");
  request.mutable_spec()->mutable_training()->clear_save();
  v1::Job job;
  auto context = Context();
  grpc::Status s = stub_->CreateJob(context.get(), request, &job);
  std::printf("CreateJob with %s/jobs a file: %d %s\n", root.c_str(), s.error_code(),
              s.error_message().c_str());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(s.error_message(), root + "/jobs")) << s.error_message();
  EXPECT_EQ(RawCount(store_path_, "SELECT COUNT(*) FROM jobs"), jobs_before);
  EXPECT_EQ(RawCount(store_path_, other_events), events_before);
  EXPECT_TRUE(server_->hub()->StoreHealth().ok());
}

}  // namespace
}  // namespace switchyard::api
