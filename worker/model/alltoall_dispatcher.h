// File: worker/model/alltoall_dispatcher.h
//
// The `alltoall` token dispatcher of megatron_moe.md §3.2 (MoEAlltoAllTokenDispatcher), for
// expert parallelism over one EP group with ETP = 1, dropless (no capacity / pad-to-capacity).
// Experts are sharded in blocks: global expert e lives on EP rank e / L, L = E / EP local experts,
// local index e % L.
//
// Phases (TokenDispatcher, dispatcher.h), per micro-batch of T local tokens:
//   DispatchPreprocess   Permute x into expert-major order over the E GLOBAL experts (permute.h);
//                        n[e] = this rank's rows per global expert; input_splits[j] = rows of EP
//                        rank j's experts (contiguous in the permuted buffer).
//   Dispatch      [comm] AllGather of n over EP -> G [EP, E]; num_global_tokens_per_local_expert
//                        [EP, L] = G[:, my experts]; output_splits[j] = its row sums. Then
//                        AllToAllV of the permuted rows and (separately, same splits) of the
//                        probs. Received layout: [src 0: (local e0, e1, ...), src 1: ...].
//   DispatchPostprocess  SortChunks by local expert with LocalExpertChunkOrder(EP, L).sort
//                        (sort_chunks.h) -> state.expert_x/expert_probs grouped [e0: src 0, src 1,
//                        ...][e1: ...]; state.tokens_per_expert[l] = sum over sources.
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
//
// Host synchronisation: the split sizes of the all-to-alls must be known on the host. The CPU path
// reads the counts directly (they are host memory). The CUDA path is NOT implemented (Create
// returns UNIMPLEMENTED for a CUDA device); see the TODO in alltoall_dispatcher.cc.
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
#include "worker/model/dispatcher.h"

namespace switchyard::model {

class AllToAllDispatcher final : public TokenDispatcher {
 public:
  // ep_group: the EP group (rank r holds global experts [r*L, (r+1)*L)), not owned;
  // ep_size must equal ep_group->size(); num_experts % ep_size == 0; E <= kMaxSortChunks.
  // max_tokens: most tokens per micro-batch on this rank. CPU device only for now.
  static absl::StatusOr<std::unique_ptr<AllToAllDispatcher>> Create(
      comm::Communicator* ep_group, Device device, DType dtype, DType probs_dtype,
      int64_t max_tokens, int64_t hidden, int num_experts, int ep_size, int topk);

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
  // Row counts -> element counts (x H) for the communicator.
  std::vector<int64_t> Elements(const std::vector<int64_t>& rows, int64_t per_row) const;

  comm::Communicator* ep_ = nullptr;
  int ep_size_ = 0, ep_rank_ = 0, num_experts_ = 0, num_local_ = 0, topk_ = 0;
  int64_t rows_ = 0, hidden_ = 0, max_tokens_ = 0;
  DType dtype_ = DType::kF32, probs_dtype_ = DType::kF32;
  kernels::ChunkOrder order_;
  // Local (send) side: [max_tokens * k] rows.
  kernels::Buffer permuted_x_, permuted_probs_, row_map_, counts_, gathered_counts_, combined_,
      d_permuted_x_, d_permuted_probs_, workspace_;
  // Expert (receive) side: [rows_] rows.
  kernels::Buffer recv_x_, recv_probs_, expert_x_, expert_probs_, tokens_per_expert_, split_sizes_,
      expert_out_, d_expert_out_, d_expert_x_, d_expert_probs_;
  Tensor row_map_view_;  // [T, k] of the current micro-batch
  int64_t num_tokens_ = 0, sent_rows_ = 0, recv_rows_ = 0;
  std::vector<int64_t> input_splits_, output_splits_;
  std::vector<int32_t> chunk_rows_;  // [EP * L], host copy of split_sizes_
  enum class Phase { kIdle, kPreprocessed, kDispatched, kPostprocessed, kCombinePre, kCombined };
  Phase phase_ = Phase::kIdle;
  bool have_forward_ = false;  // splits valid for the backward
};

}  // namespace switchyard::model

#endif  // SWITCHYARD_WORKER_MODEL_ALLTOALL_DISPATCHER_H_
