#include "worker/model/alltoall_dispatcher.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/moe/ep_routing.h"
#include "kernels/moe/permute.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::model {

using kernels::Buffer;

namespace {

// Zeroes a buffer on its device (the probability operands whose values are never used).
absl::Status Zero(const Buffer& b, Device device) {
  if (device.is_cuda()) SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(device.index));
  return kernels::FillBytes(b.View(), 0);
}

}  // namespace

absl::StatusOr<std::unique_ptr<AllToAllDispatcher>> AllToAllDispatcher::Create(
    comm::Communicator* ep_group, Device device, DType dtype, DType probs_dtype, int64_t max_tokens,
    int64_t hidden, int num_experts, int ep_size, int topk, comm::Communicator* etp_group,
    std::string label, int64_t expert_row_limit, const DispatcherGradScratch& grad) {
  SY_RETURN_IF_ERROR(CheckExpertParallelArgs(
      "AllToAllDispatcher", ep_group, ep_group ? ep_group->size() : 0,
      ep_group ? ep_group->name() : "", max_tokens, hidden, num_experts, ep_size, topk));
  const int etp_size = etp_group != nullptr ? etp_group->size() : 1;
  SY_ASSIGN_OR_RETURN(comm::NcclCommunicator * nccl,
                      NcclGroupForDevice("AllToAllDispatcher", ep_group, device));
  if (etp_group != nullptr && device.is_cuda()) {
    // The ETP collectives run on the same stream as the EP ones (one stream contract).
    SY_ASSIGN_OR_RETURN(comm::NcclCommunicator * etp_nccl,
                        NcclGroupForDevice("AllToAllDispatcher", etp_group, device));
    if (etp_nccl->stream() != nccl->stream()) {
      return absl::InvalidArgumentError(
          absl::StrCat("AllToAllDispatcher: etp_group '", etp_group->name(),
                       "' must run on the stream of ep_group '", ep_group->name(), "'"));
    }
  }
  if (device.is_cuda()) {
    if (num_experts > kernels::kMaxExpertsCuda) {
      return absl::InvalidArgumentError(
          absl::StrCat("AllToAllDispatcher: num_experts (", num_experts,
                       ") must be <= ", kernels::kMaxExpertsCuda, " on CUDA"));
    }
  }
  if (expert_row_limit < 0) {
    return absl::InvalidArgumentError(absl::StrCat("AllToAllDispatcher: expert_row_limit (",
                                                   expert_row_limit, ") must be >= 0 (0 = none)"));
  }
  std::unique_ptr<AllToAllDispatcher> d(new AllToAllDispatcher());
  d->InitExpertParallel("AllToAllDispatcher", ep_group, nccl, device, dtype, probs_dtype,
                        max_tokens, hidden, num_experts, ep_size, topk, std::move(label));
  d->etp_ = etp_size > 1 ? etp_group : nullptr;
  d->etp_size_ = etp_size;
  d->etp_rank_ = etp_size > 1 ? etp_group->rank() : 0;
  d->ep_size_ = ep_size;
  d->ep_rank_ = ep_group->rank();
  d->expert_row_limit_ = expert_row_limit;
  d->d_expert_probs_ = BorrowOrOwn(grad.d_expert_probs, device, &d->own_d_expert_probs_);
  // The bounds of "Receive buffers" (header): each token reaches a rank at most once, and gives
  // at most min(k, L) expert rows there.
  const int64_t k = topk, p = ep_size;
  d->send_cap_ = max_tokens * std::min<int64_t>(p, k);
  d->recv_bound_ = p * max_tokens;
  d->expert_bound_ = etp_size * p * max_tokens * std::min<int64_t>(k, d->num_local_);

  const int64_t width = p + num_experts;  // per-rank counts c = (n [E], d [P])
  SY_ASSIGN_OR_RETURN(d->rank_idx_, Buffer::ForTensor(DType::kI32, {max_tokens, p}, device));
  SY_ASSIGN_OR_RETURN(d->rank_map_, Buffer::ForTensor(DType::kI32, {max_tokens, p}, device));
  SY_ASSIGN_OR_RETURN(d->meta_, Buffer::ForTensor(probs_dtype, {max_tokens, 2 * k}, device));
  SY_ASSIGN_OR_RETURN(d->send_x_, Buffer::ForTensor(dtype, {d->send_cap_, hidden}, device));
  SY_ASSIGN_OR_RETURN(d->send_meta_, Buffer::ForTensor(probs_dtype, {d->send_cap_, 2 * k}, device));
  SY_ASSIGN_OR_RETURN(d->rank_probs_, Buffer::ForTensor(probs_dtype, {max_tokens, p}, device));
  SY_ASSIGN_OR_RETURN(d->d_rank_probs_, Buffer::ForTensor(probs_dtype, {max_tokens, p}, device));
  SY_ASSIGN_OR_RETURN(d->send_probs_, Buffer::ForTensor(probs_dtype, {d->send_cap_}, device));
  SY_RETURN_IF_ERROR(Zero(d->rank_probs_, device));
  SY_RETURN_IF_ERROR(Zero(d->send_probs_, device));
  SY_ASSIGN_OR_RETURN(d->counts_, Buffer::ForTensor(DType::kI32, {width}, device));
  SY_ASSIGN_OR_RETURN(d->gathered_counts_, Buffer::ForTensor(DType::kI32, {p, width}, device));
  SY_ASSIGN_OR_RETURN(
      d->all_counts_,
      Buffer::ForTensor(DType::kI32, {etp_size > 1 ? etp_size * p : 0, width}, device));
  SY_ASSIGN_OR_RETURN(d->tokens_per_expert_,
                      Buffer::ForTensor(DType::kI32, {d->num_local_}, device));
  // One workspace for the rank-level permutation (T_max tokens over P ranks) and the local one
  // (at most ETP * P * T_max received tokens over L experts): they never run at once.
  const int64_t ws =
      device.is_cuda()
          ? std::max(kernels::PermuteWorkspaceBytes(max_tokens, p),
                     kernels::PermuteWorkspaceBytes(etp_size * d->recv_bound_, d->num_local_))
          : 0;
  SY_ASSIGN_OR_RETURN(d->workspace_, Buffer::ForTensor(DType::kU8, {ws}, device));
  // Received and expert sides start at the balanced receipt plus a quarter and grow in Dispatch.
  const int64_t tokens_out = d->send_cap_, slots = max_tokens * k;  // per rank, at most
  SY_RETURN_IF_ERROR(d->GrowReceiveSide(std::min(d->recv_bound_, tokens_out + tokens_out / 4)));
  SY_RETURN_IF_ERROR(d->GrowExpertSide(std::min(d->expert_bound_, etp_size * (slots + slots / 4))));
  d->input_splits_.assign(ep_size, 0);
  d->output_splits_.assign(ep_size, 0);
  d->chunk_rows_.assign(etp_size * ep_size * d->num_local_, 0);
  d->tp_rows_.assign(etp_size, 0);
  // [ETP * EP * (E + P)] i32: the D2H target of the gathered counts.
  SY_RETURN_IF_ERROR(d->AllocateCountsStaging(etp_size * p * width * sizeof(int32_t)));
  return d;
}

absl::Status AllToAllDispatcher::GrowReceiveSide(int64_t recv_rows) {
  recv_cap_ = recv_rows;
  const int64_t rc = recv_rows, rt = etp_size_ > 1 ? etp_size_ * rc : 0, src = etp_size_ * rc,
                h = hidden_, k = topk_;
  // Release before allocating, so that growing never holds the old and the new buffers at once.
  // (On CUDA, cudaFree waits for the device, so no queued kernel still uses the old memory.)
  for (Buffer* b : {&recv_x_, &recv_meta_, &tp_x_, &tp_meta_, &padded_x_, &padded_dprobs_,
                    &local_idx_, &local_probs_, &local_map_}) {
    *b = Buffer();
  }
  SY_ASSIGN_OR_RETURN(recv_x_, Buffer::ForTensor(dtype_, {rc, h}, device_));
  SY_ASSIGN_OR_RETURN(recv_meta_, Buffer::ForTensor(probs_dtype_, {rc, 2 * k}, device_));
  SY_ASSIGN_OR_RETURN(tp_x_, Buffer::ForTensor(dtype_, {rt, h}, device_));
  SY_ASSIGN_OR_RETURN(tp_meta_, Buffer::ForTensor(probs_dtype_, {rt, 2 * k}, device_));
  SY_ASSIGN_OR_RETURN(padded_x_, Buffer::ForTensor(dtype_, {rt, h}, device_));
  SY_ASSIGN_OR_RETURN(padded_dprobs_, Buffer::ForTensor(probs_dtype_, {rt, k}, device_));
  SY_ASSIGN_OR_RETURN(local_idx_, Buffer::ForTensor(DType::kI32, {src, k}, device_));
  SY_ASSIGN_OR_RETURN(local_probs_, Buffer::ForTensor(probs_dtype_, {src, k}, device_));
  SY_ASSIGN_OR_RETURN(local_map_, Buffer::ForTensor(DType::kI32, {src, k}, device_));
  return absl::OkStatus();
}

absl::Status AllToAllDispatcher::GrowExpertSide(int64_t rows) {
  rows_ = rows;
  const int64_t r = rows, h = hidden_;
  for (Buffer* b : {&expert_x_, &expert_probs_, &expert_out_}) *b = Buffer();
  SY_ASSIGN_OR_RETURN(expert_x_, Buffer::ForTensor(dtype_, {r, h}, device_));
  SY_ASSIGN_OR_RETURN(expert_probs_, Buffer::ForTensor(probs_dtype_, {r}, device_));
  // expert_out, d_expert_out and d_expert_x share one buffer (see DispatchState in
  // dispatcher.h): the experts' output is dead once CombinePreprocess has summed it, and
  // d_expert_out once the experts' backward has read it, before it writes d_expert_x.
  SY_ASSIGN_OR_RETURN(expert_out_, Buffer::ForTensor(dtype_, {r, h}, device_));
  // The (possibly shared) scratch grows only; the backward views its first r rows.
  return d_expert_probs_->Reserve(r * DTypeSize(probs_dtype_));
}

Tensor AllToAllDispatcher::SourceRows() const {
  const Buffer& b = etp_size_ > 1 ? tp_x_ : recv_x_;
  return b.View(dtype_, {tp_total_rows_, hidden_});
}

Tensor AllToAllDispatcher::SourceMeta() const {
  const Buffer& b = etp_size_ > 1 ? tp_meta_ : recv_meta_;
  return b.View(probs_dtype_, {tp_total_rows_, 2 * static_cast<int64_t>(topk_)});
}

Tensor AllToAllDispatcher::LocalProbs() const {
  return local_probs_.View(probs_dtype_, {tp_total_rows_, topk_});
}

Tensor AllToAllDispatcher::LocalMap() const {
  return local_map_.View(DType::kI32, {tp_total_rows_, topk_});
}

absl::Status AllToAllDispatcher::ReduceScatterTp(const Stream& stream, const Tensor& rows,
                                                 const Tensor& padded, int64_t width,
                                                 const Tensor& out) {
  const Tensor in(rows.dtype, {etp_size_ * tp_max_rows_, width}, device_, padded.data);
  SY_RETURN_IF_ERROR(SpreadRows(stream, rows, tp_rows_, tp_max_rows_, width, in));
  return etp_->ReduceScatter(in, Tensor(rows.dtype, {tp_max_rows_, width}, device_, out.data),
                             comm::ReduceOp::kSum);
}

absl::Status AllToAllDispatcher::DispatchPreprocess(const Stream& stream, DispatchState* state) {
  SY_RETURN_IF_ERROR(phases_.Enter(PhaseTracker::kDispatchPreprocess, stream));
  const int64_t t = state->x.rank() == 2 ? state->x.dim(0) : -1;
  if (t < 0 || state->x.dim(1) != hidden_ || t > max_tokens_ || state->topk_idx.rank() != 2 ||
      state->topk_idx.dim(0) != t || state->topk_idx.dim(1) != topk_) {
    return absl::InvalidArgumentError(absl::StrCat("AllToAllDispatcher: x ", state->x.DebugString(),
                                                   " / topk_idx ", state->topk_idx.DebugString(),
                                                   " must be [T <= ", max_tokens_, ", ", hidden_,
                                                   "] / [T, ", topk_, "]"));
  }
  num_tokens_ = t;
  const int64_t p = ep_size_, k = topk_;
  rank_map_view_ = rank_map_.View(DType::kI32, {t, p});
  state->tokens_per_expert = tokens_per_expert_.View();
  // The expert-side views are handed out by Dispatch, which may grow their buffers.
  state->expert_x = Tensor();
  state->expert_probs = Tensor();
  state->expert_out = Tensor();
  const Tensor rank_idx = rank_idx_.View(DType::kI32, {t, p});
  const Tensor meta = meta_.View(probs_dtype_, {t, 2 * k});
  const Tensor rank_probs = rank_probs_.View(probs_dtype_, {t, p});
  int32_t* c = static_cast<int32_t*>(counts_.data());
  const Tensor n(DType::kI32, {num_experts_}, device_, c);
  const Tensor d(DType::kI32, {p}, device_, c + num_experts_);
  SY_RETURN_IF_ERROR(kernels::RouteToRanks(stream, state->topk_idx, state->topk_probs, num_experts_,
                                           p, rank_idx, meta));
  SY_RETURN_IF_ERROR(kernels::TokensPerExpert(stream, state->topk_idx, num_experts_, n));
  // Each token once per destination rank, rank-major, tokens ascending; its routing row with it
  // (the second Permute rewrites the same row map and counts).
  SY_RETURN_IF_ERROR(kernels::Permute(stream, state->x, rank_idx, rank_probs, p, 0, send_x_.View(),
                                      send_probs_.View(), rank_map_view_, d, workspace_.View(),
                                      send_cap_));
  SY_RETURN_IF_ERROR(kernels::Permute(stream, meta, rank_idx, rank_probs, p, 0, send_meta_.View(),
                                      send_probs_.View(), rank_map_view_, d, workspace_.View(),
                                      send_cap_));
  phases_.Done(PhaseTracker::kDispatchPreprocess);
  return absl::OkStatus();
}

absl::Status AllToAllDispatcher::ReadCounts(const int32_t* g_all) {
  const int p = ep_size_, l_count = num_local_, e_count = num_experts_;
  const int64_t width = p + e_count;
  auto g = [&](int t, int j, int64_t col) {
    return g_all[(static_cast<int64_t>(t) * p + j) * width + col];
  };
  // This peer's splits: token rows to / from each EP rank.
  sent_rows_ = 0;
  for (int j = 0; j < p; ++j) {
    input_splits_[j] = g(etp_rank_, ep_rank_, e_count + j);
    output_splits_[j] = g(etp_rank_, j, e_count + ep_rank_);
    sent_rows_ += input_splits_[j];
  }
  // Token rows each ETP peer received; expert rows per (peer, source, local expert).
  tp_total_rows_ = 0;
  tp_max_rows_ = 0;
  expert_rows_ = 0;
  for (int t = 0; t < etp_size_; ++t) {
    int64_t rows = 0;
    for (int j = 0; j < p; ++j) {
      rows += g(t, j, e_count + ep_rank_);
      for (int l = 0; l < l_count; ++l) {
        const int32_t c = g(t, j, static_cast<int64_t>(ep_rank_) * l_count + l);
        chunk_rows_[(t * p + j) * l_count + l] = c;
        expert_rows_ += c;
      }
    }
    tp_rows_[t] = rows;
    tp_total_rows_ += rows;
    tp_max_rows_ = std::max(tp_max_rows_, rows);
  }
  recv_rows_ = tp_rows_[etp_rank_];
  // The bounds and the limit, checked on the counts of EVERY rank of the ETP×EP block (each rank
  // holds them all, so every rank decides alike: a violation stops them all here, before any row
  // moves, instead of leaving the others waiting in the all-to-all).
  int64_t most_sent = 0, most_slots = 0, most_received = 0, most_expert_rows = 0;
  std::vector<int64_t> expert_rows(p, 0);  // per EP rank, over its ETP peers' receipts
  for (int t = 0; t < etp_size_; ++t) {
    std::vector<int64_t> received(p, 0);
    for (int j = 0; j < p; ++j) {
      int64_t sent = 0, slots = 0;
      for (int dst = 0; dst < p; ++dst) {
        sent += g(t, j, e_count + dst);
        received[dst] += g(t, j, e_count + dst);
      }
      for (int e = 0; e < e_count; ++e) {
        slots += g(t, j, e);
        expert_rows[e / l_count] += g(t, j, e);
      }
      most_sent = std::max(most_sent, sent);
      most_slots = std::max(most_slots, slots);
    }
    for (int64_t r : received) most_received = std::max(most_received, r);
  }
  for (int64_t r : expert_rows) most_expert_rows = std::max(most_expert_rows, r);
  if (most_sent > send_cap_ || most_slots > max_tokens_ * topk_ || most_received > recv_bound_ ||
      most_expert_rows > expert_bound_) {
    // impossible unless a peer broke the top-k contract or the counts were corrupted
    return Comm("dispatch (forward)",
                absl::InternalError(absl::StrCat(
                    "AllToAllDispatcher: ", most_sent, " token rows to send / ", most_slots,
                    " slots / ", most_received, " token rows to receive / ", most_expert_rows,
                    " expert rows exceed the bounds ", send_cap_, " / ", max_tokens_ * topk_, " / ",
                    recv_bound_, " / ", expert_bound_)));
  }
  if (expert_row_limit_ > 0) {
    for (int j = 0; j < p; ++j) {
      if (expert_rows[j] > expert_row_limit_) {
        return Comm(
            "dispatch (forward)",
            absl::ResourceExhaustedError(absl::StrCat(
                "EP rank ", j, " of group '", ep_->name(), "' would receive ", expert_rows[j],
                " expert rows, more than expert_row_limit ", expert_row_limit_,
                " (every rank of the group stops here, before the all-to-all)")));
      }
    }
  }
  // Buffers sized by the actual counts: grow to what this micro-batch needs plus a quarter (fewer
  // regrowths as the routing settles), never past the bound. The host already waited for the
  // counts, so this costs no extra synchronisation.
  if (tp_max_rows_ > recv_cap_) {
    SY_RETURN_IF_ERROR(
        GrowReceiveSide(std::min(recv_bound_, std::max(tp_max_rows_, recv_cap_ + recv_cap_ / 4))));
  }
  if (expert_rows_ > rows_) {
    SY_RETURN_IF_ERROR(
        GrowExpertSide(std::min(expert_bound_, std::max(expert_rows_, rows_ + rows_ / 4))));
  }
  return absl::OkStatus();
}

absl::Status AllToAllDispatcher::Dispatch(const Stream& stream, DispatchState* state) {
  SY_RETURN_IF_ERROR(phases_.Enter(PhaseTracker::kDispatch, stream));
  // G[j] = EP rank j's c = (n, d) (on the device for CUDA); with ETP, G'[t] is ETP peer t's G
  // (the spec's allgather over ETP×EP, reshaped [ETP, EP, E + P]).
  SY_RETURN_IF_ERROR(
      Comm("dispatch (forward)", ep_->AllGather(counts_.View(), gathered_counts_.View())));
  const kernels::Buffer& counts = etp_size_ > 1 ? all_counts_ : gathered_counts_;
  if (etp_size_ > 1)
    SY_RETURN_IF_ERROR(
        Comm("dispatch (forward)", etp_->AllGather(gathered_counts_.View(), counts.View())));
  const int32_t* g_all = counts.View().as<int32_t>();
  if (device_.is_cuda()) {
    // The one device-to-host copy of the micro-batch (see "Host synchronisation" in the header).
    const cudaStream_t s = stream.cuda_stream;
    const cudaEvent_t done = event_->cuda_event();
    int32_t* host_g = static_cast<int32_t*>(pinned_.get());
    SY_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host_g, counts.data(), counts.bytes(), cudaMemcpyDeviceToHost, s));
    SY_CUDA_RETURN_IF_ERROR(cudaEventRecord(done, s));
    // The all-gather(s) returned once enqueued (communicator.h, "Completion"): a bounded wait (the
    // groups' Synchronize, then the event, which then waits for local work only), so a stuck or
    // dead peer fails here naming the layer and phase instead of yielding garbage counts.
    comm::Communicator* const waited[] = {ep_, etp_size_ > 1 ? etp_ : nullptr};
    SY_RETURN_IF_ERROR(
        Comm("dispatch (forward)", comm::WaitEvent(waited, done, "the gathered token counts")));
    g_all = host_g;
  }
  SY_RETURN_IF_ERROR(ReadCounts(g_all));
  state->expert_x = expert_x_.View();
  state->expert_probs = expert_probs_.View();
  state->expert_out = expert_out_.View();
  const int64_t h = hidden_, m = 2 * static_cast<int64_t>(topk_);
  // The EP all-to-all of the token rows, then of their routing rows (same splits).
  SY_RETURN_IF_ERROR(Comm(
      "dispatch (forward)",
      ep_->AllToAllV(send_x_.View(dtype_, {sent_rows_, h}), RowsToElements(input_splits_, h),
                     recv_x_.View(dtype_, {recv_rows_, h}), RowsToElements(output_splits_, h))));
  SY_RETURN_IF_ERROR(
      Comm("dispatch (forward)", ep_->AllToAllV(send_meta_.View(probs_dtype_, {sent_rows_, m}),
                                                RowsToElements(input_splits_, m),
                                                recv_meta_.View(probs_dtype_, {recv_rows_, m}),
                                                RowsToElements(output_splits_, m))));
  if (etp_size_ > 1) {
    // The spec's AG(TP) after the EP all-to-all: every ETP peer gets every peer's receipt.
    SY_RETURN_IF_ERROR(
        Comm("dispatch (forward)", etp_->AllGatherV(recv_x_.View(dtype_, {recv_rows_, h}),
                                                    SourceRows(), RowsToElements(tp_rows_, h))));
    SY_RETURN_IF_ERROR(
        Comm("dispatch (forward)", etp_->AllGatherV(recv_meta_.View(probs_dtype_, {recv_rows_, m}),
                                                    SourceMeta(), RowsToElements(tp_rows_, m))));
  }
  phases_.Done(PhaseTracker::kDispatch);
  return absl::OkStatus();
}

absl::Status AllToAllDispatcher::DispatchPostprocess(const Stream& stream, DispatchState* state) {
  (void)state;
  SY_RETURN_IF_ERROR(phases_.Enter(PhaseTracker::kDispatchPostprocess, stream));
  // The received tokens over this rank's L experts: (etp, src, token) order within each expert.
  const Tensor local_idx = local_idx_.View(DType::kI32, {tp_total_rows_, topk_});
  SY_RETURN_IF_ERROR(kernels::LocalizeRouting(stream, SourceMeta(),
                                              static_cast<int64_t>(ep_rank_) * num_local_,
                                              num_local_, local_idx, LocalProbs()));
  SY_RETURN_IF_ERROR(kernels::Permute(stream, SourceRows(), local_idx, LocalProbs(), num_local_, 0,
                                      expert_x_.View(), expert_probs_.View(), LocalMap(),
                                      tokens_per_expert_.View(), workspace_.View(), rows_));
  phases_.Done(PhaseTracker::kDispatchPostprocess);
  return absl::OkStatus();
}

absl::Status AllToAllDispatcher::CombinePreprocess(const Stream& stream, DispatchState* state) {
  SY_RETURN_IF_ERROR(phases_.Enter(PhaseTracker::kCombinePreprocess, stream));
  // Each received token's local expert outputs, summed: the source rows are free again once the
  // experts have their input.
  SY_RETURN_IF_ERROR(kernels::Unpermute(stream, state->expert_out, LocalMap(), SourceRows()));
  phases_.Done(PhaseTracker::kCombinePreprocess);
  return absl::OkStatus();
}

absl::Status AllToAllDispatcher::Combine(const Stream& stream, DispatchState* state) {
  (void)state;
  SY_RETURN_IF_ERROR(phases_.Enter(PhaseTracker::kCombine, stream));
  const int64_t h = hidden_;
  if (etp_size_ > 1) {
    // The spec's RS(TP): sums the ETP partial fc2 outputs (row-parallel) and hands each peer back
    // the rows it received.
    SY_RETURN_IF_ERROR(
        Comm("combine (forward)",
             ReduceScatterTp(stream, SourceRows(), padded_x_.View(), h, recv_x_.View())));
  }
  SY_RETURN_IF_ERROR(Comm(
      "combine (forward)",
      ep_->AllToAllV(recv_x_.View(dtype_, {recv_rows_, h}), RowsToElements(output_splits_, h),
                     send_x_.View(dtype_, {sent_rows_, h}), RowsToElements(input_splits_, h))));
  phases_.Done(PhaseTracker::kCombine);
  return absl::OkStatus();
}

absl::Status AllToAllDispatcher::CombinePostprocess(const Stream& stream, DispatchState* state,
                                                    const Tensor& out) {
  (void)state;
  SY_RETURN_IF_ERROR(phases_.Enter(PhaseTracker::kCombinePostprocess, stream));
  // out[t] = the sum of its ranks' partial sums, in rank order.
  return kernels::Unpermute(stream, send_x_.View(), rank_map_view_, out);
}

absl::Status AllToAllDispatcher::CombineBackward(const Stream& stream, const Tensor& dout,
                                                 DispatchState* state) {
  SY_RETURN_IF_ERROR(phases_.EnterBackward("CombineBackward", stream));
  state->d_expert_out = expert_out_.View();
  state->d_expert_x = expert_out_.View();  // shares d_expert_out's memory (dispatcher.h)
  state->d_expert_probs = d_expert_probs_->View(probs_dtype_, {rows_});
  const int64_t h = hidden_;
  // Adjoint of the rank-level Unpermute (dout[t] to each of t's ranks), of the combine all-to-all
  // (the dispatch direction), of the ETP reduce-scatter (an all-gather) and of the local
  // Unpermute (dout[t] to each of t's local expert rows).
  SY_RETURN_IF_ERROR(kernels::UnpermuteBackward(stream, dout, rank_map_view_, send_x_.View(),
                                                /*zero_unmapped_rows=*/false));
  SY_RETURN_IF_ERROR(Comm(
      "combine (backward)",
      ep_->AllToAllV(send_x_.View(dtype_, {sent_rows_, h}), RowsToElements(input_splits_, h),
                     recv_x_.View(dtype_, {recv_rows_, h}), RowsToElements(output_splits_, h))));
  if (etp_size_ > 1) {
    SY_RETURN_IF_ERROR(
        Comm("combine (backward)", etp_->AllGatherV(recv_x_.View(dtype_, {recv_rows_, h}),
                                                    SourceRows(), RowsToElements(tp_rows_, h))));
  }
  return kernels::UnpermuteBackward(stream, SourceRows(), LocalMap(), state->d_expert_out,
                                    /*zero_unmapped_rows=*/false);
}

absl::Status AllToAllDispatcher::DispatchBackward(const Stream& stream, DispatchState* state,
                                                  const Tensor& dx, const Tensor& d_topk_probs) {
  SY_RETURN_IF_ERROR(phases_.EnterBackward("DispatchBackward", stream));
  const int64_t h = hidden_, k = topk_;
  // Per received token: the sum of its local expert rows' input gradients, and the gradient of
  // each of its slots' probs (0 for other ranks' slots). local_probs_ is free since the Permute.
  // With ETP = 1 the source rows ARE recv_x_, and the prob gradients go straight to
  // recv_meta_'s [.., k] view (the routing rows are dead since DispatchPostprocess).
  const Tensor recv_dprobs = recv_meta_.View(probs_dtype_, {recv_rows_, k});
  SY_RETURN_IF_ERROR(kernels::PermuteBackward(stream, state->d_expert_x, state->d_expert_probs,
                                              LocalMap(), SourceRows(),
                                              etp_size_ > 1 ? LocalProbs() : recv_dprobs));
  if (etp_size_ > 1) {
    // Adjoint of the ETP all-gather: each peer's F slice gave a partial input (and prob)
    // gradient of every gathered row; the sums of this peer's rows come back to it.
    SY_RETURN_IF_ERROR(
        Comm("dispatch (backward)",
             ReduceScatterTp(stream, SourceRows(), padded_x_.View(), h, recv_x_.View())));
    SY_RETURN_IF_ERROR(
        Comm("dispatch (backward)",
             ReduceScatterTp(stream, LocalProbs(), padded_dprobs_.View(), k, recv_dprobs)));
  }
  const Tensor send_dprobs = send_meta_.View(probs_dtype_, {send_cap_, k});
  SY_RETURN_IF_ERROR(Comm(
      "dispatch (backward)",
      ep_->AllToAllV(recv_x_.View(dtype_, {recv_rows_, h}), RowsToElements(output_splits_, h),
                     send_x_.View(dtype_, {sent_rows_, h}), RowsToElements(input_splits_, h))));
  SY_RETURN_IF_ERROR(
      Comm("dispatch (backward)", ep_->AllToAllV(recv_dprobs, RowsToElements(output_splits_, k),
                                                 send_meta_.View(probs_dtype_, {sent_rows_, k}),
                                                 RowsToElements(input_splits_, k))));
  // dx[t] = the sum of its ranks' partial gradients (rank order); d_topk_probs[t, s] from the
  // one rank that owns slot s (the others contribute exact zeros).
  const Tensor d_rank_probs = d_rank_probs_.View(probs_dtype_, {num_tokens_, ep_size_});
  SY_RETURN_IF_ERROR(kernels::PermuteBackward(stream, send_x_.View(), send_probs_.View(),
                                              rank_map_view_, dx, d_rank_probs));
  return kernels::PermuteBackward(stream, send_dprobs, send_probs_.View(), rank_map_view_,
                                  d_topk_probs, d_rank_probs);
}

}  // namespace switchyard::model
