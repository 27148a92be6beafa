// File: common/model/pipeline_schedule.h
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
//   common/config checks). Warm-up = min((PP - s - 1) * 2 + (VPP - 1) * PP, M * VPP)
//   (get_pp_rank_microbatches at the reference's HEAD: capped at the total, no M == PP special
//   case any more).
//   Virtual stage v·PP + s (chunk v of stage s) holds the v·PP + s-th of the PP·VPP layer chunks
//   (common/model/pipeline_layout.h): activations go from (s, v) to (s + 1, v), and from the last
//   stage's chunk v to the first stage's chunk v + 1; gradients the other way.
//
// Communication is the caller's, and its order matters: on Gloo, Communicator::Send does not
// return until the peer has posted the matching Recv (measured: two ranks that both Send 4 KB
// before their Recv time out), so the schedule's "send activation to s + 1, receive gradient
// from s + 1" on stage s against "send gradient to s, receive activation from s" on stage s + 1
// deadlocks if run as two blocking calls each. The pipeline step must pair them (e.g. even stages
// send first, odd stages receive first, or sends on a thread of their own), as Megatron does with
// batched isend/irecv (p2p_communication.py).
//
// Pure arithmetic: no communication. It lives in common/model because both the worker and the
// planner need it: the trainer runs these orders and sizes its activation slots by
// PipelineAliveMicroBatches, and the memory estimate (model_math.h EstimateEngineMemory) counts
// the same slots and the trainer's message-buffer pool (PipelinePoolBuffers: the interleaved
// step's and evaluation's receives) per stage, so the two agree by construction. The trainer's 1F1B
// step (Trainer::PipelineMicroBatches) runs the ops of this order and pairs each with Megatron's
// exchanges. The interleaved step (Trainer::InterleavedMicroBatches) runs a PipelineProgram
// instead: the same per-stage orders, executed by all stages in lock-step rounds, with the messages
// of each round in one global order that every stage walks (it sends or receives the ones that name
// it). Why: with VPP the stages form a ring (the last stage's chunk v feeds the first stage's chunk
// v + 1), so the even/odd pairing of 1F1B no longer orders the blocking Send/Recv of two neighbours
// that are each other's next and previous stage (PP 2); walking one global order is deadlock-free
// for any PP (the earliest unfinished message always has both its ends waiting on it), on Gloo
// (blocking rendezvous) and NCCL (stream-ordered) alike. pipeline_schedule_test checks that every
// stage's order is executable against the others', and simulates the program's messages as blocking
// rendezvous Send/Recv.
#ifndef SWITCHYARD_COMMON_MODEL_PIPELINE_SCHEDULE_H_
#define SWITCHYARD_COMMON_MODEL_PIPELINE_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace switchyard {

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
// forward_only (evaluation; Megatron's forward_only: every op in warm-up): the forwards only, in
// the same order (micro-batch order with VPP 1, the chunk table's with VPP > 1).
absl::StatusOr<std::vector<PipelineOp>> PipelineSchedule(int64_t pp, int64_t stage, int64_t vpp,
                                                         int64_t num_micro,
                                                         bool forward_only = false);

// One point-to-point message of a PipelineProgram: after the op of virtual stage
// (from, chunk_from) for `micro`, its output activation (forward) or input gradient (backward)
// goes to stage `to`, model chunk `chunk` (the receiver's chunk, the one that consumes it).
struct PipelineMessage {
  bool activation = true;  // false: a gradient (travels to the previous virtual stage)
  int64_t micro = 0;
  int64_t chunk = 0;  // the receiver's chunk
  int64_t from = 0, to = 0;
  // Unique within a step for a (from, to) pair: 2·(micro·VPP + chunk) + (gradient ? 1 : 0).
  uint32_t tag = 0;
  bool operator==(const PipelineMessage& o) const {
    return activation == o.activation && micro == o.micro && chunk == o.chunk && from == o.from &&
           to == o.to && tag == o.tag;
  }
};

// One lock-step round: ops[s] is the op stage s runs in it (has_op[s] false: it waits), then
// `messages` are exchanged, every stage walking them in this order.
struct PipelineRound {
  std::vector<PipelineOp> ops;
  std::vector<bool> has_op;
  std::vector<PipelineMessage> messages;
};

// The whole step of all `pp` stages: each stage runs PipelineSchedule(pp, s, vpp, num_micro) in
// order, an op in the first round in which its inputs arrived in an earlier round's messages (a
// forward: the previous virtual stage's activation, none for virtual stage 0; a backward: the
// next virtual stage's gradient, none for the last virtual stage, whose forward computes the
// loss). Messages of one round: activations first, then gradients, each by sender stage. Errors
// as PipelineSchedule's; INTERNAL if the orders could not finish (never for Megatron's orders).
// forward_only: of PipelineSchedule's forward-only orders (activations only).
absl::StatusOr<std::vector<PipelineRound>> PipelineProgram(int64_t pp, int64_t vpp,
                                                           int64_t num_micro,
                                                           bool forward_only = false);

// The most micro-batches that are alive at once in `ops` (one stage's order): micro-batch m is
// alive from its first forward (chunk 0) to its last backward (chunk 0). Both happen in
// increasing m (Megatron's orders), so the alive ones are always consecutive and m % result
// names a free activation slot (GptModel's in-flight slots).
int64_t MaxAliveMicroBatches(const std::vector<PipelineOp>& ops);

// The most micro-batches alive at once on `stage` (in [0, pp)) with `vpp` chunks per stage and
// `num_micro` micro-batches: MaxAliveMicroBatches(PipelineSchedule(pp, stage, vpp, num_micro)),
// without building the order (pipeline_schedule_test checks that the two agree for every stage of
// PP 1..8, VPP 1..4 and M up to 8·PP). The ONE count of activation slots: the trainer sizes the
// model's in-flight slots by it with VPP > 1 (GptConfig::pipeline_slots; under 1F1B GptModel's
// own default min(PP − rank, M) is the same count) and the memory estimate multiplies a stage's
// per-layer buffers by it (model_math.h EstimateEngineMemory). 1F1B: min(PP − stage, M).
// Interleaved: more, on the last stage too (PP 2·VPP 2·M 8: 4 on stage 0, 3 on stage 1;
// PP 4·VPP 2·M 8: 8, 8, 7, 5), at most 2·PP and M.
// How: number the table's entries k as PipelineSchedule does (1F1B: k = m, one chunk). Among the
// first n entries, started(n) = ⌊n/(PP·VPP)⌋·PP + min(n mod PP·VPP, PP) are chunk-0 forwards and
// finished(n) = ⌊n/(PP·VPP)⌋·PP + max(0, n mod PP·VPP − (VPP − 1)·PP) chunk-0 backwards. With W
// warm-up forwards, forward j >= W runs after backwards 0 .. j − W − 1, so right after it
// started(j + 1) − finished(j − W) micro-batches are alive; warm-up only adds and cool-down only
// frees. Both terms grow by PP every PP·VPP entries, so the maximum over the PP·VPP forwards
// from W (fewer if the step ends first) is the step's; all warm-up (W = M·VPP): M.
// Errors: PipelineSchedule's argument rules, with its messages.
absl::StatusOr<int64_t> PipelineAliveMicroBatches(int64_t pp, int64_t stage, int64_t vpp,
                                                  int64_t num_micro);

// The interleaved step's receive buffers of `stage` (Trainer::InterleavedMicroBatches, VPP > 1):
// the most [t/TP, H] message buffers it holds at once, each held as the trainer holds it: a
// received activation from the round of its message until its forward, a received gradient until
// its backward, and on the last stage the head chunk's input gradient from its forward (which
// takes that buffer before it frees its input) until its backward has sent it (after the round's
// receives). The trainer's pool holds at least this many (PipelinePoolBuffers, allocated at
// Init), beside its two buffers of the 1F1B step (0 for vpp 1: that step uses only those two).
// Computed on PipelineProgram(pp, vpp, min(num_micro, 2·PP)), which keeps the cost independent of
// M: the count is the same for every M >= 2·PP (warm-up and cool-down are alike from there and the
// steady rounds repeat; pipeline_schedule_test checks M up to 10·PP for PP 2..8, VPP 2..4); e.g. PP
// 2·VPP 2: 1 on stage 0, 4 on stage 1; PP 4·VPP 2·M 8: 2, 2, 2, 5. Errors: PipelineSchedule's
// argument rules.
absl::StatusOr<int64_t> PipelineReceiveBuffers(int64_t pp, int64_t stage, int64_t vpp,
                                               int64_t num_micro);
// The same count for `stage` of a training `program` of `vpp` chunks per stage (PipelineProgram's,
// not forward-only), for any number of micro-batches.
int64_t PipelineReceiveBuffers(const std::vector<PipelineRound>& program, int64_t vpp,
                               int64_t stage);

// The forward-only program's receive buffers of `stage` (Trainer::PipelineForwardOnly: evaluation
// at PP > 1, VPP 1 included): the most received activations it holds at once, each from the round
// of its message until its forward. `program` is PipelineProgram(..., forward_only = true)'s.
int64_t PipelineForwardOnlyBuffers(const std::vector<PipelineRound>& program, int64_t stage);

// The ONE count of the trainer's pipeline message-buffer pool of `stage` ([t/TP, H] each, beside
// its two 1F1B buffers): the larger of the training step's PipelineReceiveBuffers and the
// forward-only program's PipelineForwardOnlyBuffers (evaluation runs through the same pool). The
// trainer allocates exactly this many when it is created and never more (taking one more is an
// internal error); the memory estimate counts them (model_math.h EstimateEngineMemory). Computed on
// programs of min(num_micro, 2·PP) micro-batches, like PipelineReceiveBuffers (the forward-only
// count is the same for every M >= 2·PP too: pipeline_schedule_test checks M up to 10·PP); 0 at
// PP 1. E.g. PP 2·VPP 1: 1 on stage 1 (evaluation only), 0 on stage 0.
// Errors: PipelineSchedule's argument rules.
absl::StatusOr<int64_t> PipelinePoolBuffers(int64_t pp, int64_t stage, int64_t vpp,
                                            int64_t num_micro);

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_MODEL_PIPELINE_SCHEDULE_H_
