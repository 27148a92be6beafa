// File: common/model/engine_support_test.cc
#include "common/model/engine_support.h"

#include <gtest/gtest.h>

namespace switchyard {
namespace {

TEST(EngineSupportTest, DataTensorContextAndExpertParallelismOnly) {
  EXPECT_EQ(UnsupportedByEngine("parallel.", 1, 1, 1, 1), "");
  // Tensor parallelism (with sequence parallelism) runs.
  EXPECT_EQ(UnsupportedByEngine("parallel.", 2, 1, 1, 1), "");
  EXPECT_EQ(UnsupportedByEngine("parallel.", 8, 1, 1, 1), "");
  // Context parallelism runs (worker/model/gpt_model.h).
  EXPECT_EQ(UnsupportedByEngine("assignment.mapping.", 1, 4, 1, 1), "");
  EXPECT_EQ(UnsupportedByEngine("assignment.mapping.", 1, 4, 2, 1),
            "assignment.mapping.pipeline_model_parallel_size (2) must be 1: workers run data, "
            "tensor, context and expert parallelism only");
  // TP and CP fold (CP picks the positions, SP shards them over TP).
  EXPECT_EQ(UnsupportedByEngine("parallel.", 2, 2, 1, 1), "");
  EXPECT_EQ(UnsupportedByEngine("parallel.", 2, 2, 1, 2), "");
  EXPECT_EQ(UnsupportedByEngine("parallel.", 1, 1, 2, 1).rfind("parallel.pipeline_model", 0), 0u);
  // Expert tensor parallelism runs (issue 13 item 2): any ETP is accepted here.
  EXPECT_EQ(UnsupportedByEngine("parallel.", 1, 1, 1, 8), "");
  EXPECT_EQ(UnsupportedByEngine("parallel.", 1, 1, 2, 8).rfind("parallel.pipeline_model", 0), 0u);
  // PP is named whatever else is set.
  EXPECT_EQ(UnsupportedByEngine("", 2, 2, 2, 2).rfind("pipeline_model_parallel_size (2)", 0), 0u);
}

}  // namespace
}  // namespace switchyard
