// CPU tests of the training step's ranges and timing (worker/model/profiling.h): one step of a
// tiny MoE model emits the expected NVTX ranges in the expected nesting (a recording hook sees
// every push and pop), the step log's step time is the timer's, the top-level sections add up
// to no more than the step and nested ranges to no more than their parent. On the CPU the
// timer uses the host clock; step_timing_gpu_test checks the CUDA-event path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "common/config/config.h"
#include "worker/model/profiling.h"
#include "worker/train/trainer.h"

namespace switchyard::train {
namespace {

constexpr char kTinyMock[] = R"(
model:
  num_layers: 2
  hidden_size: 32
  num_attention_heads: 4
  num_query_groups: 2
  ffn_hidden_size: 48
  seq_length: 16
  vocab_size: 64
  num_experts: 4
  moe_router_topk: 2
  moe_ffn_hidden_size: 24
  moe_shared_expert_intermediate_size: 16
  moe_aux_loss_coeff: 0.01
  moe_layer_freq: 2
training:
  micro_batch_size: 2
  global_batch_size: 4
  train_iters: 4
  lr: 0.003
  seed: 7
data:
  mock_data: true
)";

// Rebuilds the range tree from the pushes and pops: one line per range, "  " per depth.
class TreeRecorder : public model::RangeRecorder {
 public:
  void OnPush(const char* name, int64_t index) override {
    lines.push_back(std::string(2 * depth, ' ') + name +
                    (index >= 0 ? "[" + std::to_string(index) + "]" : ""));
    ++depth;
  }
  void OnPop() override { --depth; }
  std::vector<std::string> lines;
  int depth = 0;
};

bool Contains(const std::vector<std::string>& lines, const std::string& line) {
  for (const std::string& l : lines) {
    if (l == line) return true;
  }
  return false;
}

TEST(StepTimingTest, OneStepEmitsTheNestedRangesAndTheyArePopped) {
  auto spec = ParseJobSpecYaml(kTinyMock);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto t = Trainer::Create(*spec, TrainerOptions());
  ASSERT_TRUE(t.ok()) << t.status();
  TreeRecorder rec;
  model::RangeRecorder* prev = model::SetRangeRecorderForTesting(&rec);
  auto r = (*t)->Step();
  model::SetRangeRecorderForTesting(prev);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const std::string& l : rec.lines) std::printf("  %s\n", l.c_str());
  EXPECT_EQ(rec.depth, 0) << "every range pushed is popped";
  // moe_layer_freq 2: layer 0 is MoE (with the shared expert), layer 1 dense; 2 micro-batches.
  for (const char* line : {"zero_grads",
                           "data[0]",
                           "forward_backward[0]",
                           "data[1]",
                           "forward_backward[1]",
                           "  embedding.fwd",
                           "  layer.fwd[0]",
                           "    norm_qkv_rope",
                           "    attention",
                           "    oproj_residual_norm",
                           "    mlp",
                           "  layer.fwd[1]",
                           "    moe",
                           "      moe.fwd",
                           "        router_gemm",
                           "        route",
                           "        aux_loss",
                           "        dispatch_preprocess",
                           "        dispatch",
                           "        dispatch_postprocess",
                           "        fc1",
                           "        swiglu",
                           "        fc2",
                           "        combine_preprocess",
                           "        combine",
                           "        combine_postprocess",
                           "        shared_join_add",
                           "  final_norm.fwd",
                           "  lm_head_loss",
                           "  final_norm.bwd",
                           "  layer.bwd[1]",
                           "      post_norm",
                           "      oproj",
                           "      rope_qk_norm",
                           "      qkv_wgrad",
                           "      qkv_dgrad",
                           "      input_norm",
                           "      moe.bwd",
                           "        fc2_dgrad",
                           "        fc1_wgrad",
                           "        route_aux",
                           "  layer.bwd[0]",
                           "  embedding.bwd",
                           "optimizer",
                           "  grad_norm",
                           "  adamw",
                           "end_global_batch",
                           "step_stats"}) {
    EXPECT_TRUE(Contains(rec.lines, line)) << "missing range line \"" << line << "\"";
  }
  // The exact nesting of micro-batch 0's forward pass (a contiguous block of the tree).
  const std::vector<std::string> forward = {"forward_backward[0]",
                                            "  embedding.fwd",
                                            "  layer.fwd[0]",
                                            "    norm_qkv_rope",
                                            "    attention",
                                            "    oproj_residual_norm",
                                            "    moe",
                                            "      moe.fwd",
                                            "        router_gemm",
                                            "        route",
                                            "        aux_loss",
                                            "        dispatch_preprocess",
                                            "        dispatch",
                                            "        dispatch_postprocess",
                                            "        fc1",
                                            "        swiglu",
                                            "        fc2",
                                            "        combine_preprocess",
                                            "        combine",
                                            "        combine_postprocess",
                                            "        shared_join_add",
                                            "  layer.fwd[1]",
                                            "    norm_qkv_rope",
                                            "    attention",
                                            "    oproj_residual_norm",
                                            "    mlp",
                                            "  final_norm.fwd",
                                            "  lm_head_loss"};
  const auto at = std::find(rec.lines.begin(), rec.lines.end(), forward[0]);
  ASSERT_NE(at, rec.lines.end());
  ASSERT_GE(rec.lines.end() - at, static_cast<std::ptrdiff_t>(forward.size()));
  EXPECT_EQ(std::vector<std::string>(at, at + forward.size()), forward);
  // Order at the top level.
  std::vector<std::string> top;
  for (const std::string& l : rec.lines) {
    if (l[0] != ' ') top.push_back(l);
  }
  const std::vector<std::string> want = {
      "zero_grads",          "data[0]",   "forward_backward[0]", "data[1]",
      "forward_backward[1]", "optimizer", "end_global_batch",    "step_stats"};
  EXPECT_EQ(top, want);
}

TEST(StepTimingTest, SectionsAddUpToNoMoreThanTheStepAndTheLogUsesTheTimer) {
  auto spec = ParseJobSpecYaml(kTinyMock);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto t = Trainer::Create(*spec, TrainerOptions());
  ASSERT_TRUE(t.ok()) << t.status();
  Trainer& tr = **t;
  for (int depth : {0, -1}) {
    tr.SetTimingDepth(depth);
    auto r = tr.Step();
    ASSERT_TRUE(r.ok()) << r.status();
    const model::StepTiming& timing = tr.last_timing();
    EXPECT_FALSE(timing.device);
    EXPECT_EQ(r->step_ms, timing.step_ms);  // the step log's ms is the timer's
    EXPECT_GT(r->step_ms, 0);
    std::vector<double> child(timing.ranges.size(), 0.0);
    double top = 0;
    int max_depth = 0;
    for (const model::TimedRange& x : timing.ranges) {
      max_depth = std::max(max_depth, x.depth);
      (x.parent < 0 ? top : child[x.parent]) += x.ms;
    }
    for (size_t i = 0; i < timing.ranges.size(); ++i) {
      EXPECT_LE(child[i], timing.ranges[i].ms) << timing.ranges[i].name;
    }
    std::printf("depth limit %d: %zu ranges (deepest %d), top-level sum %.3f ms <= step %.3f ms\n",
                depth, timing.ranges.size(), max_depth, top, timing.step_ms);
    EXPECT_LE(top, timing.step_ms);
    if (depth == 0) {
      EXPECT_EQ(max_depth, 0);
      EXPECT_EQ(timing.ranges.size(), 8u);  // the eight top-level sections of a 2-micro step
    } else {
      EXPECT_GE(max_depth, 4);  // forward_backward > layer.fwd > moe > moe.fwd > phases
    }
    std::string log = tr.FormatLogLine(*r);
    std::printf("  %s\n", log.c_str());
  }
}

}  // namespace
}  // namespace switchyard::train
