// File: coordinator/planner/batch_plan_test.cc
//
// PlanMicroBatch (batch_plan.h) on a small MoE model on one GPU: the candidates (every divisor of
// the global batch x the recompute variants), the step-time terms that make the choice (the
// experts' rows per GEMM and the recompute re-runs, cost_model.h) against hand-computed values,
// the choice (the fastest that fits; recompute traded for a larger micro-batch when memory is
// short), and the errors. Notation as cost_model.h.
#include "coordinator/planner/batch_plan.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/model/model_math.h"
#include "coordinator/planner/cost_model.h"
#include "gtest/gtest.h"

namespace switchyard::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// L = 2 (both MoE), H = 1024, 8 heads (D = 128), V = 32768, S = 1024, E = 8, top-2, Fe = 1024,
// global batch 8 sequences; one GPU of `gib` GiB at 1e14 FLOP/s.
v1::PlanRequest OneGpuRequest(double gib) {
  v1::PlanRequest req;
  v1::JobSpec* spec = req.mutable_spec();
  v1::ModelConfig* m = spec->mutable_model();
  m->set_num_layers(2);
  m->set_hidden_size(1024);
  m->set_num_attention_heads(8);
  m->set_ffn_hidden_size(4096);
  m->set_vocab_size(32768);
  m->set_seq_length(1024);
  m->set_num_experts(8);
  m->set_moe_router_topk(2);
  m->set_moe_ffn_hidden_size(1024);
  spec->mutable_training()->set_train_iters(10);
  spec->mutable_training()->set_micro_batch_size(2);
  spec->mutable_training()->set_global_batch_size(8);
  spec->mutable_data()->set_mock_data(true);
  spec->mutable_parallel()->set_world_size(1);
  v1::Cluster* c = req.mutable_cluster();
  c->set_num_gpus(1);
  c->set_gpus_per_node(1);
  c->set_gpu_memory_bytes(gib * kGiB);
  c->set_intra_node_bandwidth_bytes_per_second(1e11);
  c->set_inter_node_bandwidth_bytes_per_second(1e10);
  c->set_peak_flops(1e14);
  return req;
}

void PrintPlan(const BatchPlan& plan) {
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    const BatchCandidate& c = plan.candidates[i];
    std::printf("  %-36s %8.3f GiB %10.4f ms %12.0f tokens/s %s%s\n", BatchCandidateName(c).c_str(),
                c.memory.total() / kGiB, c.time.total() * 1e3, c.tokens_per_second,
                c.fits ? "fits" : "does not fit", i == plan.best ? "  <- chosen" : "");
  }
}

const BatchCandidate& Find(const BatchPlan& plan, int64_t mbs, size_t modules) {
  for (const BatchCandidate& c : plan.candidates) {
    if (c.micro_batch_size == mbs && c.recompute_modules.size() == modules) return c;
  }
  ADD_FAILURE() << "no candidate mbs " << mbs << " with " << modules << " modules";
  return plan.candidates.front();
}

TEST(BatchPlanTest, CandidatesAndTheirTimesByHand) {
  auto plan = PlanMicroBatch(OneGpuRequest(1000));
  ASSERT_TRUE(plan.ok()) << plan.status();
  PrintPlan(*plan);
  // Divisors of 8 (DP 1): 1, 2, 4, 8, each with none, moe_act, moe_act+layernorm.
  ASSERT_EQ(plan->candidates.size(), 12u);
  for (const BatchCandidate& c : plan->candidates) {
    EXPECT_TRUE(c.rule_violations.empty()) << BatchCandidateName(c) << ": " << c.rule_violations;
    EXPECT_TRUE(c.fits) << BatchCandidateName(c);
    EXPECT_EQ(c.mapping.micro_batch_size() * c.mapping.num_micro_batches(), 8);
  }
  // FLOPs/token (planner_test case A): 339,836,928; the experts' 3 * 2 * 2*2*3*1024*1024 =
  // 75,497,472 count 128 / r extra, r = t * k 2 / E 8 = 256 * mbs rows per expert. compute =
  // F * 8 * 1024 / (1e14 * 0.5); no communication at W = 1.
  //   mbs 1: + 37,748,736 -> 377,585,664 -> 0.0618636144...; mbs 8: + 4,718,592 -> 344,555,520.
  for (int64_t mbs : {1, 2, 4, 8}) {
    const double flops = 339836928.0 + 75497472.0 * 128 / (256.0 * mbs);
    const double compute = flops * 8 * 1024 / (1e14 * 0.5);
    const BatchCandidate& none = Find(*plan, mbs, 0);
    EXPECT_NEAR(none.time.compute(), compute, 1e-12 * compute) << "mbs " << mbs;
    EXPECT_DOUBLE_EQ(none.time.total(), none.time.compute());
    EXPECT_NEAR(none.tokens_per_second, 8 * 1024 / compute, 1e-9 * 8 * 1024 / compute);
    // moe_act: the SwiGLU again, 3 * 2 bytes * t * k * Fe per MoE layer and micro-batch (t =
    // 1024 * mbs, 8 / mbs micro-batches): 2 layers * 6 * 8192 * 2 * 1024 = 201,326,592 bytes per
    // step whatever mbs, at 1e14 / 295 bytes/s = 0.00059391344640 s.
    // layernorm: 2 RMSNorms of t x H read and written per layer, 2 * 2*2*2 * 8192 * 1024 =
    // 134,217,728 bytes per step -> 0.0003959422976 s more.
    const BatchCandidate& act = Find(*plan, mbs, 1);
    const BatchCandidate& act_ln = Find(*plan, mbs, 2);
    EXPECT_NEAR(act.time.compute() - none.time.compute(), 0.0005939134464, 1e-15) << mbs;
    EXPECT_NEAR(act_ln.time.compute() - act.time.compute(), 0.0003959422976, 1e-15) << mbs;
    // Recompute saves memory: moe_act keeps one [R, Fe] SwiGLU scratch instead of two layers'
    // (R = t * k); layernorm one [t, H] norm scratch instead of 2 per layer.
    const double a = 2, t = 1024.0 * mbs, rows = t * 2;
    EXPECT_DOUBLE_EQ(none.memory.total() - act.memory.total(), a * rows * 1024);
    EXPECT_DOUBLE_EQ(act.memory.total() - act_ln.memory.total(), a * t * 1024 * (2 * 2 - 1));
  }
  // Everything fits: the fastest is the largest micro-batch without recompute.
  EXPECT_EQ(BatchCandidateName(plan->candidates[plan->best]), "mbs 8, recompute none");
  EXPECT_NEAR(plan->memory_limit, 0.9 * 1000 * kGiB, 1);
}

// With memory between mbs 8 with moe_act (fits) and mbs 8 without recompute (does not), the plan
// trades the recompute's re-run for the larger micro-batch's faster expert GEMMs, because the
// estimate says that is faster than mbs 4 without recompute (checked first); with less memory it
// falls back to mbs 4.
TEST(BatchPlanTest, TradesRecomputeForALargerMicroBatchWhenMemoryIsShort) {
  auto all = PlanMicroBatch(OneGpuRequest(1000));
  ASSERT_TRUE(all.ok()) << all.status();
  const BatchCandidate& none8 = Find(*all, 8, 0);
  const BatchCandidate& act8 = Find(*all, 8, 1);
  const BatchCandidate& none4 = Find(*all, 4, 0);
  ASSERT_GT(act8.tokens_per_second, none4.tokens_per_second);
  ASSERT_LT(act8.memory.total(), none8.memory.total());
  // The device memory whose 90 % lies halfway between the two mbs-8 estimates.
  const double gib = (act8.memory.total() + none8.memory.total()) / 2 / 0.9 / kGiB;
  auto plan = PlanMicroBatch(OneGpuRequest(gib));
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::printf("device %.4f GiB (limit %.4f GiB):\n", gib, plan->memory_limit / kGiB);
  PrintPlan(*plan);
  EXPECT_EQ(BatchCandidateName(plan->candidates[plan->best]), "mbs 8, recompute moe_act");
  EXPECT_FALSE(Find(*plan, 8, 0).fits);

  // Below every mbs-8 estimate but above mbs 4 without recompute: mbs 4, no recompute (the mbs-4
  // recompute variants are slower and, here, not needed).
  const BatchCandidate& act_ln8 = Find(*all, 8, 2);
  ASSERT_LT(none4.memory.total(), act_ln8.memory.total());
  const double gib4 = (none4.memory.total() + act_ln8.memory.total()) / 2 / 0.9 / kGiB;
  auto plan4 = PlanMicroBatch(OneGpuRequest(gib4));
  ASSERT_TRUE(plan4.ok()) << plan4.status();
  std::printf("device %.4f GiB:\n", gib4);
  PrintPlan(*plan4);
  EXPECT_EQ(BatchCandidateName(plan4->candidates[plan4->best]), "mbs 4, recompute none");
}

TEST(BatchPlanTest, DenseModelKeepsItsRecomputeSetting) {
  v1::PlanRequest req = OneGpuRequest(1000);
  req.mutable_spec()->mutable_model()->clear_num_experts();
  req.mutable_spec()->mutable_model()->clear_moe_router_topk();
  req.mutable_spec()->mutable_model()->clear_moe_ffn_hidden_size();
  auto plan = PlanMicroBatch(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  PrintPlan(*plan);
  EXPECT_EQ(plan->candidates.size(), 4u);
  // No expert term: the compute is the same at every micro-batch, and the tie goes to the
  // smaller memory, the smallest micro-batch.
  EXPECT_EQ(BatchCandidateName(plan->candidates[plan->best]), "mbs 1, recompute none");
}

TEST(BatchPlanTest, Errors) {
  v1::PlanRequest req = OneGpuRequest(80);
  req.mutable_spec()->mutable_training()->clear_global_batch_size();
  auto plan = PlanMicroBatch(req);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(plan.status().message(), "training.global_batch_size"))
      << plan.status();

  plan = PlanMicroBatch(OneGpuRequest(80), BatchPlanOptions{1.0});
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(plan.status().message(), "headroom")) << plan.status();

  plan = PlanMicroBatch(OneGpuRequest(0.5));
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
  std::printf("0.5 GiB: %s\n", plan.status().ToString().c_str());
  EXPECT_TRUE(absl::StrContains(plan.status().message(), "no micro-batch fits in 0.45 GiB"))
      << plan.status();
  EXPECT_TRUE(absl::StrContains(plan.status().message(), "mbs 1, recompute moe_act+layernorm"))
      << plan.status();

  v1::PlanRequest bad_cluster = OneGpuRequest(80);
  bad_cluster.mutable_cluster()->set_peak_flops(0);
  EXPECT_EQ(PlanMicroBatch(bad_cluster).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace switchyard::planner
