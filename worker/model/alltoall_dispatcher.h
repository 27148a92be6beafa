// File: worker/model/alltoall_dispatcher.h
//
// The `alltoall` token dispatcher of megatron_moe.md §3.2 (MoEAlltoAllTokenDispatcher), for
// expert parallelism over one EP group, optionally with expert tensor parallelism over an ETP
// group (ETP > 1), dropless (no capacity / pad-to-capacity). Experts are sharded in blocks: global
// expert e lives on EP rank e / L, L = E / EP local experts, local index e % L; with ETP > 1 each
// of the ETP peers of an EP rank holds a slice of those experts' F (worker/model/moe_layer.h).
//
// TOKEN DEDUPLICATION (the one deliberate departure from Megatron's data movement, issue 15):
// Megatron sends one row per (token, expert) slot, so a token routed to 4 experts of one remote
// rank crosses the link 4 times. Here a token crosses to an EP rank ONCE, carrying its routing
// (k expert ids and probs, kernels/moe/ep_routing.h), and the receiving rank expands it to its
// local experts; on the way back the receiving rank first sums the token's local expert outputs,
// so the combine also moves one row per (token, rank) (as DeepEP's dispatch/combine do). With the
// benchmark model's 64 experts top-8 at EP = 2 a token reaches the other rank ~4 times in
// Megatron's scheme and once here: the bytes on the link drop ~4x (EP = 4: ~2.2x). What the
// experts see is unchanged: the same rows, probs and counts in the same order (below).
//
// Phases (TokenDispatcher, dispatcher.h), per micro-batch of T local tokens, P = EP:
//   DispatchPreprocess   RouteToRanks: rank_idx [T, P] (which ranks each token goes to) and the
//                        routing rows meta [T, 2k]; TokensPerExpert n [E]; Permute of x and of
//                        meta over the P ranks as "experts" -> send rows, rank-major, tokens
//                        ascending, each token once per destination rank; its counts d [P].
//   Dispatch      [comm] AllGather of c = (n, d) [E + P] over EP -> G [EP, E + P]; the host reads
//                        G (see "Host synchronisation"): input_splits[j] = d of this rank for j,
//                        output_splits[j] = d of rank j for this rank, and the expert rows this
//                        rank will hold (from n) for the buffer sizes and the bound checks. Then
//                        AllToAllV of the rows and (same splits, 2k values per row) of the routing
//                        rows. Received layout: [src 0's tokens ascending, src 1's, ...].
//   DispatchPostprocess  LocalizeRouting (ids of this rank's experts -> 0..L-1, others dropped)
//                        and Permute over the L local experts -> state.expert_x / expert_probs /
//                        tokens_per_expert, grouped [e0: src 0's rows, src 1's ...][e1: ...],
//                        each expert's rows in ascending GLOBAL token order.
//   CombinePreprocess    Unpermute: each received token's local expert outputs summed (slot
//                        order) -> one row per received token.
//   Combine       [comm] AllToAllV back (splits swapped).
//   CombinePostprocess   Unpermute over the ranks: out[t] = sum of its ranks' partial sums, in
//                        rank order.
// Inside each local expert, rows come in ascending GLOBAL token order where the global batch is
// the rank-ordered concatenation of the EP ranks' micro-batches: exactly what LocalDispatcher
// gives on that concatenated batch (tested, bit for bit). Probabilities travel with the rows (bit
// for bit, in the routing rows) and are applied by the experts (as in LocalDispatcher).
// Numerics of the sums: out[t] = sum over ranks j (rank order) of [sum over t's slots on j (slot
// order), rounded once to the activation dtype]; dx likewise; LocalDispatcher sums all k slots
// at once. On the CPU (fp64 accumulation, rounded once per level) the two differ by at most one
// rounding of the partial sums (tests model the two-level sum exactly); d_topk_probs is exact
// (one rank owns each slot). With ETP > 1 the partial sums are also reduce-scattered over ETP.
//
// ETP > 1 (the spec's TP-aware steps, §3.2): the counts are also all-gathered over ETP
// (G' [ETP, EP, E + P]); after the EP all-to-alls, Dispatch all-gathers the received rows and
// routing rows over ETP (AllGatherV, sizes output_splits_tp[t] = rows ETP peer t received), and
// DispatchPostprocess permutes the ETP·(received) rows over the local experts: every ETP peer
// runs the same rows, in (etp, ep src, token) order per expert, through its F slice. Combine
// first reduce-scatters (sum) the per-token partial outputs over ETP, so each peer gets back the
// rows it received, fully summed, then does the reverse EP all-to-all.
//
// Other deliberate differences from Megatron:
// - Megatron's dispatch_preprocess does the all-gather of the counts; here it is the first step of
//   Dispatch, so that, as dispatcher.h promises, only Dispatch and Combine communicate.
// - Receive buffers (issue 15, item 2: memory that shrinks with EP): the received-token side and
//   the expert side are sized by the actual counts and kept between micro-batches. The received
//   side starts at R0 = min(P * T_max, 1.25 * T_max * min(P, k)) rows per ETP peer (what one
//   rank sends at most, plus a quarter), the expert side at X0 = min(XB, ETP * 1.25 * T_max * k)
//   rows (the ETP peers' balanced receipt plus a quarter); when a micro-batch needs more,
//   Dispatch grows either
//   (after the count exchange, when the host knows the sizes anyway) to min(bound, max(needed,
//   1.25 * current)); they never shrink. The documented BOUNDS: P * T_max received rows per ETP
//   peer (every token of every EP rank sent here once) and XB = ETP * P * T_max * min(k, L)
//   expert rows, which dropless routing cannot exceed (more is an INTERNAL error: a peer broke
//   the top-k contract). An optional expert_row_limit (Create) caps the expert rows of any EP
//   rank below that: a micro-batch that would give some EP rank more fails on EVERY rank of the
//   group with RESOURCE_EXHAUSTED naming that EP rank, the layer and the limit, before any row
//   moves (every rank holds the same counts, so they all decide alike: no hang, no partial
//   exchange). The expert-side views (state.expert_x, expert_probs, expert_out, and the
//   backward's) are handed out by Dispatch / CombineBackward with the current capacity
//   ExpertRowCapacity() as their row count; rows past sum(tokens_per_expert) are unspecified. A
//   caller that sizes its own expert-row buffers (MoELayer) follows state.expert_x.dim(0) after
//   Dispatch.
// - No drop-and-pad, no router padding for FP8.
// - ETP: the counts are all-gathered over EP then over ETP (two small collectives) instead of once
//   over the ETP×EP group, so the dispatcher needs no third group; the result is the same G'. The
//   ETP all-gather is part of Dispatch (Megatron: dispatch_postprocess) and the ETP reduce-scatter
//   part of Combine (Megatron: combine_preprocess), keeping "only Dispatch and Combine
//   communicate". Uneven per-peer row counts are reduce-scattered through a padded layout
//   (SpreadRows, dispatcher.h: equal chunks of max_t output_splits_tp[t] rows), in the
//   activation dtype (the prob gradients in the probs dtype).
// - Megatron copies the split tensors D2H on a side stream; here the one copy is on the phases'
//   stream right after the count all-gather, so no side stream and no cross-stream event are
//   needed.
//
// Host synchronisation: the split sizes of the all-to-alls must be known on the host. Everything
// the host needs is derived from the all-gathered counts G, so Dispatch makes ONE device-to-host
// copy per micro-batch:
//   CPU:  the counts are host memory and are read directly.
//   CUDA: RouteToRanks / TokensPerExpert / Permute write c on the device; the AllGather of c (and,
//         with ETP, of G over ETP) runs on the device (NCCL); then ONE cudaMemcpyAsync of G
//         (EP * (E + P) i32; with ETP, ETP times that) into pinned host memory, an event recorded
//         after it and one bounded wait on it (comm::WaitEvent: the EP/ETP groups' Synchronize(),
//         then the event) (the spec's cuda_sync_point before_ep_alltoall). No host-to-device copy:
//         tokens_per_expert is computed on the device by the local Permute. No other host sync in
//         the forward; the backward reuses the forward's splits and does not sync at all.
//
// Stream contract (CUDA): the EP (and ETP) communicator must be a comm::NcclCommunicator created
// with the SAME cudaStream_t as the `stream` passed to every phase (and on the same device), so
// the collectives are ordered after the kernels that produce their inputs, and the kernels after
// them, with no extra events. Create checks that the group is an NcclCommunicator on `device`;
// every phase checks that `stream` is on `device` and, on CUDA, that stream.cuda_stream == the
// communicator's stream (INVALID_ARGUMENT otherwise).
//
// Backward: CombineBackward = UnpermuteBackward over the ranks (dout[t] to each of t's ranks),
// AllToAllV (dispatch direction), [ETP: AllGatherV over ETP, the adjoint of the reduce-scatter],
// UnpermuteBackward over the local experts (dout[t] to each of t's local expert rows);
// DispatchBackward = PermuteBackward over the local experts (per received token: the sum of its
// local rows' input gradients, and its prob gradients per slot), [ETP: ReduceScatter (sum) over
// ETP of both, the adjoint of the all-gather], AllToAllV back of both, PermuteBackward over the
// ranks (dx[t] = sum of its ranks' partial gradients, d_topk_probs[t, s] from the rank owning
// slot s). They reuse the split sizes of the forward call of the same micro-batch.
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
// Owns its buffers (the send side sized at Create, the received and expert sides as above) but
// d_expert_probs where Create is given it (DispatcherGradScratch); borrows the EP communicator,
// which must outlive it. Used from one thread; every EP rank must run
// the same sequence of phases.
#ifndef SWITCHYARD_WORKER_MODEL_ALLTOALL_DISPATCHER_H_
#define SWITCHYARD_WORKER_MODEL_ALLTOALL_DISPATCHER_H_

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

class AllToAllDispatcher final : public ExpertParallelDispatcher {
 public:
  // ep_group: the EP group (rank r holds global experts [r*L, (r+1)*L)), not owned;
  // ep_size must equal ep_group->size(); num_experts % ep_size == 0.
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
  // grad: grad.d_expert_probs holds the backward's d_expert_probs (dispatcher.h; its own when
  // null); the other two roles are not used (d_expert_out and d_expert_x share expert_out).
  static absl::StatusOr<std::unique_ptr<AllToAllDispatcher>> Create(
      comm::Communicator* ep_group, Device device, DType dtype, DType probs_dtype,
      int64_t max_tokens, int64_t hidden, int num_experts, int ep_size, int topk,
      comm::Communicator* etp_group = nullptr, std::string label = "", int64_t expert_row_limit = 0,
      const DispatcherGradScratch& grad = {});

  const char* name() const override { return "alltoall"; }
  // The CURRENT expert-side row capacity (grows in Dispatch; see "Receive buffers").
  int64_t ExpertRowCapacity() const override { return rows_; }
  // The bound XB the expert-side capacity never exceeds.
  int64_t ExpertRowBound() const { return expert_bound_; }
  // The current / most received-token rows per ETP peer (see "Receive buffers").
  int64_t ReceiveRowCapacity() const { return recv_cap_; }
  int64_t ReceiveRowBound() const { return recv_bound_; }

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

  // Split sizes of the current micro-batch, in TOKEN rows (each token once per destination
  // rank; valid after Dispatch): input_splits()[j] rows go to EP rank j, output_splits()[j] rows
  // come from it; output_splits_tp()[t] is the number of rows ETP peer t received (its share of
  // the ETP reduce-scatter). num_global_tokens_per_local_expert()[(t * EP + j) * L + l] is the
  // number of EXPERT rows (slots) for local expert l among ETP peer t's receipt from EP rank j
  // (t = 0 only with ETP = 1): Megatron's tensor of that name.
  const std::vector<int64_t>& input_splits() const { return input_splits_; }
  const std::vector<int64_t>& output_splits() const { return output_splits_; }
  const std::vector<int32_t>& num_global_tokens_per_local_expert() const { return chunk_rows_; }
  const std::vector<int64_t>& output_splits_tp() const { return tp_rows_; }
  // Expert rows (slots) this rank's experts hold in the current micro-batch (valid after
  // Dispatch): the sum of num_global_tokens_per_local_expert().
  int64_t expert_rows() const { return expert_rows_; }

 private:
  AllToAllDispatcher() = default;
  // (Re)allocates the received-token side for `recv_rows` rows per ETP peer.
  absl::Status GrowReceiveSide(int64_t recv_rows);
  // (Re)allocates the expert side for `rows` rows.
  absl::Status GrowExpertSide(int64_t rows);
  // Reads the all-gathered counts (host copy `g_all`, [ETP, EP, E + P]): splits, chunk sizes,
  // bounds and the expert_row_limit (see "Receive buffers"), growing the buffers as needed.
  absl::Status ReadCounts(const int32_t* g_all);

  // The rows the local permutation reads and the combine writes: the ETP-gathered tokens with
  // ETP > 1, else the EP receipt ([tp_total_rows_] rows of the current micro-batch).
  Tensor SourceRows() const;
  Tensor SourceMeta() const;
  // [tp_total_rows_, k] views of the local routing / prob gradients and the local row map.
  Tensor LocalProbs() const;
  Tensor LocalMap() const;
  // ETP > 1: padded reduce-scatter (sum) of `rows` [tp_total_rows_, width] over ETP into `out`
  // (this peer's tp_rows_[etp_rank_] rows), through `padded`.
  absl::Status ReduceScatterTp(const Stream& stream, const Tensor& rows, const Tensor& padded,
                               int64_t width, const Tensor& out);

  comm::Communicator* etp_ = nullptr;  // null with ETP = 1
  int ep_size_ = 0, ep_rank_ = 0;
  int etp_size_ = 1, etp_rank_ = 0;
  int64_t expert_row_limit_ = 0;
  // send_cap_ = T_max * min(EP, k): the send side (static). recv_cap_ / recv_bound_: received
  // token rows per ETP peer (current / most). rows_ / expert_bound_: expert rows (current / most).
  int64_t send_cap_ = 0, recv_cap_ = 0, recv_bound_ = 0, rows_ = 0, expert_bound_ = 0;
  // Send side, sized at Create. send_x_ holds the outgoing token rows, then the combined partial
  // sums coming back (Combine -> CombinePostprocess), then the backward's rows (their lifetimes do
  // not overlap). send_meta_ [send_cap_, 2k] holds the outgoing routing rows, later the returning
  // prob gradients ([send_cap_, k] view). rank_probs_ / send_probs_ / d_rank_probs_ are the
  // probability operands of the rank-level Permute / PermuteBackward, whose values are not used
  // (zeros).
  kernels::Buffer rank_idx_, rank_map_, meta_, send_x_, send_meta_, rank_probs_, send_probs_,
      d_rank_probs_, counts_, gathered_counts_, all_counts_, workspace_, tokens_per_expert_;
  // Received side, [recv_cap_] rows per ETP peer: recv_x_ / recv_meta_ (the EP receipt; the
  // combine's and backward's outgoing rows; recv_meta_'s [.., k] view takes the reduced prob
  // gradients); with ETP > 1 the gathered tp_x_ / tp_meta_ and the padded reduce-scatter inputs
  // ([ETP * recv_cap_] rows). local_idx_ / local_probs_ / local_map_: [ETP * recv_cap_, k] (the
  // local routing; local_probs_ later holds the prob gradients per received token and slot).
  kernels::Buffer recv_x_, recv_meta_, tp_x_, tp_meta_, padded_x_, padded_dprobs_, local_idx_,
      local_probs_, local_map_;
  // Expert side, [rows_] rows. expert_out_ also holds d_expert_out and d_expert_x
  // (DispatchState in dispatcher.h); d_expert_probs is scratch (DispatcherGradScratch, or the
  // owned one when Create got none), reserved for rows_ as the side grows.
  kernels::Buffer expert_x_, expert_probs_, expert_out_;
  ScratchBuffer* d_expert_probs_ = nullptr;
  std::unique_ptr<ScratchBuffer> own_d_expert_probs_;
  // pinned_ (CUDA): [ETP * EP * (E + P)] i32, the D2H target of the gathered counts.
  Tensor rank_map_view_;  // [T, EP] of the current micro-batch
  int64_t sent_rows_ = 0, recv_rows_ = 0, expert_rows_ = 0;
  int64_t tp_total_rows_ = 0, tp_max_rows_ = 0;  // sum / max of tp_rows_
  std::vector<int64_t> input_splits_, output_splits_;
  std::vector<int64_t> tp_rows_;     // [ETP] rows each ETP peer received (output_splits_tp)
  std::vector<int32_t> chunk_rows_;  // [ETP * EP * L] expert rows per (peer, source, expert)
};

}  // namespace switchyard::model

#endif  // SWITCHYARD_WORKER_MODEL_ALLTOALL_DISPATCHER_H_
