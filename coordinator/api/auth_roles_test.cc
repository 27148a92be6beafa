// File: coordinator/api/auth_roles_test.cc
//
// The two credentials of one real CoordinatorServer on loopback (auth.h): every API service
// refuses the workers' token and every worker-side service refuses the API token (WRONG_ROLE),
// each accepts its own; failed authentications are logged (peer, method, role, reason; rate
// limited) and counted in switchyard_coordinator_auth_failures_total scraped from the real
// GET /metrics; undecodable request bytes sent through a generic stub are INVALID_ARGUMENT with a
// message (decode_errors.h), on every kind of service.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <cstdio>
#include <map>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/api/api_test_util.h"
#include "coordinator/api/auth.h"
#include "gtest/gtest.h"
#include "switchyard/v1/job.grpc.pb.h"
#include "switchyard/v1/plan.grpc.pb.h"
#include "switchyard/v1/worker.grpc.pb.h"

namespace switchyard::api {
namespace {

using testing::kToken;
using testing::kWorkerToken;

// The value of the sample `name{labels}` in a Prometheus text exposition (-1 when absent).
double Sample(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, series + " ")) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

std::string Failures(const std::string& role, const std::string& reason) {
  return absl::StrCat(kAuthFailuresMetric, "{reason=\"", reason, "\",role=\"", role, "\"}");
}

void ExpectRefused(const grpc::Status& s, absl::string_view reason, const std::string& what) {
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << what << ": " << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), absl::StrCat("(reason: ", reason, ")")))
      << what << ": " << s.error_message();
  std::printf("  %-44s -> UNAUTHENTICATED %s\n", what.c_str(), s.error_message().c_str());
}

class AuthRolesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = testing::StartServer("auth_roles.db");
    ASSERT_NE(server_, nullptr);
    channel_ = testing::Channel(server_->grpc_port());
  }

  std::string Scrape() {
    httplib::Client http("127.0.0.1", server_->http_port());
    auto r = http.Get("/metrics");
    EXPECT_TRUE(r && r->status == 200);
    return r ? r->body : "";
  }

  grpc::Status RendezvousSet(const char* token) {
    auto stub = v1::RendezvousService::NewStub(channel_);
    v1::RendezvousSetRequest request;
    request.set_job("jobs/1");
    request.set_generation(1);
    request.set_key("k");
    request.set_value(std::string(1 << 20, 'v'));
    request.set_worker_id("w-0");
    v1::RendezvousSetResponse response;
    return stub->Set(testing::Context(token, 10).get(), request, &response);
  }

  grpc::Status Attach(const char* token) {
    auto stub = v1::WorkerService::NewStub(channel_);
    auto context = testing::Context(token, 10);
    auto stream = stub->Attach(context.get());
    v1::WorkerMessage hello;
    hello.mutable_registration()->set_worker_id("w-0");
    hello.mutable_registration()->set_host("host-a");
    stream->Write(hello);
    stream->WritesDone();
    v1::CoordinatorMessage in;
    while (stream->Read(&in)) {
    }
    return stream->Finish();
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(AuthRolesTest, EachSideAcceptsOnlyItsOwnToken) {
  auto jobs = v1::JobService::NewStub(channel_);
  auto plans = v1::PlanService::NewStub(channel_);
  auto admin = v1::WorkerAdminService::NewStub(channel_);

  std::printf("the workers' token on the API:\n");
  v1::ListJobsResponse list;
  ExpectRefused(jobs->ListJobs(testing::Context(kWorkerToken).get(), {}, &list), kWrongRole,
                "JobService.ListJobs");
  v1::CreateJobRequest create;
  *create.mutable_spec() = testing::ValidSpec("by-a-worker");
  v1::Job job;
  ExpectRefused(jobs->CreateJob(testing::Context(kWorkerToken).get(), create, &job), kWrongRole,
                "JobService.CreateJob");
  v1::PlanRequest plan_request;
  *plan_request.mutable_spec() = testing::ValidSpec();
  *plan_request.mutable_cluster() = testing::Cluster32();
  v1::Plan plan;
  ExpectRefused(plans->Plan(testing::Context(kWorkerToken).get(), plan_request, &plan), kWrongRole,
                "PlanService.Plan");
  v1::ListWorkersResponse workers;
  ExpectRefused(admin->ListWorkers(testing::Context(kWorkerToken).get(), {}, &workers), kWrongRole,
                "WorkerAdminService.ListWorkers");
  httplib::Client http("127.0.0.1", server_->http_port());
  auto rest = http.Get("/v1/jobs", {{"Authorization", absl::StrCat("Bearer ", kWorkerToken)}});
  ASSERT_TRUE(rest);
  EXPECT_EQ(rest->status, 401) << rest->body;
  EXPECT_TRUE(absl::StrContains(rest->body, "WRONG_ROLE")) << rest->body;
  std::printf("  %-44s -> %d %s\n", "REST GET /v1/jobs", rest->status, rest->body.c_str());

  std::printf("the API token on the worker side:\n");
  ExpectRefused(RendezvousSet(kToken), kWrongRole, "RendezvousService.Set (1 MiB value)");
  ExpectRefused(Attach(kToken), kWrongRole, "WorkerService.Attach");

  std::printf("no token, a wrong token:\n");
  ExpectRefused(RendezvousSet(nullptr), kMissingToken, "RendezvousService.Set");
  ExpectRefused(Attach("guess"), kInvalidToken, "WorkerService.Attach");
  ExpectRefused(jobs->ListJobs(testing::Context("guess").get(), {}, &list), kInvalidToken,
                "JobService.ListJobs");

  // Each side's own token passes authentication: the API answers, the worker side gets as far as
  // its own rules (no job runs, so the rendezvous is refused for that, not for the token).
  ASSERT_TRUE(jobs->ListJobs(testing::Context(kToken).get(), {}, &list).ok());
  grpc::Status own = RendezvousSet(kWorkerToken);
  EXPECT_EQ(own.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << own.error_message();
  std::printf("own tokens: ListJobs OK; RendezvousService.Set -> %d %s\n", own.error_code(),
              own.error_message().c_str());
  EXPECT_EQ(server_->worker_plane()->rendezvous()->Usage().bytes, 0)
      << "nothing stored by a refused call";

  // Every failure above was counted, by role of the service and reason, on the real /metrics.
  const std::string text = Scrape();
  const std::map<std::pair<std::string, std::string>, double> want = {
      {{"user", "WRONG_ROLE"}, 5},  // four gRPC services and REST
      {{"worker", "WRONG_ROLE"}, 2},    {{"worker", "MISSING_TOKEN"}, 1},
      {{"worker", "INVALID_TOKEN"}, 1}, {{"user", "INVALID_TOKEN"}, 1},
  };
  for (const auto& [labels, value] : want) {
    const std::string series = Failures(labels.first, labels.second);
    EXPECT_EQ(Sample(text, series), value) << series << "\n" << text;
    std::printf("scraped %s %g\n", series.c_str(), Sample(text, series));
  }
  EXPECT_EQ(server_->auth_audit()->failures(), 10);
}

TEST_F(AuthRolesTest, FailuresAreLoggedWithPeerMethodAndReason) {
  auto jobs = v1::JobService::NewStub(channel_);
  v1::ListJobsResponse list;
  ::testing::internal::CaptureStderr();
  grpc::Status s = jobs->ListJobs(testing::Context(kWorkerToken).get(), {}, &list);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ExpectRefused(s, kWrongRole, "JobService.ListJobs");
  std::printf("log: %s", log.c_str());
  EXPECT_TRUE(absl::StrContains(log, "auth failure: peer ipv4:127.0.0.1:")) << log;
  EXPECT_TRUE(absl::StrContains(log, "method ListJobs role user reason WRONG_ROLE")) << log;
  EXPECT_FALSE(absl::StrContains(log, kWorkerToken)) << "a token must never be logged";
}

TEST(AuthAuditTest, AFloodIsRateLimitedAndCountedInFull) {
  prometheus::Registry registry;
  AuthAudit audit(&registry, absl::Hours(1), /*burst=*/3);
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 1000; ++i) {
    audit.Record("user", "INVALID_TOKEN", "ListJobs", "ipv4:10.0.0.9:5555", "bad token");
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  int lines = 0;
  for (size_t at = log.find("auth failure:"); at != std::string::npos;
       at = log.find("auth failure:", at + 1)) {
    ++lines;
  }
  std::printf("1000 failures: %d log lines, %lld counted\n", lines,
              static_cast<long long>(audit.failures()));
  EXPECT_EQ(lines, 3);
  EXPECT_EQ(audit.lines_logged(), 3);
  EXPECT_EQ(audit.failures(), 1000);
  double counted = 0;
  for (const auto& family : registry.Collect()) {
    if (family.name != kAuthFailuresMetric) continue;
    for (const auto& metric : family.metric) counted += metric.counter.value;
  }
  EXPECT_EQ(counted, 1000);
  // The next window's first line says how many were not logged.
  AuthAudit quick(nullptr, absl::Milliseconds(50), /*burst=*/1);
  ::testing::internal::CaptureStderr();
  quick.Record("worker", "MISSING_TOKEN", "Attach", "ipv4:10.0.0.9:1", "m");
  quick.Record("worker", "MISSING_TOKEN", "Attach", "ipv4:10.0.0.9:1", "m");
  quick.Record("worker", "MISSING_TOKEN", "Attach", "ipv4:10.0.0.9:1", "m");
  absl::SleepFor(absl::Milliseconds(60));
  quick.Record("worker", "MISSING_TOKEN", "Attach", "ipv4:10.0.0.9:1", "m");
  const std::string next = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(absl::StrContains(next, "(2 more failures not logged)")) << next;
}

TEST_F(AuthRolesTest, UndecodableRequestsAreInvalidArgumentWithAMessage) {
  // A varint of 11 bytes: no proto message parses it.
  const std::string garbage(11, '\xff');
  for (const char* method :
       {"/switchyard.v1.JobService/CreateJob", "/switchyard.v1.JobService/WatchJob",
        "/switchyard.v1.PlanService/Plan", "/switchyard.v1.WorkerAdminService/ListWorkers",
        "/switchyard.v1.RendezvousService/Set", "/switchyard.v1.RendezvousService/Get"}) {
    std::string out;
    for (const char* token : {kToken, kWorkerToken, static_cast<const char*>(nullptr)}) {
      grpc::Status s = testing::RawUnary(channel_.get(), method, garbage, &out, token);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << method << ": " << s.error_code() << " " << s.error_message();
      EXPECT_TRUE(absl::StrContains(s.error_message(), method)) << s.error_message();
      EXPECT_TRUE(absl::StrContains(s.error_message(), "not a valid serialized request"))
          << s.error_message();
    }
    std::printf("%s <- 11 bytes 0xff: INVALID_ARGUMENT\n", method);
  }
  // A request that decodes is untouched: an empty CreateJobRequest is the registry's own
  // INVALID_ARGUMENT naming the field, not the decoding message; ListJobs answers OK.
  std::string out;
  grpc::Status empty =
      testing::RawUnary(channel_.get(), "/switchyard.v1.JobService/CreateJob", "", &out, kToken);
  EXPECT_EQ(empty.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(absl::StrContains(empty.error_message(), "not a valid serialized"))
      << empty.error_message();
  std::printf("empty CreateJobRequest: %s\n", empty.error_message().c_str());
  EXPECT_TRUE(
      testing::RawUnary(channel_.get(), "/switchyard.v1.JobService/ListJobs", "", &out, kToken)
          .ok());
  // Handler errors of code INTERNAL for decodable requests are not rewritten either: the
  // interceptor only acts when the request failed to decode (checked by the two calls above).
}

}  // namespace
}  // namespace switchyard::api
