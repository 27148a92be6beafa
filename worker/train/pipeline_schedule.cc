// File: worker/train/pipeline_schedule.cc
//
// Megatron-Core's 1F1B and interleaved 1F1B op orders (see the header).
#include "worker/train/pipeline_schedule.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace switchyard::train {
namespace {

// Virtual micro-batch k of the interleaved schedule (schedules.py get_model_chunk_id and
// get_microbatch_id_in_model_chunk with microbatch_group_size_per_vp_stage = PP).
PipelineOp Virtual(int64_t k, bool forward, int64_t pp, int64_t vpp) {
  PipelineOp op;
  op.forward = forward;
  const int64_t in_group = k % (pp * vpp);
  op.chunk = in_group / pp;
  if (!forward) op.chunk = vpp - op.chunk - 1;
  op.micro = (k / (pp * vpp)) * pp + k % pp;
  return op;
}

}  // namespace

absl::StatusOr<std::vector<PipelineOp>> PipelineSchedule(int64_t pp, int64_t stage, int64_t vpp,
                                                         int64_t num_micro) {
  if (pp < 1) return absl::InvalidArgumentError(absl::StrCat("pp (", pp, ") must be at least 1"));
  if (stage < 0 || stage >= pp) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage (", stage, ") must be in [0, pp ", pp, ")"));
  }
  if (vpp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("vpp (", vpp, ") must be at least 1"));
  }
  if (num_micro < pp) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_micro (", num_micro, ") must be at least pp (", pp,
                     "): the pipeline schedule needs one micro-batch per stage in flight"));
  }
  if (vpp > 1 && num_micro % pp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_micro (", num_micro, ") must be a multiple of pp (", pp, ") with vpp (",
                     vpp, ") > 1: the interleaved schedule runs groups of pp"));
  }
  std::vector<PipelineOp> ops;
  if (vpp == 1) {
    const int64_t warmup = std::min(pp - stage - 1, num_micro);
    for (int64_t i = 0; i < warmup; ++i) ops.push_back({true, i, 0});
    for (int64_t i = 0; i < num_micro - warmup; ++i) {
      ops.push_back({true, warmup + i, 0});
      ops.push_back({false, i, 0});
    }
    for (int64_t i = num_micro - warmup; i < num_micro; ++i) ops.push_back({false, i, 0});
    return ops;
  }
  const int64_t total = num_micro * vpp;
  int64_t warmup = (pp - stage - 1) * 2 + (vpp - 1) * pp;
  if (num_micro == pp) warmup = total;  // schedules.py: all warm-up
  warmup = std::min(warmup, total);
  for (int64_t k = 0; k < warmup; ++k) ops.push_back(Virtual(k, true, pp, vpp));
  for (int64_t k = 0; k < total - warmup; ++k) {
    ops.push_back(Virtual(warmup + k, true, pp, vpp));
    ops.push_back(Virtual(k, false, pp, vpp));
  }
  for (int64_t k = total - warmup; k < total; ++k) ops.push_back(Virtual(k, false, pp, vpp));
  return ops;
}

}  // namespace switchyard::train
