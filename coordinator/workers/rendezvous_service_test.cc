// File: coordinator/workers/rendezvous_service_test.cc
//
// RendezvousService over a real gRPC server on loopback (the Harness's), with the token.
#include "coordinator/workers/rendezvous_service.h"

#include <grpcpp/grpcpp.h>

#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/workers/worker_test_util.h"
#include "gtest/gtest.h"

namespace switchyard::workers {
namespace {

using testing::Harness;

class RendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override {
    harness_ = Harness::Start("rendezvous.db");
    ASSERT_NE(harness_, nullptr);
    stub_ = v1::RendezvousService::NewStub(testing::MakeChannel(harness_->port()));
  }

  grpc::Status Set(const std::string& job, int64_t generation, const std::string& key,
                   const std::string& value, const char* token = testing::kToken) {
    grpc::ClientContext context;
    if (token != nullptr) context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    v1::RendezvousSetRequest request;
    request.set_job(job);
    request.set_generation(generation);
    request.set_key(key);
    request.set_value(value);
    v1::RendezvousSetResponse response;
    return stub_->Set(&context, request, &response);
  }

  grpc::Status Get(const std::string& job, int64_t generation, const std::string& key,
                   int64_t timeout_ms, std::string* value) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", absl::StrCat("Bearer ", testing::kToken));
    v1::RendezvousGetRequest request;
    request.set_job(job);
    request.set_generation(generation);
    request.set_key(key);
    request.set_timeout_ms(timeout_ms);
    v1::RendezvousGetResponse response;
    grpc::Status status = stub_->Get(&context, request, &response);
    if (value != nullptr) *value = response.value();
    return status;
  }

  std::unique_ptr<Harness> harness_;
  std::unique_ptr<v1::RendezvousService::Stub> stub_;
};

TEST_F(RendezvousTest, SetThenGet) {
  ASSERT_TRUE(Set("jobs/1", 1, "nccl_id", std::string("\x00\x01\xff", 3)).ok());
  std::string value;
  grpc::Status status = Get("jobs/1", 1, "nccl_id", 0, &value);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(value, std::string("\x00\x01\xff", 3));
  // Overwrite.
  ASSERT_TRUE(Set("jobs/1", 1, "nccl_id", "v2").ok());
  ASSERT_TRUE(Get("jobs/1", 1, "nccl_id", 0, &value).ok());
  EXPECT_EQ(value, "v2");
}

TEST_F(RendezvousTest, GetWaitsForSet) {
  std::string value;
  grpc::Status status;
  const absl::Time start = absl::Now();
  std::thread getter([&] { status = Get("jobs/2", 1, "rank0_addr", 5000, &value); });
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(Set("jobs/2", 1, "rank0_addr", "10.0.0.1:29500").ok());
  getter.join();
  const absl::Duration waited = absl::Now() - start;
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(value, "10.0.0.1:29500");
  EXPECT_GE(waited, absl::Milliseconds(300));
  EXPECT_LT(waited, absl::Seconds(5));
  std::printf("Get blocked %s until the Set\n", absl::FormatDuration(waited).c_str());
}

TEST_F(RendezvousTest, GetTimesOutNamingTheKey) {
  const absl::Time start = absl::Now();
  grpc::Status status = Get("jobs/3", 1, "never_set", 200, nullptr);
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(status.error_message().find("never_set"), std::string::npos) << status.error_message();
  EXPECT_GE(waited, absl::Milliseconds(200));
  std::printf("timeout after %s: %s\n", absl::FormatDuration(waited).c_str(),
              status.error_message().c_str());
}

TEST_F(RendezvousTest, GenerationScoping) {
  ASSERT_TRUE(Set("jobs/4", 1, "k", "gen1").ok());
  ASSERT_TRUE(Set("jobs/5", 1, "k", "other job").ok());
  // A newer generation drops generation 1's keys.
  ASSERT_TRUE(Set("jobs/4", 2, "other", "x").ok());
  std::string value;
  grpc::Status status = Get("jobs/4", 2, "k", 0, &value);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << "gen 1 key leaked";
  status = Get("jobs/4", 1, "k", 0, &value);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  std::printf("old generation: %s\n", status.error_message().c_str());
  status = Set("jobs/4", 1, "k", "late");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // Other jobs are untouched.
  ASSERT_TRUE(Get("jobs/5", 1, "k", 0, &value).ok());
  EXPECT_EQ(value, "other job");
  // The scheduler's DropBefore (a new generation starts) wakes a blocked Get of the old one.
  grpc::Status blocked;
  std::thread getter([&] { blocked = Get("jobs/5", 1, "missing", 5000, nullptr); });
  absl::SleepFor(absl::Milliseconds(200));
  harness_->plane()->rendezvous()->DropBefore("jobs/5", 2);
  getter.join();
  EXPECT_EQ(blocked.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << blocked.error_message();
  EXPECT_EQ(harness_->plane()->rendezvous()->KeyCount("jobs/5", 2), 0);
}

TEST_F(RendezvousTest, BadRequests) {
  struct Case {
    std::string job;
    int64_t generation;
    std::string key;
    int64_t timeout_ms;
    std::string needle;
  };
  const Case cases[] = {
      {"", 1, "k", 0, "job must not be empty"},
      {"jobs/1", 0, "k", 0, "generation (0) must be >= 1"},
      {"jobs/1", 1, "", 0, "key must not be empty"},
      {"jobs/1", 1, std::string(2000, 'k'), 0, "key (2000 bytes)"},
      {"jobs/1", 1, "k", -1, "timeout_ms (-1)"},
      {"jobs/1", 1, "k", kMaxRendezvousTimeoutMs + 1, "timeout_ms"},
  };
  for (const Case& c : cases) {
    grpc::Status status = Get(c.job, c.generation, c.key, c.timeout_ms, nullptr);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.needle;
    EXPECT_NE(status.error_message().find(c.needle), std::string::npos) << status.error_message();
    std::printf("INVALID_ARGUMENT: %s\n", status.error_message().c_str());
  }
  grpc::Status big = Set("jobs/1", 1, "k", std::string(kMaxRendezvousValueBytes + 1, 'v'));
  EXPECT_EQ(big.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(big.error_message().find("value ("), std::string::npos);
}

TEST_F(RendezvousTest, RequiresToken) {
  grpc::Status status = Set("jobs/1", 1, "k", "v", nullptr);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
  status = Set("jobs/1", 1, "k", "v", "wrong-token");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
  std::printf("wrong token: %s\n", status.error_message().c_str());
}

}  // namespace
}  // namespace switchyard::workers
