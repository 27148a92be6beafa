// The API together with the worker side in one CoordinatorServer (as the binary runs it): fake
// workers (coordinator/api/worker_test_util.h: real gRPC Attach streams) attach with the
// workers' token (the API token is refused), the workers gauge counts them, a job submitted through
// JobService is assigned, its step reports reach WatchJob and Job.last_step (gRPC and REST), and
// the job succeeds when the ranks exit 0.
#include <httplib.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/api/api_test_util.h"
#include "coordinator/api/worker_test_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "switchyard/v1/job.grpc.pb.h"

namespace switchyard::api {
namespace {

using v1::CoordinatorMessage;

double Sample(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, name + " ")) return std::stod(line.substr(name.size() + 1));
  }
  return -1;
}

TEST(ServerWorkersTest, FakeWorkersRunAJobSubmittedThroughTheApi) {
  auto server = testing::StartServer("workers_api.db", [](ServerOptions& options) {
    const char* dir = std::getenv("TEST_TMPDIR");
    options.worker_options =
        api::testing::FastOptions(absl::StrCat(dir != nullptr ? dir : "/tmp", "/ckpt"));
  });
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(absl::EndsWith(server->advertise_address(), absl::StrCat(":", server->grpc_port())));

  // Health covers the worker side's services too (no token needed).
  auto channel = testing::Channel(server->grpc_port());
  for (const std::string service :
       {"", "switchyard.v1.WorkerService", "switchyard.v1.RendezvousService"}) {
    std::string out;
    grpc::Status s = testing::RawUnary(channel.get(), "/grpc.health.v1.Health/Check",
                                       testing::HealthRequest(service), &out);
    ASSERT_TRUE(s.ok()) << service << ": " << s.error_message();
    EXPECT_EQ(out, testing::kServingResponse) << service;
  }

  // A worker with the wrong token or the API token is refused; two with the workers' token attach.
  api::testing::FakeWorker intruder(api::testing::MakeChannel(server->grpc_port(), 9), "intruder");
  intruder.Attach("wrong");
  auto refused = intruder.WaitForEnd(absl::Seconds(10));
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->error_code(), grpc::StatusCode::UNAUTHENTICATED);
  api::testing::FakeWorker user(api::testing::MakeChannel(server->grpc_port(), 8), "user");
  user.Attach(testing::kToken);
  refused = user.WaitForEnd(absl::Seconds(10));
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(refused->error_message(), "WRONG_ROLE"))
      << refused->error_message();
  std::vector<std::unique_ptr<api::testing::FakeWorker>> fleet;
  for (int i = 0; i < 2; ++i) {
    fleet.push_back(std::make_unique<api::testing::FakeWorker>(
        api::testing::MakeChannel(server->grpc_port(), i), absl::StrCat("w", i)));
    fleet.back()->Attach(testing::kWorkerToken);
  }
  httplib::Client http("127.0.0.1", server->http_port());
  double attached = -1;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10); absl::Now() < deadline;) {
    auto r = http.Get("/metrics");
    ASSERT_TRUE(r);
    attached = Sample(r->body, "switchyard_coordinator_workers_attached");
    if (attached == 2) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(attached, 2);
  std::printf("workers attached (gauge): %.0f; wrong-token worker: %s\n", attached,
              refused->error_message().c_str());

  auto jobs = v1::JobService::NewStub(testing::Channel(server->grpc_port()));
  v1::CreateJobRequest create;
  *create.mutable_spec() = api::testing::SmallSpec(2, 2);
  v1::Job job;
  grpc::Status created = jobs->CreateJob(testing::Context().get(), create, &job);
  ASSERT_TRUE(created.ok()) << created.error_message();

  std::vector<v1::WatchJobResponse> updates;
  grpc::Status watch_status;
  auto watch_context = testing::Context(testing::kToken, 60);
  std::thread watcher([&] {
    v1::WatchJobRequest request;
    request.set_name(job.name());
    auto stream = jobs->WatchJob(watch_context.get(), request);
    v1::WatchJobResponse response;
    while (stream->Read(&response)) updates.push_back(response);
    watch_status = stream->Finish();
  });

  std::map<int, api::testing::FakeWorker*> ranks;
  for (auto& w : fleet) {
    auto a = w->WaitFor(CoordinatorMessage::kAssignment);
    ASSERT_TRUE(a.has_value()) << w->id();
    EXPECT_EQ(a->message.assignment().job(), job.name());
    EXPECT_EQ(a->message.assignment().rendezvous_address(), server->advertise_address());
    ranks[a->message.assignment().rank()] = w.get();
    ASSERT_TRUE(w->WaitFor(CoordinatorMessage::kStart).has_value()) << w->id();
  }
  ASSERT_EQ(ranks.size(), 2u);
  // Steps are published once the job runs; give the watch time to subscribe first.
  absl::SleepFor(absl::Milliseconds(200));
  // Step 2 is an evaluation step (validation loss 4 + rank: rank 0's is the job's).
  for (int step = 1; step <= 3; ++step) {
    for (auto& [rank, w] : ranks) {
      w->SendStep(step, 10.0 - step + 0.5 * rank,
                  step == 2 ? std::optional<double>(4.0 + rank) : std::nullopt);
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  v1::Job got;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10); absl::Now() < deadline;) {
    v1::GetJobRequest get;
    get.set_name(job.name());
    ASSERT_TRUE(jobs->GetJob(testing::Context().get(), get, &got).ok());
    if (got.last_step().step() == 3) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(got.state(), v1::Job::RUNNING);
  EXPECT_EQ(got.last_step().step(), 3);
  EXPECT_DOUBLE_EQ(got.last_step().loss(), 7.0);  // rank 0's report
  auto rest =
      http.Get(absl::StrCat("/v1/", job.name()).c_str(),
               httplib::Headers{{"Authorization", absl::StrCat("Bearer ", testing::kToken)}});
  ASSERT_TRUE(rest);
  nlohmann::json rest_job = nlohmann::json::parse(rest->body);
  EXPECT_EQ(rest_job["last_step"]["step"], "3") << rest->body;  // int64 as a string
  // Job.last_validation: rank 0's evaluation step, kept while later steps overwrite last_step.
  EXPECT_EQ(got.last_validation().step(), 2);
  EXPECT_DOUBLE_EQ(got.last_validation().validation_loss(), 4.0);
  EXPECT_NEAR(got.last_validation().validation_perplexity(), std::exp(4.0), 1e-9);
  EXPECT_EQ(rest_job["last_validation"]["step"], "2") << rest->body;
  EXPECT_DOUBLE_EQ(rest_job["last_validation"]["validation_loss"].get<double>(), 4.0);

  // WorkerAdminService.ListWorkers (and GET /v1/workers): both workers busy on this job with
  // ranks 0 and 1, the wrong-token one absent; no token -> UNAUTHENTICATED.
  auto admin = v1::WorkerAdminService::NewStub(testing::Channel(server->grpc_port()));
  v1::ListWorkersResponse listed;
  grpc::Status list_status = admin->ListWorkers(testing::Context().get(), {}, &listed);
  ASSERT_TRUE(list_status.ok()) << list_status.error_message();
  ASSERT_EQ(listed.workers_size(), 2) << listed.DebugString();
  std::set<int> listed_ranks;
  for (const v1::WorkerStatus& w : listed.workers()) {
    std::printf("ListWorkers: %s host %s state %s job %s gen %lld rank %d connected %d\n",
                w.worker_id().c_str(), w.host().c_str(),
                v1::WorkerStatus::State_Name(w.state()).c_str(), w.job().c_str(),
                static_cast<long long>(w.generation()), w.rank(), w.connected());
    EXPECT_EQ(w.state(), v1::WorkerStatus::BUSY);
    EXPECT_EQ(w.job(), job.name());
    EXPECT_TRUE(w.connected());
    EXPECT_GT(w.last_heartbeat_time().seconds(), 0);
    listed_ranks.insert(w.rank());
  }
  EXPECT_EQ(listed_ranks, (std::set<int>{0, 1}));
  v1::ListWorkersResponse unauth;
  EXPECT_EQ(admin->ListWorkers(testing::Context("").get(), {}, &unauth).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  auto rest_workers = http.Get(
      "/v1/workers", httplib::Headers{{"Authorization", absl::StrCat("Bearer ", testing::kToken)}});
  ASSERT_TRUE(rest_workers);
  EXPECT_EQ(rest_workers->status, 200) << rest_workers->body;
  EXPECT_EQ(nlohmann::json::parse(rest_workers->body)["workers"].size(), 2u) << rest_workers->body;
  EXPECT_EQ(http.Get("/v1/workers")->status, 401);

  for (auto& [rank, w] : ranks) w->SendExit(0);
  watcher.join();
  EXPECT_TRUE(watch_status.ok()) << watch_status.error_message();
  std::vector<v1::Job::State> states;
  std::vector<int64_t> steps;
  for (const v1::WatchJobResponse& u : updates) {
    if (u.has_event()) states.push_back(u.event().state());
    if (u.has_step()) steps.push_back(u.step().step());
  }
  std::printf("watch: %zu updates; states:", updates.size());
  for (v1::Job::State s : states) std::printf(" %s", v1::Job::State_Name(s).c_str());
  std::printf("; steps:");
  for (int64_t s : steps) std::printf(" %lld", static_cast<long long>(s));
  std::printf("\n");
  ASSERT_FALSE(states.empty());
  EXPECT_EQ(states.front(), v1::Job::PENDING);
  EXPECT_EQ(states.back(), v1::Job::SUCCEEDED);
  EXPECT_NE(std::find(states.begin(), states.end(), v1::Job::RUNNING), states.end());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3}));
}

}  // namespace
}  // namespace switchyard::api
