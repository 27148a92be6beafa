// File: worker/train/distributed_optimizer.h
//
// ZeRO-1 AdamW over the data-parallel group (Megatron's DistributedOptimizer, without bucketing):
// every rank keeps the fp32 master weights and the two Adam moments of ONE shard of the flat
// parameter buffer only (1/dp of the optimizer memory), and one Step is
//   (1) ReduceScatter(sum) of the full local gradients: each rank receives the sum over the group
//       of its shard, then multiplies it by grad_scale (default 1/dp: the data-parallel mean,
//       Megatron's default gradient_scaling_factor = 1/size(DP); see "Two instances" below);
//   (2) the global gradient norm: sum of squares of the local shard (kernels::GradSquaredNorm),
//       AllReduce(sum) of that f32 [1] over the group, then kernels::ClipCoefficient (Megatron's
//       clip_coeff = max_norm / (norm + 1e-6), applied when < 1);
//   (3) kernels::AdamW on the local shard only, split into the decay part and the no-decay part
//       when the layout's decay boundary (layout().decay_end) falls inside the shard (at most two
//       launches per rank, as the single-process trainer makes over the whole buffer);
//   (4) AllGather of the updated parameter shards (master rounded to the param dtype) into the
//       full params buffer, so every rank again holds all parameters.
// A step whose norm is NaN/Inf is skipped (nothing is updated, params keep their values), as the
// trainer does; the caller then does not advance its bias-correction step.
//
// Flat layout and padding rule: the model's flat buffers have N = layout().total elements with the
// decay group first ([0, decay_end) with weight decay, [decay_end, N) without). The optimizer
// works on the PADDED length Np = PaddedSize(N, dp) = ceil(N / dp) * dp, so shard r is
// [r * S, (r + 1) * S) with S = Np / dp; only the last shard(s) contain the Np - N < dp padding
// elements, which lie in the no-decay group. Step's grads and params buffers have Np elements:
// the caller allocates the model's flat buffers with Np elements (Megatron pads its grad buffer
// the same way). The padding elements of grads must be ZERO on every rank (they then add nothing
// to the norm, their master stays 0 and their params are written 0).
//
// ReplicatedAdamW is the plain data-parallel reference: AllReduce(sum) of the full gradients,
// times 1/dp, full-buffer norm and clip, two AdamW launches over all N elements, every rank
// holding the full optimizer state. It is here for the equivalence test and as a fallback.
//
// Numerics: the two classes give the same result up to float reduction order. The ReduceScatter
// sums each element over ranks in one order and the AllReduce in another (Gloo: rank order vs
// ring order; NCCL: its own), and the distributed norm adds dp per-shard f32 partial sums where
// the replicated one sums the whole buffer in fp64 then rounds once. Each reduced gradient may
// differ by a few ulp (dp >= 3; for dp = 2 fp32 addition is commutative so they agree) and the
// norm, hence the clip coefficient, by ~1e-7 relative; each parameter's update then moves by
// ~1e-7 of its size: equal within a tight fp32 tolerance (the test: 1e-6), not bitwise. With one
// rank (SingleRankCommunicator) DistributedAdamW is bit-identical to the trainer's path
// (GradSquaredNorm + ClipCoefficient + two AdamW launches over the whole buffer).
//
// Devices: all state lives on `device`. CPU: works with GlooCommunicator (the tested path) and
// SingleRankCommunicator. CUDA: nothing new is needed beyond an NcclCommunicator whose stream is
// the `stream` passed to Step (or synchronised with it): every buffer is already a device buffer,
// the kernels (GradSquaredNorm, ClipCoefficient, AdamW, elementwise Axpby for the 1/dp mean) have
// CUDA paths, and NCCL reduces f32 on the device. The only host synchronisation per Step is the
// 4-byte norm read (to report it and to skip non-finite steps), as in the trainer; collectives
// return once enqueued (communicator.h, "Completion"), so every host read of a device scalar first
// calls the dp group's Synchronize(), which bounds the wait by the group's timeout. Run on H200s by
// //worker/train:distributed_gpu_test (2 and 4 GPUs, NCCL) and every multi-GPU benchmark.
//
// Two instances, one global norm (megatron_moe.md §2.4, §5; Megatron's ChainedOptimizer over the
// dense and the expert DistributedOptimizer): with MoE the dense parameters and the expert
// parameters have one instance each, on different groups and with different gradient scales:
//   dense:  group = DP x CP (ParallelGroup::kDataContext), grad_scale = 1 / size(DP x CP) (the
//           default when the group is DP x CP): the mean over the replicas;
//   expert: group = EDP (ParallelGroup::kExpertData), grad_scale = 1 / size(DP x CP) as well,
//           NOT 1 / size(EDP): expert gradients are summed over EDP and scaled by the dense
//           factor (distributed_data_parallel.py:255-278).
// Clipping uses ONE norm over all parameters, so the step is split in two:
//   sq_d = dense->PrepareStep(stream, dense_grads);   // sum over DP x CP of the shards' squares
//   sq_e = expert->PrepareStep(stream, expert_grads); // sum over EDP: THIS EP rank's experts only
//   total = sq_d + AllReduce(sum, sq_e, over the expert-model-parallel group ETP x EP (x PP))
//   dense->FinishStep(stream, dense_params, total, lr, step, clip);
//   expert->FinishStep(stream, expert_params, total, lr, step, clip);
// Why this is Megatron's global norm: every dense element (replicated over DP x CP) is counted
// exactly once, by its shard owner in the DP x CP group; every expert element is counted exactly
// once, by its shard owner in its EDP group, and the distinct experts of different EP ranks are
// added by the sum over EP (with ETP > 1 or PP > 1 the distinct TP/PP slices are added the same
// way: sq_d over the model-parallel group TP x PP, sq_e over ETP x EP x PP; TP = PP = 1 with
// ETP in {1, 2} is tested, distributed_trainer_etp_test). Do NOT sum sq_e over the world or over
// DP: the EDP replicas of one expert would then be counted EDP times; and do not leave out the EP
// sum: it is what adds the other EP ranks' experts. total must be the same float on every rank
// (sq_d and the EP sum are, since fp32 addition of two values commutes), so that every rank of both
// groups makes the same skip decision. Step = PrepareStep + FinishStep(own squared norm).
//
// Buckets (gradient reduction overlapped with the backward pass, as Megatron's DDP buckets): the
// padded flat range may be split into buckets [b_0 = 0, b_1), [b_1, b_2), ..., [.., Np), each a
// multiple of dp long. Every bucket is sharded on its own: rank r holds chunk r of every bucket,
// and its shard is the concatenation of those chunks (with one bucket this is the contiguous
// shard [r*S, (r+1)*S) described above). ReduceBucket reduce-scatters one bucket as soon as its
// gradients are final (from another thread, on its own communicator and stream: see
// ReduceBucket); PrepareStep reduces only the buckets not reduced yet. AdamW and the final
// all-gather work bucket by bucket (at most two AdamW launches per bucket). GatherFull and
// ScatterFull convert between a shard-shaped state and the full flat layout (checkpoints).
//
// Not thread-safe (except ReduceBucket as stated); one instance per (rank, parameter buffer). Every
// rank of the group calls Step (or PrepareStep then FinishStep) with the same arguments except the
// gradients.
#ifndef SWITCHYARD_WORKER_TRAIN_DISTRIBUTED_OPTIMIZER_H_
#define SWITCHYARD_WORKER_TRAIN_DISTRIBUTED_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "kernels/optim/adamw.h"
#include "kernels/runtime/buffer.h"
#include "worker/comm/communicator.h"

namespace switchyard::train {

// What one optimizer step reports.
struct OptimizerStepResult {
  float grad_norm = 0;   // global L2 norm of the DP-mean gradients, before clipping
  float clip_coef = 1;   // the factor applied to the gradients (1 = not clipped)
  bool skipped = false;  // the norm was NaN/Inf: nothing was updated
};

// ceil(n / dp) * dp: the padded flat length (see the padding rule above). n >= 0, dp >= 1.
int64_t PaddedSize(int64_t n, int dp);

class DistributedAdamW {
 public:
  // dp_group: the data-parallel group (borrowed; outlives this object). device: where the state
  // lives. n: the unpadded flat length N (>= 1). decay_end: in [0, n]. master_init: the FULL fp32
  // master values, f32 with n or PaddedSize(n, dp) elements (padding taken as 0), on any device;
  // this rank copies only its shard. hp: beta1, beta2, eps, weight_decay (its lr and step are
  // ignored: Step takes them). grad_scale: the factor applied to the group-summed gradients
  // (finite, > 0); nullopt = 1 / dp_group->size() (the data-parallel mean; for the expert
  // instance pass 1 / size(DP x CP), see above). Allocates the shard state (4 * S f32 + small
  // scratch).
  // bucket_ends: the end of every bucket, increasing, the last == PaddedSize(n, dp), every bucket
  // a multiple of dp long; empty = one bucket.
  static absl::StatusOr<std::unique_ptr<DistributedAdamW>> Create(
      comm::Communicator* dp_group, Device device, int64_t n, int64_t decay_end,
      const Tensor& master_init, const kernels::AdamWHyperParams& hp,
      std::optional<float> grad_scale = std::nullopt, std::vector<int64_t> bucket_ends = {});

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // The data-parallel group given to Create (ReduceBucket's default group).
  comm::Communicator* dp_group() const { return dp_; }
  // [begin, end) of bucket b in the padded flat buffer.
  std::pair<int64_t, int64_t> bucket_range(int b) const {
    return {buckets_[b].begin, buckets_[b].end};
  }
  // Reduce-scatters bucket b of `grads` (f32 [Np], read only in that range) into this rank's
  // shard of the summed gradients, over `group` (the same ranks as the dp group, in the same
  // order; nullptr = the dp group). May run on another thread than the other calls, while the
  // caller computes, as long as only this thread uses `group` and the bucket's gradients are
  // final; `stream` is the stream `group` runs on. Each bucket at most once per step; PrepareStep
  // then reduces the others. The reduce-scatter may still be running when this returns (NCCL):
  // before another stream reads the shard, `group` must be synchronised (GradReducer::Wait does).
  absl::Status ReduceBucket(const Stream& stream, const Tensor& grads, int b,
                            comm::Communicator* group = nullptr);

  // grads:  f32 [Np] (any shape with Np elements), this rank's full local gradients (padding
  //         elements zero); read only.
  // params: bf16 or f32 [Np]; written: every element, the AllGather of the updated shards.
  // lr >= 0; step >= 1 is the bias-correction count (PyTorch's state.step); clip_grad is the max
  // norm (<= 0: no clipping). All tensors on `stream`'s device == the state's device. Collective:
  // every rank of the group calls it. INVALID_ARGUMENT names the argument and rule.
  absl::StatusOr<OptimizerStepResult> Step(const Stream& stream, const Tensor& grads,
                                           const Tensor& params, double lr, int64_t step,
                                           float clip_grad);

  // First half of Step (collective over the group): ReduceScatter(sum) of grads (as Step's),
  // times grad_scale, then this instance's squared norm: the shard's sum of squares AllReduce'd
  // over the group. Returns it (host float; NaN/Inf when a gradient is). Must be followed by
  // FinishStep before the next PrepareStep.
  absl::StatusOr<float> PrepareStep(const Stream& stream, const Tensor& grads);
  // Second half (collective): norm = sqrt(total_sq_norm), clip coefficient from it, AdamW on the
  // shard, AllGather into params (as Step's). total_sq_norm: the squared norm of ALL parameters
  // that share the clip (see "Two instances" above); must be equal on every rank. A non-finite
  // total skips the step (nothing updated, params untouched). FAILED_PRECONDITION without a
  // preceding PrepareStep (also after a failed or skipped one the prepared gradients are dropped).
  absl::StatusOr<OptimizerStepResult> FinishStep(const Stream& stream, const Tensor& params,
                                                 float total_sq_norm, double lr, int64_t step,
                                                 float clip_grad);

  float grad_scale() const { return grad_scale_; }
  int64_t n() const { return n_; }
  int64_t padded_n() const { return padded_n_; }
  int64_t decay_end() const { return decay_end_; }
  int64_t shard_size() const { return shard_; }
  // First element of this rank's shard in the flat buffer (rank * shard_size()); with one bucket
  // only (FAILED_PRECONDITION-free accessor: -1 with several buckets, use ScatterFull/GatherFull).
  int64_t shard_begin() const { return buckets_.size() == 1 ? shard_ * dp_->rank() : -1; }
  // full (f32 [Np] on any device) -> shard-shaped `shard` (f32 [shard_size()], e.g. one of the
  // state views below): copies this rank's chunk of every bucket. Local, no communication.
  absl::Status ScatterFull(const Tensor& full, const Tensor& shard) const;
  // shard-shaped `shard` -> full (f32 [Np] on the state's device), every rank's chunks:
  // collective (one AllGather per bucket over the dp group), stream-ordered: the host reads
  // `full` only after the dp group's Synchronize().
  absl::Status GatherFull(const Tensor& shard, const Tensor& full) const;
  // Where this rank's shard lies in the padded flat buffer, one run per bucket: elements
  // [begin, begin + length) of the flat buffer are shard elements [shard_offset, +length) (for
  // sharded checkpoints, which save and load only these).
  struct OwnedRun {
    int64_t begin = 0, shard_offset = 0, length = 0;
  };
  std::vector<OwnedRun> OwnedRuns() const;
  // This rank's state, f32 [shard_size()] on the device (for checkpoints and tests).
  Tensor master_shard() const { return master_.View(); }
  Tensor exp_avg_shard() const { return exp_avg_.View(); }
  Tensor exp_avg_sq_shard() const { return exp_avg_sq_.View(); }
  // The reduced, scaled gradients of this rank's shard, f32 [shard_size()] (laid out as
  // OwnedRuns says): valid between PrepareStep and FinishStep (e.g. to take a part of the norm).
  Tensor grad_shard() const { return grad_shard_.View(); }

 private:
  DistributedAdamW() = default;

  struct Bucket {
    int64_t begin = 0, end = 0;  // in the padded flat buffer
    int64_t shard_offset = 0;    // where its chunk starts in the shard
    int64_t chunk() const { return end - begin; }
  };
  int64_t Chunk(const Bucket& b) const { return b.chunk() / dp_->size(); }

  comm::Communicator* dp_ = nullptr;
  Device device_;
  int64_t n_ = 0, padded_n_ = 0, decay_end_ = 0, shard_ = 0;
  kernels::AdamWHyperParams hp_;
  float grad_scale_ = 1;
  std::vector<Bucket> buckets_;
  std::vector<char> reduced_;  // bucket reduced this step (written by ReduceBucket's thread)
  bool prepared_ = false;      // PrepareStep done, FinishStep pending
  kernels::Buffer master_, exp_avg_, exp_avg_sq_;  // f32 [S]
  kernels::Buffer grad_shard_;                     // f32 [S]: reduced, averaged gradients
  kernels::Buffer param_shard_;                    // 4 * S bytes: the updated shard, param dtype
  kernels::Buffer norm_ws_;                        // f64 [kGradNormWorkspace]
  kernels::Buffer sum_sq_, norm_, coef_;           // f32 [1]
};

class ReplicatedAdamW {
 public:
  // As DistributedAdamW::Create, but every rank keeps the full state and there is no padding:
  // master_init is f32 with n elements (or more: the first n are used).
  static absl::StatusOr<std::unique_ptr<ReplicatedAdamW>> Create(
      comm::Communicator* dp_group, Device device, int64_t n, int64_t decay_end,
      const Tensor& master_init, const kernels::AdamWHyperParams& hp);

  // grads: f32 [n]; params: bf16 or f32 [n]. Otherwise as DistributedAdamW::Step.
  absl::StatusOr<OptimizerStepResult> Step(const Stream& stream, const Tensor& grads,
                                           const Tensor& params, double lr, int64_t step,
                                           float clip_grad);

  Tensor master() const { return master_.View(); }

 private:
  ReplicatedAdamW() = default;

  comm::Communicator* dp_ = nullptr;
  Device device_;
  int64_t n_ = 0, decay_end_ = 0;
  kernels::AdamWHyperParams hp_;
  kernels::Buffer master_, exp_avg_, exp_avg_sq_, reduced_;  // f32 [n]
  kernels::Buffer norm_ws_, sum_sq_, norm_, coef_;
};

}  // namespace switchyard::train

#endif  // SWITCHYARD_WORKER_TRAIN_DISTRIBUTED_OPTIMIZER_H_
