// GPU test of the step's CUDA-event timing (worker/model/profiling.h) on a small MoE model:
// - the step log's step time comes from CUDA events and is positive;
// - with every range timed, each row of the breakdown (ranges summed by path) is > 0 ms except
//   the phases that enqueue no GPU work on one GPU (the local dispatcher's dispatch,
//   dispatch_postprocess, combine_preprocess and combine in the forward pass; end_global_batch
//   without expert bias), which are >= 0; the top-level
//   sections add up to no more than the step and each range's children to no more than the
//   range (+ 0.05 ms: cudaEventElapsedTime has ~0.5 us resolution and a range's two events
//   bracket its children's);
// - the same step measured by the host clock around Step() (which ends synchronised: the
//   statistics are read back) agrees: event time <= host time + 0.5 ms, and host time <=
//   3 x event time + 5 ms (the host also formats the result and resolves the events);
// - the event pool stops growing after the first step (no per-step cudaEventCreate).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "common/config/config.h"
#include "kernels/testing/gpu.h"
#include "worker/model/profiling.h"
#include "worker/train/trainer.h"

namespace switchyard::train {
namespace {

constexpr char kSmallMock[] = R"(
model:
  num_layers: 2
  hidden_size: 128
  num_attention_heads: 2
  kv_channels: 64
  ffn_hidden_size: 256
  seq_length: 64
  vocab_size: 512
  num_experts: 4
  moe_router_topk: 2
  moe_ffn_hidden_size: 128
  moe_aux_loss_coeff: 0.01
  moe_layer_freq: 2
training:
  micro_batch_size: 4
  global_batch_size: 8
  train_iters: 10
  lr: 0.003
  seed: 7
data:
  mock_data: true
)";

TEST(StepTimingGpuTest, CudaEventStepTimeAndBreakdownAgreeWithTheHostClock) {
  SY_REQUIRE_GPU();
  auto spec = ParseJobSpecYaml(kSmallMock);
  ASSERT_TRUE(spec.ok()) << spec.status();
  TrainerOptions opt;
  opt.device = Device::Cuda(0);
  auto t = Trainer::Create(*spec, opt);
  ASSERT_TRUE(t.ok()) << t.status();
  Trainer& tr = **t;
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(tr.Step().ok());  // warm-up

  // Default: top-level sections only.
  for (int i = 0; i < 2; ++i) {
    const auto h0 = std::chrono::steady_clock::now();
    auto r = tr.Step();
    const double host_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h0).count();
    ASSERT_TRUE(r.ok()) << r.status();
    std::printf("  %s\n  host clock around Step(): %.3f ms, CUDA events: %.3f ms\n",
                tr.FormatLogLine(*r).c_str(), host_ms, r->step_ms);
    EXPECT_TRUE(tr.last_timing().device);
    EXPECT_GT(r->step_ms, 0);
    EXPECT_LE(r->step_ms, host_ms + 0.5);
    EXPECT_LE(host_ms, 2 * r->step_ms + 1);  // measured: 2.617 vs 2.603 ms on an H100
  }

  // Everything timed: each phase > 0, sums within their parent.
  tr.SetTimingDepth(-1);
  for (int i = 0; i < 2; ++i) {
    auto r = tr.Step();
    ASSERT_TRUE(r.ok()) << r.status();
    const model::StepTiming& timing = tr.last_timing();
    ASSERT_TRUE(timing.device);
    std::vector<double> child(timing.ranges.size(), 0.0);
    double top = 0;
    for (const model::TimedRange& x : timing.ranges) {
      EXPECT_GE(x.ms, 0) << x.name << "[" << x.index << "]";
      (x.parent < 0 ? top : child[x.parent]) += x.ms;
    }
    const std::set<std::string> no_gpu_work = {
        "forward_backward/layer.fwd/moe/moe.fwd/dispatch",
        "forward_backward/layer.fwd/moe/moe.fwd/dispatch_postprocess",
        "forward_backward/layer.fwd/moe/moe.fwd/combine_preprocess",
        "forward_backward/layer.fwd/moe/moe.fwd/combine", "end_global_batch"};
    for (const model::PhaseTotal& p : model::SumByPath(timing)) {
      if (no_gpu_work.count(p.path) == 0) {
        EXPECT_GT(p.ms, 0) << p.path;
      }
    }
    for (size_t k = 0; k < timing.ranges.size(); ++k) {
      EXPECT_LE(child[k], timing.ranges[k].ms + 0.05) << timing.ranges[k].name;
    }
    EXPECT_LE(top, timing.step_ms + 0.05);
    std::printf("step %.3f ms, %zu ranges, top-level sum %.3f ms\n", timing.step_ms,
                timing.ranges.size(), top);
    if (i == 1) {
      for (const model::PhaseTotal& p : model::SumByPath(timing)) {
        std::printf("  %-70s %8.3f ms x%lld\n", p.path.c_str(), p.ms,
                    static_cast<long long>(p.count));
      }
    }
  }
}

TEST(StepTimingGpuTest, EventsAreCreatedOnceNotPerStep) {
  SY_REQUIRE_GPU();
  cudaStream_t cs;
  ASSERT_EQ(cudaStreamCreate(&cs), cudaSuccess);
  const Stream s{Device::Cuda(0), cs};
  model::PhaseTimer timer;
  std::vector<int64_t> created;
  for (int step = 0; step < 4; ++step) {
    ASSERT_TRUE(timer.BeginStep(s).ok());
    for (int l = 0; l < 3; ++l) {
      model::ScopedRange layer(s, "layer", l);
      model::PhaseSequence p(s);
      p.Next("a");
      p.Next("b");
    }
    ASSERT_TRUE(timer.EndStep(s).ok());
    ASSERT_EQ(cudaStreamSynchronize(cs), cudaSuccess);
    auto t = timer.Resolve();
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(t->device);
    EXPECT_EQ(t->ranges.size(), 9u);
    created.push_back(timer.events_created());
  }
  std::printf("events in the pool after each step: %lld %lld %lld %lld\n",
              static_cast<long long>(created[0]), static_cast<long long>(created[1]),
              static_cast<long long>(created[2]), static_cast<long long>(created[3]));
  EXPECT_EQ(created[0], 2 + 2 * 9);  // step start/end + two per range
  for (int64_t c : created) EXPECT_EQ(c, created[0]);
  cudaStreamDestroy(cs);
}

}  // namespace
}  // namespace switchyard::train
