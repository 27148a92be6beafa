// File: common/model/engine_support_test.cc
#include "common/model/engine_support.h"

#include <gtest/gtest.h>

namespace switchyard {
namespace {

TEST(EngineSupportTest, EveryParallelSizeRuns) {
  EXPECT_EQ(UnsupportedByEngine("parallel.", 1, 1, 1, 1, 1), "");
  // Tensor parallelism (with sequence parallelism) runs.
  EXPECT_EQ(UnsupportedByEngine("parallel.", 2, 1, 1, 1, 1), "");
  EXPECT_EQ(UnsupportedByEngine("parallel.", 8, 1, 1, 1, 1), "");
  // Context parallelism runs (worker/model/gpt_model.h).
  EXPECT_EQ(UnsupportedByEngine("assignment.mapping.", 1, 4, 1, 1, 1), "");
  // Pipeline parallelism runs (1F1B, worker/train/trainer.h), folded with everything else.
  EXPECT_EQ(UnsupportedByEngine("assignment.mapping.", 1, 4, 2, 1, 1), "");
  EXPECT_EQ(UnsupportedByEngine("parallel.", 1, 1, 4, 1, 1), "");
  // TP and CP fold (CP picks the positions, SP shards them over TP).
  EXPECT_EQ(UnsupportedByEngine("parallel.", 2, 2, 1, 1, 1), "");
  EXPECT_EQ(UnsupportedByEngine("parallel.", 2, 2, 1, 2, 1), "");
  // Expert tensor parallelism runs (issue 13 item 2): any ETP is accepted here.
  EXPECT_EQ(UnsupportedByEngine("parallel.", 1, 1, 1, 8, 1), "");
  EXPECT_EQ(UnsupportedByEngine("parallel.", 2, 2, 2, 2, 1), "");
  // Virtual pipeline stages run (the interleaved 1F1B schedule), folded with everything else.
  EXPECT_EQ(UnsupportedByEngine("parallel.", 1, 1, 2, 1, 2), "");
  EXPECT_EQ(UnsupportedByEngine("", 2, 2, 2, 2, 4), "");
}

TEST(EngineSupportTest, JobSpecNamesTheFieldUnderThePrefix) {
  v1::JobSpec spec;
  EXPECT_EQ(UnsupportedJobSpec("", spec), "");  // unset sizes count as 1
  spec.mutable_parallel()->set_pipeline_model_parallel_size(2);
  EXPECT_EQ(UnsupportedJobSpec("", spec), "");  // tied embeddings run at PP 2
  // global_aux_loss too (one running count per layer across the pipeline slots).
  spec.mutable_model()->set_num_experts(4);
  spec.mutable_model()->add_moe_router_load_balancing_type("global_aux_loss");
  EXPECT_EQ(UnsupportedJobSpec("", spec), "");
  // Evaluation at PP > 1 runs (the forward-only pipeline schedule), with VPP too.
  spec.mutable_training()->set_eval_interval(10);
  EXPECT_EQ(UnsupportedJobSpec("", spec), "");
  spec.mutable_parallel()->set_virtual_pipeline_model_parallel_size(2);
  EXPECT_EQ(UnsupportedJobSpec("assignment.spec.", spec), "");
}

}  // namespace
}  // namespace switchyard
