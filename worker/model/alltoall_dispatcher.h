// File: worker/model/alltoall_dispatcher.h
//
// The `alltoall` token dispatcher of megatron_moe.md §3.2 (MoEAlltoAllTokenDispatcher), for
// expert parallelism over one EP group, optionally with expert tensor parallelism over an ETP
// group (ETP > 1), dropless (no capacity / pad-to-capacity). Experts are sharded in blocks: global
// expert e lives on EP rank e / L, L = E / EP local experts, local index e % L; with ETP > 1 each
// of the ETP peers of an EP rank holds a slice of those experts' F (worker/model/moe_layer.h).
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
//   With ETP > 1 (the spec's TP-aware steps, §3.2): the counts are also all-gathered over ETP
//   (G' [ETP, EP, E]); after the EP all-to-alls, Dispatch all-gathers the received rows and probs
//   over ETP (AllGatherV, sizes output_splits_tp[t] = rows ETP peer t received), giving chunks in
//   (etp, ep src, local e) order, and DispatchPostprocess sorts the ETP·EP·L chunks by local
//   expert: every ETP peer runs the same rows through its F slice. Combine first reduce-scatters
//   (sum) the partial fc2 outputs over ETP, so each peer gets back the rows it received, fully
//   summed, then does the reverse EP all-to-all.
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
// - Receive buffers (issue 15, item 2: memory that shrinks with EP): the expert-side buffers
//   are sized by the actual counts, as Megatron's are, but kept between micro-batches rather
//   than allocated per call. They start at R0 = ETP * min(B, 1.25 * max_tokens * k) rows (the
//   balanced receipt plus a quarter) and, when a micro-batch's counts need more, Dispatch grows
//   them (after the count exchange, when the host knows the sizes anyway) to
//   ETP * min(B, max(needed, 1.25 * current)) rows; they never shrink. The documented BOUND is
//   B = EP * max_tokens * min(k, L) rows per ETP peer (every token of every EP rank routed to this
//   rank's experts), which dropless routing cannot exceed (more is an INTERNAL error: a peer broke
//   the top-k contract). An optional expert_row_limit (Create) caps the expert rows of any EP rank
//   below that: a micro-batch that would give some EP rank more fails on EVERY rank of the group
//   with RESOURCE_EXHAUSTED naming that EP rank, the layer and the limit, before any row moves
//   (every rank holds the same counts, so they all decide alike: no hang, no partial exchange).
//   The expert-side views (state.expert_x, expert_probs, expert_out, and the backward's) are
//   handed out by Dispatch / CombineBackward with the current capacity ExpertRowCapacity() as
//   their row count; rows past sum(tokens_per_expert) are unspecified. A caller that sizes its own
//   expert-row buffers (MoELayer) follows state.expert_x.dim(0) after Dispatch.
// - No drop-and-pad, no router padding for FP8.
// - ETP: the counts are all-gathered over EP then over ETP (two small collectives) instead of once
//   over the ETP×EP group, so the dispatcher needs no third group; the result is the same G'. The
//   ETP all-gather is part of Dispatch (Megatron: dispatch_postprocess) and the ETP reduce-scatter
//   part of Combine (Megatron: combine_preprocess), keeping "only Dispatch and Combine
//   communicate". Uneven per-peer row counts are reduce-scattered through a padded layout
//   (SpreadRows, dispatcher.h: equal chunks of max_t output_splits_tp[t] rows), and in the
//   activation dtype (Megatron: the probs dtype).
// - Megatron copies the split tensors D2H on a side stream; here the one copy is on the phases'
//   stream right after the count all-gather (which is host-synchronous anyway), so no side stream
//   and no cross-stream event are needed.
//
// Host synchronisation: the split sizes of the all-to-alls must be known on the host. Everything
// the host needs (input splits, output splits, num_global_tokens_per_local_expert) is derived from
// the all-gathered counts G [EP, E] (row ep_rank of G is this rank's own n), so Dispatch makes ONE
// device-to-host copy per micro-batch:
//   CPU:  the counts are host memory and are read directly.
//   CUDA: Permute writes n on the device; the AllGather of n (and, with ETP, of G over ETP) runs
//         on the device (NCCL); then ONE cudaMemcpyAsync of G (EP * E i32; with ETP, G' of
//         ETP * EP * E) into pinned host memory, an event recorded after it and one
//         cudaEventSynchronize (the spec's cuda_sync_point before_ep_alltoall). The device-side
//         chunk sizes for SortChunks and tokens_per_expert ([ETP*EP*L + L] i32) then go back with
//         one cudaMemcpyAsync from a pinned staging area (safe to rewrite at the next
//         Dispatch: its event sync follows that copy on the same stream). No other host sync in
//         the forward; the backward reuses the forward's splits and does not sync at all.
//
// Stream contract (CUDA): the EP (and ETP) communicator must be a comm::NcclCommunicator created
// with the SAME cudaStream_t as the `stream` passed to every phase (and on the same device). Its
// calls are host-synchronous and run on that stream, so the collectives are ordered after the
// kernels that produce their inputs, and the kernels after them, with no extra events. Create
// checks that the group is an NcclCommunicator on `device`; every phase checks that `stream` is on
// `device` and, on CUDA, that stream.cuda_stream == the communicator's stream (INVALID_ARGUMENT
// otherwise).
//
// Backward: CombineBackward = UnpermuteBackward, AllToAllV (dispatch direction), [ETP: AllGatherV
// over ETP, the adjoint of the reduce-scatter], SortChunks; DispatchBackward = UnsortChunks (rows
// and probs), [ETP: ReduceScatter (sum) over ETP of the partial input and prob gradients, the
// adjoint of the all-gather], AllToAllV back, PermuteBackward. They reuse the split sizes of the
// forward call of the same micro-batch.
//
// Failure (issue 15, "never hang"): every collective of the four communicating phases is bounded
// by its communicator's timeout (Gloo: GlooOptions::timeout; NCCL: NcclOptions::timeout, after
// which the NCCL communicator is aborted), and its error comes back prefixed with the label given
// at Create and the phase: "MoE layer 3 dispatch (forward): group 'ep[0,1]' rank 0/2 AllToAllV:
// Timed out ...; no data yet from group rank(s) 1 (world rank 1)". Gloo's AllToAllV names the
// peers whose data had not arrived (gloo_communicator.h); NCCL cannot tell which peer is missing,
// so there the group and the phase are named and the lost rank comes from the PeerMonitor
// (worker/comm/peer_monitor.h), as for any collective. Tested with real processes, one of them
// SIGKILLed or SIGSTOPped inside the all-to-all (alltoall_dispatcher_test.cc; the NCCL path by
// ep_dispatcher_gpu_test.cc).
//
// Owns its buffers (the send side sized at Create, the expert side as above); borrows the EP
// communicator, which must outlive it. Used from one thread; every EP rank must run the same
// sequence of phases.
#ifndef SWITCHYARD_WORKER_MODEL_ALLTOALL_DISPATCHER_H_
#define SWITCHYARD_WORKER_MODEL_ALLTOALL_DISPATCHER_H_

#include <cstdint>
#include <memory>
#include <string>
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
  // ep_size must equal ep_group->size(); num_experts % ep_size == 0; ETP·E <= kMaxSortChunks.
  // etp_group: the ETP group (null = ETP 1), not owned; on CUDA an NcclCommunicator on `device`
  // with the same stream as ep_group.
  // label: what a communication error is prefixed with, with the phase ("MoE layer 3" gives
  // "MoE layer 3 dispatch (forward): <the communicator's error>"; see "Failure" above); empty =
  // "AllToAllDispatcher".
  // expert_row_limit: 0 (none: the bound of "Receive buffers" above) or the most expert rows any
  // EP rank may receive in one micro-batch (see there).
  // max_tokens: most tokens per micro-batch on this rank. On a CUDA device ep_group must be a
  // comm::NcclCommunicator on that device (see the stream contract in the file comment); dtype
  // bf16/f32, probs_dtype f32 (Permute's CUDA limits), num_experts <= kMaxExpertsCuda.
  static absl::StatusOr<std::unique_ptr<AllToAllDispatcher>> Create(
      comm::Communicator* ep_group, Device device, DType dtype, DType probs_dtype,
      int64_t max_tokens, int64_t hidden, int num_experts, int ep_size, int topk,
      comm::Communicator* etp_group = nullptr, std::string label = "",
      int64_t expert_row_limit = 0);

  const char* name() const override { return "alltoall"; }
  // The CURRENT expert-side row capacity (grows in Dispatch; see "Receive buffers").
  int64_t ExpertRowCapacity() const override { return rows_; }
  // The bound B * ETP the capacity never exceeds.
  int64_t ExpertRowBound() const { return etp_size_ * recv_bound_; }
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
  // num_global_tokens_per_local_expert()[(t * EP + j) * L + l] rows of ETP peer t's receipt from
  // EP rank j are for local expert l (t = 0 only with ETP = 1); output_splits_tp()[t] is the
  // number of rows ETP peer t received (its share of the ETP reduce-scatter).
  const std::vector<int64_t>& input_splits() const { return input_splits_; }
  const std::vector<int64_t>& output_splits() const { return output_splits_; }
  const std::vector<int32_t>& num_global_tokens_per_local_expert() const { return chunk_rows_; }
  const std::vector<int64_t>& output_splits_tp() const { return tp_rows_; }

 private:
  AllToAllDispatcher() = default;
  // (Re)allocates the expert side for `recv_rows` rows per ETP peer (rows_ = ETP * recv_rows).
  absl::Status GrowExpertSide(int64_t recv_rows);
  // Views into local_sizes_: the [ETP*EP*L] chunk sizes and the [L] tokens per local expert.
  Tensor SplitSizes() const;
  Tensor TokensPerExpert() const;
  // The stream rules of every phase (see the stream contract in the file comment).
  absl::Status CheckStream(const Stream& stream, const char* phase) const;
  // `status` of a collective, prefixed with label_ and `phase` ("dispatch (forward)", ...).
  absl::Status Comm(const char* phase, const absl::Status& status) const;
  // Row counts -> element counts (x H) for the communicator.
  std::vector<int64_t> Elements(const std::vector<int64_t>& rows, int64_t per_row) const;

  // The rows the experts see: the ETP-gathered buffer with ETP > 1, else the EP receipt.
  Tensor SourceRows() const { return etp_size_ > 1 ? tp_x_.View() : recv_x_.View(); }
  Tensor SourceProbs() const { return etp_size_ > 1 ? tp_probs_.View() : recv_probs_.View(); }
  // ETP > 1: padded reduce-scatter (sum) of `rows` [sum tp_rows_, width] over ETP into `out`
  // (this peer's tp_rows_[etp_rank_] rows).
  absl::Status ReduceScatterTp(const Stream& stream, const Tensor& rows,
                               const kernels::Buffer& padded, int64_t width,
                               const kernels::Buffer& out);

  comm::Communicator* ep_ = nullptr;
  std::string label_;
  comm::Communicator* etp_ = nullptr;       // null with ETP = 1
  comm::NcclCommunicator* nccl_ = nullptr;  // ep_ on a CUDA device, else null
  Device device_;
  int ep_size_ = 0, ep_rank_ = 0, num_experts_ = 0, num_local_ = 0, topk_ = 0;
  int etp_size_ = 1, etp_rank_ = 0;
  // rows_ = ETP * recv_cap_: the expert side; recv_cap_: the EP all-to-all's receive side (both
  // current capacities); recv_bound_: B, the most recv_cap_ can become.
  int64_t rows_ = 0, recv_cap_ = 0, recv_bound_ = 0, hidden_ = 0, max_tokens_ = 0;
  int64_t expert_row_limit_ = 0;
  DType dtype_ = DType::kF32, probs_dtype_ = DType::kF32;
  kernels::ChunkOrder order_;
  // Local (send) side: [max_tokens * k] rows. permuted_x_ / permuted_probs_ also hold the
  // combined rows (Combine -> CombinePostprocess) and the backward's d_permuted rows (their
  // lifetimes do not overlap; see Create).
  kernels::Buffer permuted_x_, permuted_probs_, row_map_, counts_, gathered_counts_, workspace_;
  // Expert (receive) side: [rows_] rows.
  // expert_out_ also holds d_expert_out and d_expert_x (DispatchState in dispatcher.h).
  kernels::Buffer recv_x_, recv_probs_, expert_x_, expert_probs_, expert_out_, d_expert_probs_;
  // ETP > 1 only (else empty): the counts gathered over ETP [ETP, EP, E], the ETP-gathered rows
  // and probs [rows_] and the padded reduce-scatter inputs [rows_] (recv_x_ / recv_probs_ take
  // the outputs).
  kernels::Buffer all_counts_, tp_x_, tp_probs_, padded_x_, padded_probs_;
  // [ETP*EP*L] chunk sizes (SortChunks' split_sizes) then [L] tokens_per_expert, i32 on the device.
  kernels::Buffer local_sizes_;
  // CUDA only: pinned host memory, [ETP*EP*E] i32 (D2H target of the gathered counts) then
  // [ETP*EP*L + L] i32 (H2D staging of local_sizes_), and the event that the D2H copy is waited
  // on with.
  std::shared_ptr<void> pinned_, event_;
  Tensor row_map_view_;  // [T, k] of the current micro-batch
  int64_t num_tokens_ = 0, sent_rows_ = 0, recv_rows_ = 0;
  int64_t tp_total_rows_ = 0, tp_max_rows_ = 0;  // sum / max of tp_rows_
  std::vector<int64_t> input_splits_, output_splits_;
  std::vector<int64_t> tp_rows_;     // [ETP] rows each ETP peer received (output_splits_tp)
  std::vector<int32_t> chunk_rows_;  // [ETP * EP * L], host copy of the chunk sizes
  enum class Phase { kIdle, kPreprocessed, kDispatched, kPostprocessed, kCombinePre, kCombined };
  Phase phase_ = Phase::kIdle;
  bool have_forward_ = false;  // splits valid for the backward
};

}  // namespace switchyard::model

#endif  // SWITCHYARD_WORKER_MODEL_ALLTOALL_DISPATCHER_H_
