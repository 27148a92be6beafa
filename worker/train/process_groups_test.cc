// File: worker/train/process_groups_test.cc
//
// The pipeline role of ProcessGroups over real Gloo groups in forked processes: at PP > 1 each
// rank's `pp` communicator holds exactly the stages of its model replica (ParallelLayout's
// kPipeline group, rank order tp-cp-ep-dp-pp, megatron_moe.md §5), its group rank is the stage,
// and an activation sent stage s -> s + 1 and its gradient sent back s + 1 -> s arrive intact
// (what the pipeline schedule will do with Send/Recv). At PP = 1 the group is the rank alone.
// ProcessGroups::Synchronize skips the gradient-reduction groups.
#include "worker/train/process_groups.h"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/model/parallel_state.h"
#include "common/tensor.h"
#include "gtest/gtest.h"
#include "worker/comm/testing/forked_ranks.h"
#include "worker/train/testing/gloo_groups.h"

namespace switchyard::train {
namespace {

namespace ct = ::switchyard::comm::testing;

Tensor View(std::vector<float>& v) {
  return Tensor(DType::kF32, {static_cast<int64_t>(v.size())}, Device::Cpu(), v.data());
}

// A payload no other (rank, micro-batch, direction) produces.
float Payload(int world_rank, int micro, int i, bool gradient) {
  return (gradient ? -1.0f : 1.0f) * (1000.0f * world_rank + 10.0f * micro + 0.5f * i);
}

int PipelineBody(int rank, const std::string& dir, const ParallelDims& dims) {
  auto groups = test_groups::JoinGlooGroups(dir, rank, dims);
  SY_CHILD_OK(groups.status());
  ProcessGroups& g = **groups;
  SY_CHILD_CHECK(g.pp != nullptr);
  const std::vector<int> members = g.layout.Group(ParallelGroup::kPipeline, rank);
  const int pp = g.layout.pp();
  SY_CHILD_CHECK(static_cast<int>(members.size()) == pp);
  SY_CHILD_CHECK(g.pp->size() == pp);
  const int stage = g.layout.RankInGroup(ParallelGroup::kPipeline, rank);
  SY_CHILD_CHECK(g.pp->rank() == stage);
  SY_CHILD_CHECK(members[stage] == rank);
  if (pp > 1) {
    // Stages of one replica never share a data-parallel or tensor group.
    SY_CHILD_CHECK(g.pp != g.data && g.pp != g.tp && g.pp != g.world);
  }
  // Two micro-batches down the pipeline and their gradients back up, as 1F1B will.
  constexpr int kElems = 37;
  for (int micro = 0; micro < 2; ++micro) {
    std::vector<float> act(kElems);
    if (stage > 0) {
      std::vector<float> got(kElems, std::nanf(""));
      SY_CHILD_OK(g.pp->Recv(View(got), stage - 1, /*tag=*/micro));
      for (int i = 0; i < kElems; ++i) {
        SY_CHILD_CHECK(got[i] == Payload(members[stage - 1], micro, i, false));
      }
    }
    if (stage + 1 < pp) {
      for (int i = 0; i < kElems; ++i) act[i] = Payload(rank, micro, i, false);
      SY_CHILD_OK(g.pp->Send(View(act), stage + 1, /*tag=*/micro));
    }
  }
  for (int micro = 0; micro < 2; ++micro) {
    std::vector<float> grad(kElems);
    if (stage + 1 < pp) {
      std::vector<float> got(kElems, std::nanf(""));
      SY_CHILD_OK(g.pp->Recv(View(got), stage + 1, /*tag=*/100 + micro));
      for (int i = 0; i < kElems; ++i) {
        SY_CHILD_CHECK(got[i] == Payload(members[stage + 1], micro, i, true));
      }
    }
    if (stage > 0) {
      for (int i = 0; i < kElems; ++i) grad[i] = Payload(rank, micro, i, true);
      SY_CHILD_OK(g.pp->Send(View(grad), stage - 1, /*tag=*/100 + micro));
    }
  }
  SY_CHILD_OK(g.world->Barrier());
  // ProcessGroups::Synchronize covers the compute thread's groups only: the GradReducer thread's
  // grad_* groups are its Wait()'s business, so aborting them (no rank uses them here) leaves it
  // OK, while the same abort makes those groups' own Synchronize() report ABORTED.
  SY_CHILD_OK(g.Synchronize());
  g.grad_data->Abort();
  g.grad_expert_data->Abort();
  SY_CHILD_CHECK(g.grad_data->Synchronize().code() == absl::StatusCode::kAborted);
  SY_CHILD_OK(g.Synchronize());
  return 0;
}

void RunLayout(const char* name, const ParallelDims& dims) {
  const std::string dir = ct::UniqueStoreDir(name);
  const std::vector<int> codes =
      ct::RunProcesses(static_cast<int>(dims.world_size), absl::Seconds(120),
                       [&](int rank) { return PipelineBody(rank, dir, dims); });
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << name << " rank " << r;
}

TEST(ProcessGroupsTest, PipelineTwoStagesWithDataAndExpertParallel) {
  ParallelDims dims;  // PP 2 x DP 2, EP 2: stages {0, 2} and {1, 3}
  dims.world_size = 4;
  dims.pipeline_model_parallel_size = 2;
  dims.expert_model_parallel_size = 2;
  RunLayout("pp2_dp2", dims);
}

TEST(ProcessGroupsTest, PipelineFourStagesWithTensorParallel) {
  ParallelDims dims;  // TP 2 x PP 4
  dims.world_size = 8;
  dims.tensor_model_parallel_size = 2;
  dims.pipeline_model_parallel_size = 4;
  RunLayout("tp2_pp4", dims);
}

TEST(ProcessGroupsTest, NoPipelineIsTheRankAlone) {
  ParallelDims dims;
  dims.world_size = 2;
  dims.expert_model_parallel_size = 2;
  RunLayout("pp1", dims);
}

}  // namespace
}  // namespace switchyard::train
