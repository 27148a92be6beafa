// File: coordinator/api/create_deadline_test.cc
//
// CreateJob under a 1 ms client deadline against a real server on loopback (job_service.h
// "CreateJob under a deadline"): a call that got DEADLINE_EXCEEDED may or may not have created
// its job; retried with the same request_id it returns exactly one job, never a duplicate. The
// test prints how many expired calls had created their job anyway (the window between the
// server's deadline check and its reply) and how many the server refused before the insert.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/api/api_test_util.h"
#include "gtest/gtest.h"
#include "switchyard/v1/job.grpc.pb.h"

namespace switchyard::api {
namespace {

int CountJobs(v1::JobService::Stub& stub) {
  v1::ListJobsRequest request;
  request.set_page_size(1000);
  v1::ListJobsResponse response;
  grpc::Status s = stub.ListJobs(testing::Context().get(), request, &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return response.jobs_size();
}

TEST(CreateJobDeadlineTest, RetryWithTheSameRequestIdNeverDuplicates) {
  auto server =
      testing::StartServer("create_deadline.db", [](ServerOptions& o) { o.workers = false; });
  ASSERT_NE(server, nullptr);
  auto stub = v1::JobService::NewStub(testing::Channel(server->grpc_port()));
  ASSERT_EQ(CountJobs(*stub), 0);  // also connects the channel

  constexpr int kCalls = 80;
  int expired = 0, created_anyway = 0, ok_first = 0;
  std::set<std::string> names;
  for (int i = 0; i < kCalls; ++i) {
    v1::CreateJobRequest request;
    *request.mutable_spec() = testing::ValidSpec(absl::StrCat("deadline-", i));
    request.set_request_id(absl::StrCat("deadline-", i));
    auto context = testing::Context();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1));
    v1::Job job;
    grpc::Status status = stub->CreateJob(context.get(), request, &job);
    if (status.ok()) {
      ++ok_first;
      names.insert(job.name());
      continue;
    }
    ASSERT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
    ++expired;
    const int before = CountJobs(*stub);
    if (before > static_cast<int>(names.size())) ++created_anyway;
    // The retry: same request_id, a generous deadline.
    v1::Job again;
    grpc::Status retry = stub->CreateJob(testing::Context().get(), request, &again);
    ASSERT_TRUE(retry.ok()) << retry.error_message();
    EXPECT_EQ(again.spec().display_name(), absl::StrCat("deadline-", i));
    names.insert(again.name());
  }
  const int total = CountJobs(*stub);
  std::printf(
      "%d CreateJob calls with a 1 ms deadline: %d OK, %d DEADLINE_EXCEEDED (%d of them had "
      "created the job anyway, %d refused before the insert); after retrying those with the same "
      "request_id: %d jobs, %zu distinct names\n",
      kCalls, ok_first, expired, created_anyway, expired - created_anyway, total, names.size());
  EXPECT_EQ(total, kCalls) << "a retry duplicated a job or lost one";
  EXPECT_EQ(names.size(), static_cast<size_t>(kCalls));
}

}  // namespace
}  // namespace switchyard::api
