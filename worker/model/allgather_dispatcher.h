// File: worker/model/allgather_dispatcher.h
//
// The `allgather` token dispatcher of megatron_moe.md §3.3 (MoEAllGatherTokenDispatcher), for
// expert (and expert-tensor) parallelism over the spec's ETP×EP group, dropless. Experts are
// sharded in blocks: global expert e lives on EP rank e / L, L = E / EP local experts, local index
// e % L. The group is ETP-fastest (group rank = ep_rank · ETP + etp_rank, ParallelGroup::
// kExpertTensorExpert); with ETP = 1 it is the EP group. With ETP > 1 the ETP peers of one EP rank
// receive the same expert inputs and each runs its slice of the experts' F (fc1 columns, fc2 rows,
// worker/model/moe_layer.h); the combine's reduce-scatter over ETP×EP then sums the ETP partial
// outputs as well as the EP ranks' contributions, exactly as Megatron's single RS over the tp-ep
// group. Below, "rank" and "EP" mean the ETP×EP group.
//
// Phases (TokenDispatcher, dispatcher.h), per micro-batch of T local tokens:
//   DispatchPreprocess   Checks the inputs (nothing to permute before the gather).
//   Dispatch      [comm] AllGather of T over EP -> T_j per rank; AllGatherV of x, topk_idx and
//                        topk_probs -> the global batch [T' = sum T_j] in rank order.
//   DispatchPostprocess  Keeps the slots routed to this rank's experts (others become -1, ids
//                        become local), then Permute over the L local experts -> state.expert_x /
//                        expert_probs / tokens_per_expert.
//   CombinePreprocess    Unpermute into the global batch [T', H]: per token, the sum of its slots
//                        on THIS rank's experts (zeros for tokens with none).
//   Combine       [comm] ReduceScatter (sum) over EP: each rank gets its own tokens' rows. Uneven
//                        T_j are handled by laying the global batch out padded, T_max rows per
//                        rank (padding rows are zero), since ReduceScatter takes equal chunks.
//   CombinePostprocess   Copies the first T rows of the reduced [T_max, H] chunk to `out`.
// Inside each local expert, rows come in ascending GLOBAL token order: exactly what
// LocalDispatcher gives on the concatenated batch (tested, bit for bit). Probabilities travel
// with the rows and are applied by the experts (as in LocalDispatcher).
//
// Numerics: a token whose k slots land on several ranks is summed in two stages (Unpermute's
// slot-order sum per rank, then the reduce-scatter across ranks), so `out` and `dx` can differ
// from LocalDispatcher on the same tokens by rounding (a few ulps); d_topk_probs is exact at
// ETP = 1 (each slot has exactly one owner, the other ranks contribute 0; with ETP > 1 it is the
// sum of the owner's ETP partials). EP = ETP = 1 is bit-identical to LocalDispatcher.
//
// Deliberate differences from Megatron:
// - Megatron gathers a dense routing map [T', E] and probs [T', E]; here the sparse topk_idx /
//   topk_probs [T', k] are gathered (k <= E elements per token instead of 2E).
// - Megatron casts y to the probs dtype for the reduce-scatter; here it is reduced in the
//   activation dtype (identical for f32; for bf16 the cross-rank sum is rounded to bf16 per step).
// - The expert-side buffers have a STATIC capacity R = EP * max_tokens * k rows (Permute's dropless
//   contract for the global batch); rows past sum(tokens_per_expert) are unspecified. Megatron
//   sizes them dynamically (host sync on tokens_per_expert).
// - Uneven token counts per rank are supported (AllGatherV + padded reduce-scatter); Megatron's
//   all-gather needs equal T on every rank.
// - No drop-and-pad, no router padding for FP8.
//
// Host synchronisation: the gathered sizes T_j must be known on the host (they size the AllGatherV
// and the padded reduce-scatter).
//   CPU:  the counts are host memory and are read directly.
//   CUDA: T goes to the device with one cudaMemcpyAsync from pinned memory, the AllGather of the
//         counts runs on the device (NCCL), then ONE cudaMemcpyAsync of the [EP] gathered counts
//         into pinned host memory, an event recorded after it and one bounded wait for it
//         (comm::WaitEvent: the EP group's Synchronize, then the event). That is the only host
//         sync of the micro-batch; the backward reuses the sizes. The
//         local-expert filter of topk_idx is a small kernel (allgather_dispatcher.cu); the padded
//         layout of the reduce-scatter is one cudaMemcpyAsync + one cudaMemsetAsync per rank.
//
// Stream contract (CUDA): the EP communicator must be a comm::NcclCommunicator created with the
// SAME cudaStream_t as the `stream` passed to every phase (and on the same device). Its calls run
// on that stream and return once enqueued (stream-ordered), so the collectives are ordered after
// the kernels that produce their inputs, and the kernels after them, with no extra events; the
// one host read (the counts) waits as described above. The inputs set in
// DispatchState before DispatchPreprocess (x, topk_idx, topk_probs) must be ready on that stream
// and stay valid until Dispatch. Create checks that the group is an NcclCommunicator on `device`;
// every phase checks that `stream` is on `device` and, on CUDA, that stream.cuda_stream == the
// communicator's stream (INVALID_ARGUMENT otherwise).
//
// Backward: CombineBackward = AllGatherV of dout (adjoint of the reduce-scatter), then
// UnpermuteBackward; DispatchBackward = PermuteBackward over the global batch, then ReduceScatter
// (adjoint of the all-gather) of dx and d_topk_probs. They reuse the sizes of the forward call of
// the same micro-batch.
//
// Owns its buffers (sized at Create) but the backward's expert-side ones where Create is given
// them (DispatcherGradScratch); borrows the EP communicator, which must outlive it. Used from one
// thread; every EP rank must run the same sequence of phases.
#ifndef SWITCHYARD_WORKER_MODEL_ALLGATHER_DISPATCHER_H_
#define SWITCHYARD_WORKER_MODEL_ALLGATHER_DISPATCHER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "kernels/runtime/buffer.h"
#include "kernels/runtime/stream.h"
#include "worker/comm/communicator.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/model/dispatcher.h"

namespace switchyard::model {

class AllGatherDispatcher final : public ExpertParallelDispatcher {
 public:
  // ep_group: the ETP×EP group (group rank r holds global experts [(r/ETP)*L, (r/ETP+1)*L)),
  // not owned; ep_size * etp_size must equal ep_group->size(); num_experts % ep_size == 0;
  // topk <= num_experts.
  // max_tokens: most tokens per micro-batch on ANY rank of the group. On a CUDA device ep_group
  // must be a comm::NcclCommunicator on that device (see the stream contract in the file comment);
  // dtype bf16/f32, probs_dtype f32 (Permute's CUDA limits).
  // grad: where the backward's expert-side tensors live (dispatcher.h; its own when null).
  static absl::StatusOr<std::unique_ptr<AllGatherDispatcher>> Create(
      comm::Communicator* ep_group, Device device, DType dtype, DType probs_dtype,
      int64_t max_tokens, int64_t hidden, int num_experts, int ep_size, int topk, int etp_size = 1,
      std::string label = "", const DispatcherGradScratch& grad = {});

  const char* name() const override { return "allgather"; }
  int64_t ExpertRowCapacity() const override { return rows_; }

  absl::Status DispatchPreprocess(const Stream& stream, DispatchState* state) override;
  absl::Status Dispatch(const Stream& stream, DispatchState* state) override;
  absl::Status DispatchPostprocess(const Stream& stream, DispatchState* state) override;
  absl::Status CombinePreprocess(const Stream& stream, DispatchState* state) override;
  absl::Status Combine(const Stream& stream, DispatchState* state) override;
  absl::Status CombinePostprocess(const Stream& stream, DispatchState* state,
                                  const Tensor& out) override;
  absl::Status CombineBackward(const Stream& stream, const Tensor& dout,
                               DispatchState* state) override;
  absl::Status DispatchBackward(const Stream& stream, DispatchState* state, const Tensor& dx,
                                const Tensor& d_topk_probs) override;

  // Tokens of each rank of the ETP×EP group in the current micro-batch (valid after Dispatch).
  const std::vector<int64_t>& tokens_per_rank() const { return tokens_per_rank_; }

 private:
  AllGatherDispatcher() = default;
  // Copies the compact global rows [T', width] of `compact` into `padded` [EP * T_max, width]
  // (rank j's rows at j * T_max, padding rows zeroed), on `stream`.
  absl::Status Spread(const Stream& stream, const Tensor& compact, const Tensor& padded,
                      int64_t width) const;
  // dst = src (same dtype and numel), on `stream` (asynchronous on CUDA).
  absl::Status CopyOnStream(const Stream& stream, const Tensor& src, const Tensor& dst,
                            const char* what) const;
  // tokens_per_rank_ x per_row: the element counts of the gathers.
  std::vector<int64_t> Elements(int64_t per_row) const;

  // group_size_ = ETP×EP (the gathers' ranks); ep_rank_ = group rank / ETP (the experts' owner).
  int group_size_ = 0, ep_rank_ = 0;
  int64_t rows_ = 0;
  // Global (gathered) side: [EP * max_tokens] tokens.
  kernels::Buffer my_count_, counts_, global_x_, global_idx_, local_idx_, global_probs_, row_map_,
      global_y_, padded_y_, padded_probs_, global_d_probs_, workspace_;
  // Local side: [max_tokens] tokens.
  kernels::Buffer reduced_y_, reduced_probs_;
  // Expert side: [rows_] rows; the backward's d_expert_out, d_expert_x and d_expert_probs in
  // scratch (DispatcherGradScratch; the owned ones when Create got none).
  kernels::Buffer expert_x_, expert_probs_, tokens_per_expert_, expert_out_;
  DispatcherGradBuffers grad_;
  // pinned_ (CUDA): [EP] i32 (D2H target of the gathered counts) then one i32 (H2D staging of
  // this rank's T).
  Tensor row_map_view_;   // [T', k] of the current micro-batch
  DispatchState inputs_;  // x / topk_idx / topk_probs of the current micro-batch
  int64_t global_tokens_ = 0, max_rank_tokens_ = 0;
  std::vector<int64_t> tokens_per_rank_;
};

namespace internal {
// CUDA (allgather_dispatcher.cu): local_idx[i] = global_idx[i] - first when it is in
// [first, first + num_local), else -1. Both i32 of one shape on the stream's device.
absl::Status LocalExpertIdsCuda(const Stream& stream, const Tensor& global_idx, int first,
                                int num_local, const Tensor& local_idx);
}  // namespace internal

}  // namespace switchyard::model

#endif  // SWITCHYARD_WORKER_MODEL_ALLGATHER_DISPATCHER_H_
