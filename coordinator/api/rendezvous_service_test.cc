// File: coordinator/api/rendezvous_service_test.cc
//
// RendezvousService over a real gRPC server on loopback (the Harness's), with the worker token,
// driven by the real scheduler: fake workers attach, a job of world 2 starts, and only its two
// ranks may use the keys of its running generation. Checks the refusals (unknown or finished job,
// wrong generation, a worker that is not a rank, oversize value, too many keys or bytes), that
// the keys are dropped when a generation ends and the store holds nothing after the job ends
// (no growth over several generations), and that a blocked Get is released when its generation
// ends.
#include "coordinator/api/rendezvous_service.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/api/worker_test_util.h"
#include "gtest/gtest.h"

namespace switchyard::api {
namespace {

using testing::FakeWorker;
using testing::Harness;
using testing::HeartbeatTicker;
using v1::CoordinatorMessage;
using v1::Job;

class RendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override {
    harness_ = Harness::Start("rendezvous.db");
    ASSERT_NE(harness_, nullptr);
    stub_ = v1::RendezvousService::NewStub(testing::MakeChannel(harness_->port()));
    std::vector<FakeWorker*> raw;
    for (const char* id : {"w-a", "w-b", "w-c"}) {
      workers_.push_back(
          std::make_unique<FakeWorker>(testing::MakeChannel(harness_->port()), id, "host-a"));
      workers_.back()->Attach();
      raw.push_back(workers_.back().get());
    }
    ticker_ = std::make_unique<HeartbeatTicker>(raw, absl::Milliseconds(200));
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (harness_->plane()->registry()->CountInState(cluster::WorkerState::kIdle) < 3 &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    // World exactly 2: two of the three workers are ranks, the third stays idle.
    job_ = harness_->Submit(testing::SmallSpec(2, 2, /*max_restarts=*/10));
    ASSERT_NO_FATAL_FAILURE(WaitForGeneration(1));
  }

  void TearDown() override {
    ticker_.reset();
    workers_.clear();
  }

  // Waits until two workers hold an Assignment of `generation`; fills ranks_ and idle_.
  void WaitForGeneration(int64_t generation) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      ranks_.clear();
      idle_.clear();
      for (const auto& w : workers_) {
        std::optional<v1::Assignment> a = w->assignment();
        if (a && a->job() == job_ && a->generation() == generation) {
          ranks_.push_back(w->id());
        } else {
          idle_.push_back(w->id());
        }
      }
      if (ranks_.size() == 2) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_EQ(ranks_.size(), 2u) << "generation " << generation << " did not start on 2 ranks";
    // The scheduler marks the ranks busy before it sends the Assignments.
    std::printf("%s generation %lld: ranks %s, %s; idle %s\n", job_.c_str(),
                static_cast<long long>(generation), ranks_[0].c_str(), ranks_[1].c_str(),
                idle_.empty() ? "-" : idle_[0].c_str());
  }

  FakeWorker* Worker(const std::string& id) {
    for (const auto& w : workers_) {
      if (w->id() == id) return w.get();
    }
    return nullptr;
  }

  grpc::Status Set(const std::string& job, int64_t generation, const std::string& key,
                   const std::string& value, const std::string& worker_id,
                   const char* token = testing::kWorkerToken) {
    grpc::ClientContext context;
    if (token != nullptr) context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    v1::RendezvousSetRequest request;
    request.set_job(job);
    request.set_generation(generation);
    request.set_key(key);
    request.set_value(value);
    request.set_worker_id(worker_id);
    v1::RendezvousSetResponse response;
    return stub_->Set(&context, request, &response);
  }

  grpc::Status Get(const std::string& job, int64_t generation, const std::string& key,
                   int64_t timeout_ms, const std::string& worker_id, std::string* value) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", absl::StrCat("Bearer ", testing::kWorkerToken));
    v1::RendezvousGetRequest request;
    request.set_job(job);
    request.set_generation(generation);
    request.set_key(key);
    request.set_timeout_ms(timeout_ms);
    request.set_worker_id(worker_id);
    v1::RendezvousGetResponse response;
    grpc::Status status = stub_->Get(&context, request, &response);
    if (value != nullptr) *value = response.value();
    return status;
  }

  // Polls the store's usage until it holds no key (or 10 s pass); returns the last usage.
  cluster::RendezvousUsage WaitForEmpty() {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    cluster::RendezvousUsage usage = harness_->plane()->rendezvous()->Usage();
    while ((usage.keys > 0 || usage.bytes > 0) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
      usage = harness_->plane()->rendezvous()->Usage();
    }
    return usage;
  }

  std::unique_ptr<Harness> harness_;
  std::unique_ptr<v1::RendezvousService::Stub> stub_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
  std::unique_ptr<HeartbeatTicker> ticker_;
  std::string job_;
  std::vector<std::string> ranks_;
  std::vector<std::string> idle_;
};

void ExpectCode(const grpc::Status& status, grpc::StatusCode code, const std::string& needle) {
  EXPECT_EQ(status.error_code(), code) << status.error_message();
  EXPECT_TRUE(absl::StrContains(status.error_message(), needle))
      << "'" << status.error_message() << "' lacks '" << needle << "'";
  std::printf("code %d: %s\n", static_cast<int>(status.error_code()),
              status.error_message().c_str());
}

TEST_F(RendezvousTest, RanksSetAndGet) {
  ASSERT_TRUE(Set(job_, 1, "nccl_id", std::string("\x00\x01\xff", 3), ranks_[0]).ok());
  std::string value;
  grpc::Status status = Get(job_, 1, "nccl_id", 0, ranks_[1], &value);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(value, std::string("\x00\x01\xff", 3));
  // Overwrite.
  ASSERT_TRUE(Set(job_, 1, "nccl_id", "v2", ranks_[1]).ok());
  ASSERT_TRUE(Get(job_, 1, "nccl_id", 0, ranks_[0], &value).ok());
  EXPECT_EQ(value, "v2");
  EXPECT_EQ(harness_->plane()->rendezvous()->KeyCount(job_, 1), 1);
}

TEST_F(RendezvousTest, GetWaitsForSet) {
  std::string value;
  grpc::Status status;
  const absl::Time start = absl::Now();
  std::thread getter([&] { status = Get(job_, 1, "rank0_addr", 5000, ranks_[1], &value); });
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(Set(job_, 1, "rank0_addr", "10.0.0.1:29500", ranks_[0]).ok());
  getter.join();
  const absl::Duration waited = absl::Now() - start;
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(value, "10.0.0.1:29500");
  EXPECT_GE(waited, absl::Milliseconds(300));
  std::printf("Get blocked %s until the Set\n", absl::FormatDuration(waited).c_str());
}

TEST_F(RendezvousTest, GetTimesOutNamingTheKey) {
  const absl::Time start = absl::Now();
  grpc::Status status = Get(job_, 1, "never_set", 200, ranks_[0], nullptr);
  const absl::Duration waited = absl::Now() - start;
  ExpectCode(status, grpc::StatusCode::DEADLINE_EXCEEDED, "never_set");
  EXPECT_GE(waited, absl::Milliseconds(200));
}

TEST_F(RendezvousTest, RefusedOutsideTheRunningGenerationAndItsRanks) {
  // A job that does not exist here, and one that exists but never ran: no running generation.
  ExpectCode(Set("jobs/999", 1, "k", "v", ranks_[0]), grpc::StatusCode::FAILED_PRECONDITION,
             "jobs/999 generation 1 is not running here");
  const std::string pending = harness_->Submit(testing::SmallSpec(12, 12));
  ExpectCode(Set(pending, 1, "k", "v", ranks_[0]), grpc::StatusCode::FAILED_PRECONDITION,
             "is not running here");
  // A generation that is not the running one, even from a rank of the running one (so a rank of
  // an ended generation gets the retryable FAILED_PRECONDITION, never PERMISSION_DENIED).
  ExpectCode(Set(job_, 2, "k", "v", ranks_[0]), grpc::StatusCode::FAILED_PRECONDITION,
             "is not the running generation (1)");
  // The idle worker and a worker that never attached, on the running generation.
  ExpectCode(Set(job_, 1, "k", "v", idle_[0]), grpc::StatusCode::PERMISSION_DENIED,
             absl::StrCat("worker '", idle_[0], "' is not a rank of ", job_, " generation 1"));
  std::string ignored;
  ExpectCode(Get(job_, 1, "k", 0, idle_[0], &ignored), grpc::StatusCode::PERMISSION_DENIED,
             "(it runs nothing)");
  ExpectCode(Get(job_, 1, "k", 0, "ghost", &ignored), grpc::StatusCode::PERMISSION_DENIED,
             "worker 'ghost' is not attached");
  ExpectCode(Set(job_, 1, "k", "v", ""), grpc::StatusCode::INVALID_ARGUMENT,
             "worker_id must not be empty");
  // Nothing was stored by any refused call.
  EXPECT_EQ(harness_->plane()->rendezvous()->Usage().keys, 0);
}

TEST_F(RendezvousTest, FinishedJobIsRefusedAndLeavesNothing) {
  ASSERT_TRUE(Set(job_, 1, "k", std::string(4096, 'x'), ranks_[0]).ok());
  EXPECT_GT(harness_->plane()->rendezvous()->Usage().bytes, 4096);
  for (const std::string& id : ranks_) Worker(id)->SendExit(0);
  harness_->WaitForState(job_, Job::SUCCEEDED);
  const cluster::RendezvousUsage usage = WaitForEmpty();
  std::printf("after SUCCEEDED: %d open generations, %lld keys, %lld bytes\n",
              usage.open_generations, static_cast<long long>(usage.keys),
              static_cast<long long>(usage.bytes));
  EXPECT_EQ(usage.open_generations, 0);
  EXPECT_EQ(usage.keys, 0);
  EXPECT_EQ(usage.bytes, 0);
  // The job is gone from the store: refused to its former ranks too.
  ExpectCode(Set(job_, 1, "k", "v", ranks_[0]), grpc::StatusCode::FAILED_PRECONDITION,
             "is not running here");
}

TEST_F(RendezvousTest, LimitsAreResourceExhaustedNamingTheLimit) {
  // One value over the per-value limit.
  ExpectCode(
      Set(job_, 1, "big", std::string(cluster::kMaxRendezvousValueBytes + 1, 'v'), ranks_[0]),
      grpc::StatusCode::RESOURCE_EXHAUSTED, "kMaxRendezvousValueBytes");
  // Values of the largest size until the generation's byte limit is reached.
  const std::string mib(cluster::kMaxRendezvousValueBytes, 'm');
  int stored = 0;
  grpc::Status status;
  for (int i = 0; i < 64; ++i) {
    status = Set(job_, 1, absl::StrCat("blob/", i), mib, ranks_[i % 2]);
    if (!status.ok()) break;
    ++stored;
  }
  ExpectCode(status, grpc::StatusCode::RESOURCE_EXHAUSTED, "kMaxRendezvousBytesPerGeneration");
  const cluster::RendezvousUsage usage = harness_->plane()->rendezvous()->Usage();
  std::printf("stored %d values of %zu bytes: %lld bytes held (limit %zu)\n", stored,
              cluster::kMaxRendezvousValueBytes, static_cast<long long>(usage.bytes),
              cluster::kMaxRendezvousBytesPerGeneration);
  EXPECT_LE(usage.bytes, static_cast<int64_t>(cluster::kMaxRendezvousBytesPerGeneration));
  EXPECT_EQ(stored, static_cast<int>(cluster::kMaxRendezvousBytesPerGeneration /
                                     cluster::kMaxRendezvousValueBytes) -
                        1);
  // Overwriting a stored key with a smaller value is fine.
  EXPECT_TRUE(Set(job_, 1, "blob/0", "small", ranks_[0]).ok());
}

TEST_F(RendezvousTest, KeyCountLimit) {
  // Fill up to the limit through the store (16k RPCs would only slow the test), then cross it
  // on the wire.
  cluster::RendezvousStore* store = harness_->plane()->rendezvous();
  v1::RendezvousSetRequest request;
  request.set_job(job_);
  request.set_generation(1);
  for (int i = 0; i < cluster::kMaxRendezvousKeysPerGeneration; ++i) {
    request.set_key(absl::StrCat("k", i));
    ASSERT_TRUE(store->Set(request).ok()) << i;
  }
  ExpectCode(Set(job_, 1, "one-more", "v", ranks_[0]), grpc::StatusCode::RESOURCE_EXHAUSTED,
             "kMaxRendezvousKeysPerGeneration");
  EXPECT_EQ(store->KeyCount(job_, 1), cluster::kMaxRendezvousKeysPerGeneration);
  EXPECT_TRUE(Set(job_, 1, "k0", "overwrite", ranks_[0]).ok()) << "an existing key is not new";
}

TEST_F(RendezvousTest, KeysAreDroppedWhenEachGenerationEnds) {
  // Four generations, each filling the store and then failing (a rank exits retryable): after
  // each ends the store holds nothing, so memory does not grow with generations.
  for (int64_t generation = 1; generation <= 4; ++generation) {
    if (generation > 1) {
      ASSERT_NO_FATAL_FAILURE(WaitForGeneration(generation));
    }
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(Set(job_, generation, absl::StrCat("addr/", i),
                      std::string(256 << 10, static_cast<char>('a' + i)), ranks_[i % 2])
                      .ok());
    }
    const cluster::RendezvousUsage full = harness_->plane()->rendezvous()->Usage();
    EXPECT_EQ(full.keys, 8);
    Worker(ranks_[0])->SendExit(137, "lost a peer");
    const cluster::RendezvousUsage empty = WaitForEmpty();
    std::printf(
        "generation %lld: %lld keys / %lld bytes while running, %lld / %lld after it ended\n",
        static_cast<long long>(generation), static_cast<long long>(full.keys),
        static_cast<long long>(full.bytes), static_cast<long long>(empty.keys),
        static_cast<long long>(empty.bytes));
    EXPECT_EQ(empty.keys, 0);
    EXPECT_EQ(empty.bytes, 0);
    // The ended generation is refused at the store even to its former ranks.
    v1::RendezvousGetRequest late;
    late.set_job(job_);
    late.set_generation(generation);
    late.set_key("addr/0");
    EXPECT_EQ(harness_->plane()->rendezvous()->Get(late).status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

TEST_F(RendezvousTest, BlockedGetFailsWhenItsGenerationEnds) {
  grpc::Status blocked;
  std::thread getter([&] { blocked = Get(job_, 1, "missing", 10000, ranks_[1], nullptr); });
  absl::SleepFor(absl::Milliseconds(300));
  Worker(ranks_[0])->SendExit(137, "lost a peer");
  getter.join();
  ExpectCode(blocked, grpc::StatusCode::FAILED_PRECONDITION, "was dropped while waiting");
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
      {job_, 0, "k", 0, "generation (0) must be >= 1"},
      {job_, 1, "", 0, "key must not be empty"},
      {job_, 1, std::string(2000, 'k'), 0, "key (2000 bytes)"},
      {job_, 1, "k", -1, "timeout_ms (-1)"},
      {job_, 1, "k", cluster::kMaxRendezvousTimeoutMs + 1, "timeout_ms"},
  };
  for (const Case& c : cases) {
    ExpectCode(Get(c.job, c.generation, c.key, c.timeout_ms, ranks_[0], nullptr),
               grpc::StatusCode::INVALID_ARGUMENT, c.needle);
  }
}

TEST_F(RendezvousTest, RequiresTheWorkerToken) {
  ExpectCode(Set(job_, 1, "k", "v", ranks_[0], nullptr), grpc::StatusCode::UNAUTHENTICATED,
             "MISSING_TOKEN");
  ExpectCode(Set(job_, 1, "k", "v", ranks_[0], "wrong-token"), grpc::StatusCode::UNAUTHENTICATED,
             "not a valid worker token");
}

}  // namespace
}  // namespace switchyard::api
