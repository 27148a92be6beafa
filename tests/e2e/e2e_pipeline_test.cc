// File: tests/e2e/e2e_pipeline_test.cc
//
// A pipeline-parallel job end to end with real processes on loopback: the switchyard-coordinator
// binary plans the job's PP = 2 (the spec fixes it; jobs/resolve_spec.h keeps it), assigns it to
// two switchyard-worker --coordinator agents (CPU, Gloo), which run Megatron's 1F1B schedule
// (stage 0: layers 0-1 and the embedding; stage 1: layers 2-3, the final norm and the tied LM head,
// a copy of the embedding) and save sharded checkpoints at PP 2. The job SUCCEEDS, and its losses
// equal one standalone process training the same spec without PP (within the standalone log's
// 4-decimal rounding).
//
//   e2e_pipeline_test <switchyard-coordinator> <switchyard-worker>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "gtest/gtest.h"
#include "tests/e2e/e2e_cluster.h"
#include "tests/e2e/e2e_util.h"

namespace switchyard::e2e {
namespace {

constexpr int64_t kPipelineIters = 20;

// The e2e spec with 4 layers (MoE, dense, MoE, MoE: two per stage; the embedding and the LM head
// tied, so the last stage's LM head is a copy of the embedding whose gradient the two stages
// sum) and `pp` pipeline stages.
void PipelineSpec(v1::JobSpec& spec, int pp) {
  v1::ModelConfig* m = spec.mutable_model();
  m->set_num_layers(4);
  m->clear_moe_layer_pattern();
  for (int x : {1, 0, 1, 1}) m->add_moe_layer_pattern(x);
  spec.mutable_training()->set_train_iters(kPipelineIters);
  if (pp > 1) spec.mutable_parallel()->set_pipeline_model_parallel_size(pp);
  spec.set_max_workers(2);
}

TEST(E2ePipelineTest, PipelineParallelJobTrainsOnTwoWorkersAndMatchesOneProcess) {
  Cluster c("pipeline");
  ASSERT_NO_FATAL_FAILURE(StartTwoWorkers(c));
  const absl::Time t0 = absl::Now();
  const std::string job =
      c.Submit("pp2-1", /*min_workers=*/2, [](v1::JobSpec& s) { PipelineSpec(s, 2); });
  ASSERT_FALSE(job.empty());
  JobWatcher watch(c.coordinator()->grpc_address(), job);
  const Job::State end = watch.WaitForEnd(180);
  std::printf("%s ended %s after %.2f s\n", job.c_str(), Job::State_Name(end).c_str(), Seconds(t0));
  watch.Print();
  if (end != Job::SUCCEEDED) c.PrintLogs();
  ASSERT_EQ(end, Job::SUCCEEDED);

  const std::vector<SeenEvent> events = watch.Events();
  const v1::JobEvent* starting = FindEvent(events, Job::STARTING, 1);
  ASSERT_NE(starting, nullptr);
  EXPECT_EQ(WorldOf(*starting), 2) << starting->message();
  // The planned (and assigned) mapping is the spec's pipeline: "2 worker(s): TP1 CP1 DP1 PP2 ...".
  EXPECT_TRUE(absl::StrContains(starting->message(), "DP1 PP2")) << starting->message();
  EXPECT_EQ(FindEvent(events, Job::RESTARTING, 1), nullptr);

  const std::vector<SeenStep> steps = watch.Steps();
  ASSERT_GE(steps.size(), 10u);
  EXPECT_EQ(steps.back().metrics.step(), kPipelineIters);

  // The same model trained by one standalone process (no pipeline).
  auto spec = ParseJobSpecYaml(kSpec);
  ASSERT_TRUE(spec.ok()) << spec.status();
  PipelineSpec(*spec, 1);
  ASSERT_NO_FATAL_FAILURE(ExpectSameLossesAsStandalone(*spec, "pipeline", steps, "PP2 job"));
  EXPECT_LT(MeanLoss(steps, steps.size() - 5, steps.size()), MeanLoss(steps, 0, 5));  // it trains
}

}  // namespace
}  // namespace switchyard::e2e
