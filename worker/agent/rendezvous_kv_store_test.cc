// RendezvousKvStore against real gRPC servers on loopback: the test fake
// (testing/fake_coordinator.h) and the coordinator's own RendezvousService
// (coordinator/api/rendezvous_service.h), so the worker's side is checked against the real
// contract: set/get, a waiting Get, DEADLINE_EXCEEDED naming the key, job and generation
// scoping, Check, Cancel releasing a waiting Get, Increment/Count UNIMPLEMENTED, the token, a
// superseded generation -> ABORTED, a coordinator that restarts while a rank waits, and a
// two-rank Gloo world whose rendezvous goes through the coordinator.
#include "worker/agent/rendezvous_kv_store.h"

#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/tensor.h"
#include "coordinator/api/auth.h"
#include "coordinator/api/rendezvous_service.h"
#include "coordinator/api/worker_test_util.h"
#include "gtest/gtest.h"
#include "worker/agent/coordinator_channel.h"
#include "worker/agent/testing/fake_coordinator.h"
#include "worker/comm/gloo_communicator.h"

namespace switchyard::agent {
namespace {

constexpr char kToken[] = "rdzv-token";

// The coordinator's RendezvousService on 127.0.0.1 (`port` 0: any), with the worker token and
// no rank check (no registry): the generations the tests use are open, as the scheduler opens
// them (coordinator/api/rendezvous_service_test.cc checks the rank rule).
class RealRendezvous {
 public:
  explicit RealRendezvous(int port = 0) {
    auth_ = *api::TokenAuth::FromToken(kToken, api::kWorkerRole);
    for (const char* job : {"job-1", "job-2", "job"}) store_.OpenGeneration(job, 1);
    store_.OpenGeneration("gloo-job", 3);
    service_ =
        std::make_unique<api::RendezvousServiceImpl>(&store_, auth_.get(), /*workers=*/nullptr);
    grpc::ServerBuilder b;
    b.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
  }
  ~RealRendezvous() { server_->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int port() const { return port_; }
  cluster::RendezvousStore& store() { return store_; }

 private:
  cluster::RendezvousStore store_;
  std::unique_ptr<api::TokenAuth> auth_;
  std::unique_ptr<api::RendezvousServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

std::unique_ptr<RendezvousKvStore> Store(const std::string& address, const std::string& token,
                                         const std::string& job, int64_t generation) {
  auto channel = MakeCoordinatorChannel(address, "");
  EXPECT_TRUE(channel.ok()) << channel.status();
  auto store = RendezvousKvStore::Create(*channel, token, address, job, generation);
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(*store);
}

// The KvStore contract, on either server.
void CheckContract(const std::string& address, const char* which) {
  SCOPED_TRACE(which);
  auto g1 = Store(address, kToken, "job-1", 1);
  ASSERT_TRUE(g1->Set("addr/0", std::string("1.2.3.4:5\0x", 11)).ok());
  auto v = g1->Get("addr/0", absl::Seconds(1));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, std::string("1.2.3.4:5\0x", 11)) << "bytes kept, NUL included";
  EXPECT_TRUE(*g1->Check("addr/0"));
  EXPECT_FALSE(*g1->Check("addr/1"));

  // A waiting Get returns when another rank sets the key (longer than one 500 ms slice).
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(800));
    auto other = Store(address, kToken, "job-1", 1);
    EXPECT_TRUE(other->Set("late", "here").ok());
  });
  const absl::Time t0 = absl::Now();
  v = g1->Get("late", absl::Seconds(10));
  const double waited = absl::ToDoubleMilliseconds(absl::Now() - t0);
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "here");
  std::printf("[%s] waiting Get returned after %.0f ms (key set at 800 ms)\n", which, waited);
  EXPECT_GE(waited, 700);
  EXPECT_LT(waited, 3000);

  // Absent: DEADLINE_EXCEEDED naming the key, after about the timeout.
  const absl::Time t1 = absl::Now();
  v = g1->Get("never", absl::Milliseconds(700));
  const double timed_out = absl::ToDoubleMilliseconds(absl::Now() - t1);
  std::printf("[%s] absent key: %s after %.0f ms\n", which, v.status().ToString().c_str(),
              timed_out);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(v.status().message(), "'never'")) << v.status();
  EXPECT_TRUE(absl::StrContains(v.status().message(), "job job-1, generation 1")) << v.status();
  EXPECT_GE(timed_out, 650);
  EXPECT_LT(timed_out, 3000);

  // Another job does not see job-1's keys.
  auto other_job = Store(address, kToken, "job-2", 1);
  EXPECT_FALSE(*other_job->Check("addr/0"));

  // Counters: not offered by the service.
  EXPECT_EQ(g1->Increment("c").status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(g1->Count("c").status().code(), absl::StatusCode::kUnimplemented);

  // Cancel releases a waiting Get within a slice.
  auto waiting = Store(address, kToken, "job-1", 1);
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(300));
    waiting->Cancel();
  });
  const absl::Time t2 = absl::Now();
  v = waiting->Get("never", absl::Seconds(30));
  const double cancelled = absl::ToDoubleMilliseconds(absl::Now() - t2);
  canceller.join();
  std::printf("[%s] Cancel: %s after %.0f ms\n", which, v.status().ToString().c_str(), cancelled);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kCancelled);
  EXPECT_LT(cancelled, 2000);
  EXPECT_EQ(waiting->Set("k", "v").code(), absl::StatusCode::kCancelled);

  // The token.
  auto no_token = Store(address, "", "job-1", 1);
  absl::Status st = no_token->Set("k", "v");
  std::printf("[%s] no token: %s\n", which, st.ToString().c_str());
  EXPECT_EQ(st.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(absl::StrContains(st.message(), "'k'")) << st;
  EXPECT_EQ(Store(address, "wrong", "job-1", 1)->Get("addr/0", absl::Seconds(1)).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(RendezvousKvStoreTest, ContractOnTheFakeCoordinator) {
  testing::FakeCoordinator fake(kToken);
  CheckContract(fake.address(), "fake");
}

TEST(RendezvousKvStoreTest, ContractOnTheCoordinatorsService) {
  RealRendezvous real;
  CheckContract(real.address(), "coordinator");
}

TEST(RendezvousKvStoreTest, SupersededGenerationIsAborted) {
  RealRendezvous real;
  auto g1 = Store(real.address(), kToken, "job", 1);
  ASSERT_TRUE(g1->Set("k", "v1").ok());
  // A rank of generation 1 waits while the scheduler starts generation 2.
  std::thread drop([&] {
    absl::SleepFor(absl::Milliseconds(300));
    real.store().OpenGeneration("job", 2);
  });
  absl::StatusOr<std::string> v = g1->Get("never", absl::Seconds(10));
  drop.join();
  std::printf("waiting Get of generation 1 when 2 starts: %s\n", v.status().ToString().c_str());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kAborted) << "retryable for the rank";
  EXPECT_EQ(g1->Set("k", "v").code(), absl::StatusCode::kAborted);
  auto g2 = Store(real.address(), kToken, "job", 2);
  EXPECT_FALSE(*g2->Check("k")) << "generation 1's keys are gone";
}

TEST(RendezvousKvStoreTest, NotARankIsAbortedNamingTheWorker) {
  // The coordinator's service with a real registry (no worker attached): this worker is not a
  // rank of the running generation.
  auto harness = api::testing::Harness::Start("rdzv_not_a_rank.db");
  ASSERT_NE(harness, nullptr);
  harness->plane()->rendezvous()->OpenGeneration("job", 1);
  const std::string address = harness->address();
  auto channel = MakeCoordinatorChannel(address, "");
  ASSERT_TRUE(channel.ok()) << channel.status();
  RendezvousKvStore::Options options;
  options.worker_id = "stray-worker";
  auto store =
      RendezvousKvStore::Create(*channel, api::testing::kWorkerToken, address, "job", 1, options);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::Status set = (*store)->Set("k", "v");
  std::printf("Set by a worker that is not a rank: %s\n", set.ToString().c_str());
  EXPECT_EQ(set.code(), absl::StatusCode::kAborted) << "retryable for the worker";
  EXPECT_TRUE(absl::StrContains(set.message(), "worker 'stray-worker' is not attached")) << set;
  EXPECT_EQ(harness->plane()->rendezvous()->KeyCount("job", 1), 0);
}

TEST(RendezvousKvStoreTest, SurvivesACoordinatorRestartWhileWaiting) {
  auto first = std::make_unique<RealRendezvous>();
  const int port = first->port();
  auto store = Store(first->address(), kToken, "job", 1);
  absl::StatusOr<std::string> v;
  std::thread waiter([&] { v = store->Get("peer", absl::Seconds(20)); });
  absl::SleepFor(absl::Milliseconds(700));
  first.reset();  // the coordinator goes away
  absl::SleepFor(absl::Milliseconds(700));
  RealRendezvous second(port);  // and comes back on the same port
  ASSERT_EQ(second.port(), port);
  auto peer = Store(second.address(), kToken, "job", 1);
  const absl::Time set_at = absl::Now();
  ASSERT_TRUE(peer->Set("peer", "10.0.0.2:7000").ok());
  waiter.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "10.0.0.2:7000");
  std::printf("Get across a coordinator restart returned %.0f ms after the Set\n",
              absl::ToDoubleMilliseconds(absl::Now() - set_at));
}

TEST(RendezvousKvStoreTest, GlooWorldRendezvousesThroughTheCoordinator) {
  RealRendezvous real;
  constexpr int kWorld = 2;
  float data[kWorld] = {1.5f, 2.25f};
  absl::Status results[kWorld];
  std::thread ranks[kWorld];
  for (int r = 0; r < kWorld; ++r) {
    ranks[r] = std::thread([&, r] {
      std::shared_ptr<comm::KvStore> store = Store(real.address(), kToken, "gloo-job", 3);
      comm::GlooOptions options;
      options.timeout = absl::Seconds(20);
      auto comm = comm::GlooCommunicator::Create(store, r, kWorld, options);
      if (!comm.ok()) {
        results[r] = comm.status();
        return;
      }
      Tensor t(DType::kF32, {1}, Device::Cpu(), &data[r]);
      results[r] = (*comm)->AllReduce(t, t, comm::ReduceOp::kSum);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
    EXPECT_EQ(data[r], 3.75f);
  }
  std::printf("Gloo world of %d over the coordinator's rendezvous: %d keys, all-reduce = %g\n",
              kWorld, real.store().KeyCount("gloo-job", 3), data[0]);
}

TEST(RendezvousKvStoreTest, CreateChecksItsArguments) {
  auto channel = *MakeCoordinatorChannel("127.0.0.1:1", "");
  EXPECT_EQ(RendezvousKvStore::Create(nullptr, "", "a", "j", 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RendezvousKvStore::Create(channel, "", "a", "", 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status st = RendezvousKvStore::Create(channel, "", "a", "j", 0).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "generation")) << st;
  EXPECT_EQ(MakeCoordinatorChannel("", "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeCoordinatorChannel("127.0.0.1:1", "/no/such/cert.pem").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace switchyard::agent
