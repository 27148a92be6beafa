// File: worker/model/alltoall_dispatcher.h
//
// The `alltoall` token dispatcher of megatron_moe.md §3.2 (MoEAlltoAllTokenDispatcher), for
// expert parallelism over one EP group with ETP = 1, dropless (no capacity / pad-to-capacity).
// Experts are sharded in blocks: global expert e lives on EP rank e / L, L = E / EP local experts,
// local index e % L.
//
// Phases (TokenDispatcher, dispatcher.h), per micro-batch of T local tokens:
//   DispatchPreprocess   Permute x into expert-major order over the E GLOBAL experts (permute.h);
//                        n[e] = this rank's rows per global expert (on the device; rows for EP
//                        rank j's experts are contiguous in the permuted buffer).
//   Dispatch      [comm] AllGather of n over EP -> G [EP, E]; the host reads G (see "Host
//                        synchronisation"): input_splits[j] = sum of G[ep_rank, j's experts],
//                        num_global_tokens_per_local_expert [EP, L] = G[:, my experts],
//                        output_splits[j] = its row sums, tokens_per_expert[l] = its column sums
//                        (written to the device here, stream-ordered). Then AllToAllV of the
//                        permuted rows and (separately, same splits) of the probs. Received
//                        layout: [src 0: (local e0, e1, ...), src 1: ...].
//   DispatchPostprocess  SortChunks by local expert with LocalExpertChunkOrder(EP, L).sort
//                        (sort_chunks.h) -> state.expert_x/expert_probs grouped [e0: src 0, src 1,
//                        ...][e1: ...].
//   CombinePreprocess    UnsortChunks of state.expert_out (back to source-major).
//   Combine       [comm] AllToAllV back (splits swapped).
//   CombinePostprocess   Unpermute: out[t] = sum of its k expert outputs, in slot order.
// Inside each local expert, rows come in ascending GLOBAL token order where the global batch is
// the rank-ordered concatenation of the EP ranks' micro-batches: exactly what LocalDispatcher
// gives on that concatenated batch (tested). Probabilities travel with the rows and are applied by
// the experts (as in LocalDispatcher); CombinePostprocess sums without probs.
//
// Deliberate differences from Megatron:
// - Megatron's dispatch_preprocess does the all-gather of the counts; here it is the first step of
//   Dispatch, so that, as dispatcher.h promises, only Dispatch and Combine communicate.
// - The expert-side buffers have a STATIC capacity R = EP * max_tokens * min(k, L) rows (the most
//   one rank can receive: every token of every rank routed to this rank's experts); rows past
//   sum(tokens_per_expert) are unspecified. Megatron sizes them dynamically.
// - No drop-and-pad, no ETP > 1 (Megatron's AG/RS over ETP), no router padding for FP8.
// - Megatron copies the split tensors D2H on a side stream; here the one copy is on the phases'
//   stream right after the count all-gather (which is host-synchronous anyway), so no side stream
//   and no cross-stream event are needed.
//
// Host synchronisation: the split sizes of the all-to-alls must be known on the host. Everything
// the host needs (input splits, output splits, num_global_tokens_per_local_expert) is derived from
// the all-gathered counts G [EP, E] (row ep_rank of G is this rank's own n), so Dispatch makes ONE
// device-to-host copy per micro-batch:
//   CPU:  the counts are host memory and are read directly.
//   CUDA: Permute writes n on the device; the AllGather of n runs on the device (NCCL); then ONE
//         cudaMemcpyAsync of G (EP * E i32) into pinned host memory, an event recorded after it
//         and one cudaEventSynchronize (the spec's cuda_sync_point before_ep_alltoall). The
//         device-side chunk sizes for SortChunks and tokens_per_expert ([EP*L + L] i32) then go
//         back with one cudaMemcpyAsync from a pinned staging area (safe to rewrite at the next
//         Dispatch: its event sync follows that copy on the same stream). No other host sync in
//         the forward; the backward reuses the forward's splits and does not sync at all.
//
// Stream contract (CUDA): the EP communicator must be a comm::NcclCommunicator created with the
// SAME cudaStream_t as the `stream` passed to every phase (and on the same device). Its calls are
// host-synchronous and run on that stream, so the collectives are ordered after the kernels that
// produce their inputs, and the kernels after them, with no extra events. Create checks that the
// group is an NcclCommunicator on `device`; every phase checks that `stream` is on `device` and,
// on CUDA, that stream.cuda_stream == the communicator's stream (INVALID_ARGUMENT otherwise).
//
// Backward: CombineBackward = UnpermuteBackward, AllToAllV (dispatch direction), SortChunks;
// DispatchBackward = UnsortChunks (rows and probs), AllToAllV back, PermuteBackward. They reuse
// the split sizes of the forward call of the same micro-batch.
//
// Owns its buffers (sized at Create); borrows the EP communicator, which must outlive it. Used
// from one thread; every EP rank must run the same sequence of phases.
#ifndef SWITCHYARD_WORKER_MODEL_ALLTOALL_DISPATCHER_H_
#define SWITCHYARD_WORKER_MODEL_ALLTOALL_DISPATCHER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "kernels/buffer.h"
#include "kernels/moe/sort_chunks.h"
#include "worker/comm/communicator.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/model/dispatcher.h"

namespace switchyard::model {

class AllToAllDispatcher final : public TokenDispatcher {
 public:
  // ep_group: the EP group (rank r holds global experts [r*L, (r+1)*L)), not owned;
  // ep_size must equal ep_group->size(); num_experts % ep_size == 0; E <= kMaxSortChunks.
  // max_tokens: most tokens per micro-batch on this rank. On a CUDA device ep_group must be a
  // comm::NcclCommunicator on that device (see the stream contract in the file comment); dtype
  // bf16/f32, probs_dtype f32 (Permute's CUDA limits), num_experts <= kMaxExpertsCuda.
  static absl::StatusOr<std::unique_ptr<AllToAllDispatcher>> Create(
      comm::Communicator* ep_group, Device device, DType dtype, DType probs_dtype,
      int64_t max_tokens, int64_t hidden, int num_experts, int ep_size, int topk);

  const char* name() const override { return "alltoall"; }
  int64_t ExpertRowCapacity() const override { return rows_; }
  int num_local_experts() const override { return num_local_; }
  bool pads_to_capacity() const override { return false; }

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

  // Split sizes of the current micro-batch, in rows (valid after Dispatch):
  // input_splits()[j] rows go to EP rank j, output_splits()[j] rows come from it, and
  // num_global_tokens_per_local_expert()[j * L + l] of those are for local expert l.
  const std::vector<int64_t>& input_splits() const { return input_splits_; }
  const std::vector<int64_t>& output_splits() const { return output_splits_; }
  const std::vector<int32_t>& num_global_tokens_per_local_expert() const { return chunk_rows_; }

 private:
  AllToAllDispatcher() = default;
  // Views into local_sizes_: the [EP*L] chunk sizes and the [L] tokens per local expert.
  Tensor SplitSizes() const;
  Tensor TokensPerExpert() const;
  // The stream rules of every phase (see the stream contract in the file comment).
  absl::Status CheckStream(const Stream& stream, const char* phase) const;
  // Row counts -> element counts (x H) for the communicator.
  std::vector<int64_t> Elements(const std::vector<int64_t>& rows, int64_t per_row) const;

  comm::Communicator* ep_ = nullptr;
  comm::NcclCommunicator* nccl_ = nullptr;  // ep_ on a CUDA device, else null
  Device device_;
  int ep_size_ = 0, ep_rank_ = 0, num_experts_ = 0, num_local_ = 0, topk_ = 0;
  int64_t rows_ = 0, hidden_ = 0, max_tokens_ = 0;
  DType dtype_ = DType::kF32, probs_dtype_ = DType::kF32;
  kernels::ChunkOrder order_;
  // Local (send) side: [max_tokens * k] rows.
  kernels::Buffer permuted_x_, permuted_probs_, row_map_, counts_, gathered_counts_, combined_,
      d_permuted_x_, d_permuted_probs_, workspace_;
  // Expert (receive) side: [rows_] rows.
  kernels::Buffer recv_x_, recv_probs_, expert_x_, expert_probs_, expert_out_, d_expert_out_,
      d_expert_x_, d_expert_probs_;
  // [EP*L] chunk sizes (SortChunks' split_sizes) then [L] tokens_per_expert, i32 on the device.
  kernels::Buffer local_sizes_;
  // CUDA only: pinned host memory, [EP*E] i32 (D2H target of the gathered counts) then [EP*L + L]
  // i32 (H2D staging of local_sizes_), and the event that the D2H copy is waited on with.
  std::shared_ptr<void> pinned_, event_;
  Tensor row_map_view_;  // [T, k] of the current micro-batch
  int64_t num_tokens_ = 0, sent_rows_ = 0, recv_rows_ = 0;
  std::vector<int64_t> input_splits_, output_splits_;
  std::vector<int32_t> chunk_rows_;  // [EP * L], host copy of the chunk sizes
  enum class Phase { kIdle, kPreprocessed, kDispatched, kPostprocessed, kCombinePre, kCombined };
  Phase phase_ = Phase::kIdle;
  bool have_forward_ = false;  // splits valid for the backward
};

}  // namespace switchyard::model

#endif  // SWITCHYARD_WORKER_MODEL_ALLTOALL_DISPATCHER_H_
