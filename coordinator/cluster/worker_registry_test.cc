// File: coordinator/cluster/worker_registry_test.cc
//
// WorkerRegistry over a real SQLite file: registration rules, state mirrored in the store's
// workers table, LOST after the heartbeat timeout (monitor thread), rows of a previous process.
#include "coordinator/cluster/worker_registry.h"

#include <atomic>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/api/worker_test_util.h"
#include "gtest/gtest.h"

namespace switchyard::cluster {
namespace {

v1::Registration Reg(const std::string& id, const std::string& host = "host-a") {
  v1::Registration r;
  r.set_worker_id(id);
  r.set_host(host);
  r.set_version("v1");
  return r;
}

std::unique_ptr<store::Store> OpenStore(const std::string& path) {
  auto store = store::Store::Open(path);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

TEST(WorkerRegistryTest, RejectsBadOptionsAndRegistrations) {
  auto store = OpenStore(api::testing::FreshPath("registry_bad.db"));
  WorkerRegistryOptions bad;
  bad.heartbeat_timeout = absl::ZeroDuration();
  auto r = WorkerRegistry::Create(store.get(), bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("heartbeat_timeout"), std::string::npos);

  auto registry = WorkerRegistry::Create(store.get(), {});
  ASSERT_TRUE(registry.ok());
  struct Case {
    v1::Registration reg;
    std::string needle;
  };
  const Case cases[] = {
      {Reg(""), "registration.worker_id must not be empty"},
      {Reg(std::string(300, 'x')), "registration.worker_id (300 bytes)"},
      {Reg("w", ""), "registration.host must not be empty"},
  };
  for (const Case& c : cases) {
    auto result = (*registry)->Register(c.reg);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(result.status().message().find(c.needle), std::string::npos) << result.status();
    std::printf("INVALID_ARGUMENT: %s\n", std::string(result.status().message()).c_str());
  }
  EXPECT_EQ(store->ListWorkers()->size(), 0u) << "a refused registration wrote a row";
  EXPECT_EQ((*registry)->Touch("unknown", 0).code(), absl::StatusCode::kNotFound);
}

TEST(WorkerRegistryTest, MirrorsStateIntoTheStore) {
  auto store = OpenStore(api::testing::FreshPath("registry_mirror.db"));
  auto registry = WorkerRegistry::Create(store.get(), {});
  ASSERT_TRUE(registry.ok());
  WorkerRegistry& reg = **registry;
  v1::Registration with_gpu = Reg("gpu-0", "node-1");
  with_gpu.mutable_gpu()->set_name("H100");
  with_gpu.mutable_gpu()->set_memory_bytes(80LL << 30);
  ASSERT_TRUE(reg.Register(with_gpu).ok());
  ASSERT_TRUE(reg.Register(Reg("cpu-0", "node-2")).ok());

  auto row = store->GetWorker("gpu-0");
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->state, store::WorkerState::kIdle);
  ASSERT_TRUE(row->gpu.has_value());
  EXPECT_EQ(row->gpu->name(), "H100");
  EXPECT_FALSE(store->GetWorker("cpu-0")->gpu.has_value());

  ASSERT_TRUE(reg.SetBusy("gpu-0", "jobs/7", 3, 1).ok());
  row = store->GetWorker("gpu-0");
  EXPECT_EQ(row->state, store::WorkerState::kAssigned);
  EXPECT_EQ(row->job, "jobs/7");
  auto info = reg.Get("gpu-0");
  EXPECT_EQ(info->generation, 3);
  EXPECT_EQ(info->rank, 1);
  EXPECT_EQ(reg.Idle().size(), 1u);

  ASSERT_TRUE(reg.SetIdle("gpu-0").ok());
  EXPECT_EQ(store->GetWorker("gpu-0")->state, store::WorkerState::kIdle);
  EXPECT_EQ(store->GetWorker("gpu-0")->job, "");

  EXPECT_TRUE(reg.MarkLost("cpu-0", "test"));
  EXPECT_FALSE(reg.MarkLost("cpu-0", "again")) << "already LOST";
  EXPECT_EQ(store->GetWorker("cpu-0")->state, store::WorkerState::kLost);
  EXPECT_EQ(reg.SetBusy("cpu-0", "jobs/1", 1, 0).code(), absl::StatusCode::kFailedPrecondition);
  // Registering again revives it as IDLE and reports what was known.
  auto again = reg.Register(Reg("cpu-0", "node-2"));
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(again->before.has_value());
  EXPECT_EQ(again->before->state, WorkerState::kLost);
  EXPECT_EQ(reg.Get("cpu-0")->state, WorkerState::kIdle);
  // Idle() orders by host then id.
  auto idle = reg.Idle();
  ASSERT_EQ(idle.size(), 2u);
  EXPECT_EQ(idle[0].host, "node-1");
}

TEST(WorkerRegistryTest, MonitorMarksSilentWorkersLost) {
  auto store = OpenStore(api::testing::FreshPath("registry_monitor.db"));
  WorkerRegistryOptions options;
  options.heartbeat_timeout = absl::Milliseconds(400);
  options.monitor_interval = absl::Milliseconds(50);
  std::atomic<int> lost{0};
  std::string lost_id;
  absl::Mutex mu;
  options.on_lost = [&](const WorkerInfo& w, const std::string& why) {
    absl::MutexLock lock(&mu);
    lost_id = w.id;
    ++lost;
    std::printf("on_lost(%s): %s\n", w.id.c_str(), why.c_str());
  };
  auto registry = WorkerRegistry::Create(store.get(), options);
  ASSERT_TRUE(registry.ok());
  ASSERT_TRUE((*registry)->Register(Reg("talks")).ok());
  ASSERT_TRUE((*registry)->Register(Reg("silent")).ok());
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Milliseconds(1200)) {
    ASSERT_TRUE((*registry)->Touch("talks", 0).ok());
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(lost.load(), 1);
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(lost_id, "silent");
  }
  EXPECT_EQ((*registry)->Get("talks")->state, WorkerState::kIdle);
  EXPECT_GE((*registry)->Get("talks")->heartbeats, 10);
  EXPECT_EQ(store->GetWorker("silent")->state, store::WorkerState::kLost);
}

TEST(WorkerRegistryTest, RowsOfAPreviousProcessAreLostAndRemembered) {
  const std::string path = api::testing::FreshPath("registry_previous.db");
  {
    auto store = OpenStore(path);
    auto registry = WorkerRegistry::Create(store.get(), {});
    ASSERT_TRUE(registry.ok());
    ASSERT_TRUE((*registry)->Register(Reg("a")).ok());
    ASSERT_TRUE((*registry)->Register(Reg("b")).ok());
    ASSERT_TRUE((*registry)->SetBusy("a", "jobs/3", 2, 0).ok());
  }
  auto store = OpenStore(path);
  auto registry = WorkerRegistry::Create(store.get(), {});
  ASSERT_TRUE(registry.ok());
  EXPECT_EQ(store->GetWorker("a")->state, store::WorkerState::kLost);
  EXPECT_EQ(store->GetWorker("b")->state, store::WorkerState::kLost);
  auto previous = (*registry)->PreviousAssignments();
  ASSERT_EQ(previous.size(), 1u);
  EXPECT_EQ(previous["jobs/3"], std::vector<std::string>{"a"});
  auto registered = (*registry)->Register(Reg("a"));
  ASSERT_TRUE(registered.ok());
  ASSERT_TRUE(registered->previous.has_value());
  EXPECT_EQ(registered->previous->job, "jobs/3");
  EXPECT_FALSE(registered->before.has_value());
}

}  // namespace
}  // namespace switchyard::cluster
