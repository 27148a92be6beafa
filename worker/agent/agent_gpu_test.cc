// The agent on GPUs (gpu-tagged; skips without one): one agent per visible GPU (at most 2),
// threads of this process, against the fake coordinator: registration carries the GPU (name,
// uuid, memory, compute capability), a job of world N (EP = N, NCCL groups made through the
// coordinator's rendezvous, bf16) trains 6 steps to WorkerExit(0) with finite losses, MFU > 0 in
// every StepReport, the same loss on every rank, and /metrics shows switchyard_worker_mfu; a Stop
// mid-run ends it with 143 within stop_report_after (NCCL's Abort unblocks the collective).
// Not run on the build machine (no GPU); written for the GPU bundle.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "kernels/testing/gpu.h"
#include "worker/agent/agent.h"
#include "worker/agent/testing/fake_coordinator.h"
#include "worker/agent/testing/running_agent.h"
#include "worker/train/testing/tiny_moe_spec.h"

namespace switchyard::agent {
namespace {

using testing::RunningAgent;
using testing::StartRunningAgent;
using testing::TmpDir;

using Workers = std::map<std::string, testing::WorkerRecord>;

const std::string kSpec =
    switchyard::test_specs::TinyMoeSpecYaml(0, /*jitter=*/false, /*kv_channels=*/64);

v1::CoordinatorMessage Assign(const std::string& job, int rank, int world, int64_t iters,
                              const std::string& address) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(kSpec);
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->mutable_training()->set_train_iters(iters);
  if (world > 1) spec->mutable_parallel()->set_expert_model_parallel_size(world);
  v1::CoordinatorMessage m;
  v1::Assignment* a = m.mutable_assignment();
  a->set_job(job);
  a->set_generation(1);
  a->set_rank(rank);
  a->set_world_size(world);
  *a->mutable_spec() = *spec;
  a->mutable_mapping()->set_expert_model_parallel_size(world);
  a->set_rendezvous_address(address);
  return m;
}

TEST(AgentGpuTest, TrainsOnEveryVisibleGpuAndStops) {
  SY_REQUIRE_GPU();
  std::string why;
  const int gpus = std::min(2, ::switchyard::testing::CudaDeviceCount(&why));
  testing::FakeCoordinator fake("");
  std::vector<std::unique_ptr<RunningAgent>> agents;
  for (int i = 0; i < gpus; ++i) {
    AgentOptions o;
    o.coordinator = fake.address();
    o.roots = testing::TestRoots();
    o.device = absl::StrCat("cuda:", i);
    o.worker_id = absl::StrCat("gpu-", i);
    o.heartbeat_interval = absl::Milliseconds(100);
    o.metrics_port = i == 0 ? 0 : -1;
    o.metrics_bind_address = "127.0.0.1";
    o.comm_timeout = absl::Seconds(60);
    agents.push_back(StartRunningAgent(o));
    ASSERT_NE(agents.back(), nullptr);
  }
  ASSERT_TRUE(fake.WaitUntil([&](const Workers& ws) { return ws.size() == size_t(gpus); },
                             absl::Seconds(30)));
  for (const auto& [id, w] : fake.Workers()) {
    const v1::GpuInfo& g = w.registration.gpu();
    std::printf("%s: %s %s, %.1f GiB, sm_%d%d\n", id.c_str(), g.name().c_str(), g.uuid().c_str(),
                g.memory_bytes() / 1073741824.0, g.compute_capability_major(),
                g.compute_capability_minor());
    EXPECT_TRUE(w.registration.has_gpu());
    EXPECT_FALSE(g.name().empty());
    EXPECT_TRUE(absl::StartsWith(g.uuid(), "GPU-")) << g.uuid();
    EXPECT_GT(g.memory_bytes(), 0);
    EXPECT_GE(g.compute_capability_major(), 8);
  }

  // A job of world `gpus` to completion.
  for (int r = 0; r < gpus; ++r) {
    ASSERT_TRUE(fake.Send(absl::StrCat("gpu-", r), Assign("gpu-job", r, gpus, 6, fake.address())));
  }
  v1::CoordinatorMessage start;
  start.mutable_start();
  for (int r = 0; r < gpus; ++r) ASSERT_TRUE(fake.Send(absl::StrCat("gpu-", r), start));
  ASSERT_TRUE(fake.WaitUntil(
      [&](const Workers& ws) {
        for (int r = 0; r < gpus; ++r) {
          if (ws.at(absl::StrCat("gpu-", r)).exits.empty()) return false;
        }
        return true;
      },
      absl::Seconds(300)));
  const Workers ws = fake.Workers();
  for (int r = 0; r < gpus; ++r) {
    const testing::WorkerRecord& w = ws.at(absl::StrCat("gpu-", r));
    std::printf("rank %d: exit %d (%s), %zu steps\n", r, w.exits[0].exit_code(),
                w.exits[0].message().c_str(), w.steps.size());
    EXPECT_EQ(w.exits[0].exit_code(), 0) << w.exits[0].message();
    ASSERT_EQ(w.steps.size(), 6u);
    for (size_t i = 0; i < w.steps.size(); ++i) {
      const v1::StepMetrics& m = w.steps[i].metrics();
      if (r == 0) {
        std::printf("  step %lld loss %.4f %.2f ms %.4f TFLOP/s MFU %.5f%%\n",
                    static_cast<long long>(m.step()), m.loss(), m.step_ms(), m.tflops(),
                    100 * m.mfu());
      }
      EXPECT_TRUE(std::isfinite(m.loss()));
      EXPECT_GT(m.mfu(), 0);
      EXPECT_EQ(m.loss(), ws.at("gpu-0").steps[i].metrics().loss()) << "all-reduced loss";
    }
  }
  httplib::Client client("127.0.0.1", agents[0]->agent->metrics_port());
  httplib::Result res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_TRUE(absl::StrContains(res->body, "\nswitchyard_worker_mfu ")) << res->body;

  // A long job, stopped mid-run.
  for (int r = 0; r < gpus; ++r) {
    v1::CoordinatorMessage a = Assign("gpu-long", r, gpus, 1000000, fake.address());
    a.mutable_assignment()->set_generation(2);
    ASSERT_TRUE(fake.Send(absl::StrCat("gpu-", r), a));
  }
  for (int r = 0; r < gpus; ++r) ASSERT_TRUE(fake.Send(absl::StrCat("gpu-", r), start));
  ASSERT_TRUE(fake.WaitUntil([](const Workers& w) { return w.at("gpu-0").steps.size() >= 10; },
                             absl::Seconds(300)));
  v1::CoordinatorMessage stop;
  stop.mutable_stop()->set_reason("gpu test");
  const absl::Time t0 = absl::Now();
  for (int r = 0; r < gpus; ++r) ASSERT_TRUE(fake.Send(absl::StrCat("gpu-", r), stop));
  ASSERT_TRUE(fake.WaitUntil(
      [&](const Workers& w) {
        for (int r = 0; r < gpus; ++r) {
          if (w.at(absl::StrCat("gpu-", r)).exits.size() < 2) return false;
        }
        return true;
      },
      absl::Seconds(30)));
  std::printf("stop: all ranks reported after %.0f ms\n",
              absl::ToDoubleMilliseconds(absl::Now() - t0));
  for (int r = 0; r < gpus; ++r) {
    const v1::WorkerExit e = fake.Workers().at(absl::StrCat("gpu-", r)).exits[1];
    std::printf("rank %d: exit %d (%s)\n", r, e.exit_code(), e.message().c_str());
    EXPECT_EQ(e.exit_code(), 143);
  }
  for (auto& a : agents) {
    a->Stop();
    EXPECT_TRUE(a->result.ok()) << a->result;
  }
}

}  // namespace
}  // namespace switchyard::agent
