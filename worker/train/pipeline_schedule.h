// File: worker/train/pipeline_schedule.h
//
// The order in which one pipeline stage runs the forward and backward passes of a step's
// micro-batches, as Megatron-Core's schedules.py (megatron_parallel.md, PP/VPP schedules):
//
//   1F1B (VPP = 1, forward_backward_pipelining_without_interleaving): stage s first runs
//   W = min(PP - s - 1, M) warm-up forwards, then M - W times "forward W + i, backward i", then
//   the W remaining backwards. At most W + 1 micro-batches' activations are alive on stage s
//   (PP on the first stage), instead of M with all-forward-then-all-backward.
//
//   Interleaved 1F1B (VPP > 1 model chunks per stage, forward_backward_pipelining_with_
//   interleaving): M * VPP virtual micro-batches k; k's chunk is (k mod (PP * VPP)) / PP
//   (reversed for backwards) and its micro-batch (k / (PP * VPP)) * PP + k mod PP, i.e. the
//   micro-batches go through each chunk in groups of PP (so M must be a multiple of PP, a rule
//   common/config checks). Warm-up = min((PP - s - 1) * 2 + (VPP - 1) * PP, M * VPP), all of them
//   when M == PP.
//
// Communication is the caller's, and its order matters: on Gloo, Communicator::Send does not
// return until the peer has posted the matching Recv (measured: two ranks that both Send 4 KB
// before their Recv time out), so the schedule's "send activation to s + 1, receive gradient
// from s + 1" on stage s against "send gradient to s, receive activation from s" on stage s + 1
// deadlocks if run as two blocking calls each. The pipeline step must pair them (e.g. even stages
// send first, odd stages receive first, or sends on a thread of their own), as Megatron does with
// batched isend/irecv (p2p_communication.py).
//
// Pure arithmetic: no communication. The trainer's pipeline step (Trainer::PipelineMicroBatches)
// runs the ops of this order and pairs each with Megatron's exchanges; pipeline_schedule_test
// checks that every stage's order is executable against the others'.
#ifndef SWITCHYARD_WORKER_TRAIN_PIPELINE_SCHEDULE_H_
#define SWITCHYARD_WORKER_TRAIN_PIPELINE_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace switchyard::train {

struct PipelineOp {
  bool forward = true;  // false: backward
  int64_t micro = 0;    // micro-batch in [0, M)
  int64_t chunk = 0;    // model chunk (virtual stage) in [0, VPP)
  bool operator==(const PipelineOp& o) const {
    return forward == o.forward && micro == o.micro && chunk == o.chunk;
  }
};

// The ops of `stage` (in [0, pp)) for `num_micro` micro-batches and `vpp` chunks per stage (1:
// plain 1F1B). INVALID_ARGUMENT naming the argument and the rule for pp < 1, a stage outside
// [0, pp), vpp < 1, num_micro < pp (both schedules need one micro-batch per stage in flight) or,
// with vpp > 1, num_micro not a multiple of pp.
absl::StatusOr<std::vector<PipelineOp>> PipelineSchedule(int64_t pp, int64_t stage, int64_t vpp,
                                                         int64_t num_micro);

}  // namespace switchyard::train

#endif  // SWITCHYARD_WORKER_TRAIN_PIPELINE_SCHEDULE_H_
