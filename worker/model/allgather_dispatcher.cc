#include "worker/model/allgather_dispatcher.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/moe/permute.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::model {

using kernels::Buffer;

absl::StatusOr<std::unique_ptr<AllGatherDispatcher>> AllGatherDispatcher::Create(
    comm::Communicator* ep_group, Device device, DType dtype, DType probs_dtype, int64_t max_tokens,
    int64_t hidden, int num_experts, int ep_size, int topk, int etp_size, std::string label,
    const DispatcherGradScratch& grad) {
  // The group is ETP×EP (ETP-fastest, Megatron's tp-ep group): its size must be their product,
  // and the expert rules below are those of the EP factor alone.
  if (etp_size < 1 || (ep_group != nullptr && ep_group->size() != ep_size * etp_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllGatherDispatcher: ep_size (", ep_size, ") x etp_size (", etp_size,
                     ") must equal the size of group '", ep_group ? ep_group->name() : "", "' (",
                     ep_group ? ep_group->size() : 0, ") and etp_size must be >= 1"));
  }
  SY_RETURN_IF_ERROR(CheckExpertParallelArgs(
      "AllGatherDispatcher", ep_group, ep_group ? ep_group->size() / etp_size : 0,
      ep_group ? ep_group->name() : "", max_tokens, hidden, num_experts, ep_size, topk));
  SY_ASSIGN_OR_RETURN(comm::NcclCommunicator * nccl,
                      NcclGroupForDevice("AllGatherDispatcher", ep_group, device));
  if (device.is_cuda()) {
    if (num_experts / ep_size > kernels::kMaxExpertsCuda) {
      return absl::InvalidArgumentError(
          absl::StrCat("AllGatherDispatcher: num_experts / ep_size (", num_experts / ep_size,
                       ") must be <= ", kernels::kMaxExpertsCuda, " on CUDA"));
    }
  }
  std::unique_ptr<AllGatherDispatcher> d(new AllGatherDispatcher());
  d->InitExpertParallel("AllGatherDispatcher", ep_group, nccl, device, dtype, probs_dtype,
                        max_tokens, hidden, num_experts, ep_size, topk, std::move(label));
  d->group_size_ = ep_size * etp_size;
  // Group rank = ep_rank * ETP + etp_rank: the ETP peers of one EP rank hold the same experts.
  d->ep_rank_ = ep_group->rank() / etp_size;
  const int64_t g = static_cast<int64_t>(d->group_size_) * max_tokens;
  // Permute's dropless contract on the global batch: >= T' * k rows.
  d->rows_ = g * topk;
  const int64_t r = d->rows_;
  SY_ASSIGN_OR_RETURN(d->my_count_, Buffer::ForTensor(DType::kI32, {1}, device));
  SY_ASSIGN_OR_RETURN(d->counts_, Buffer::ForTensor(DType::kI32, {d->group_size_}, device));
  SY_ASSIGN_OR_RETURN(d->global_x_, Buffer::ForTensor(dtype, {g, hidden}, device));
  SY_ASSIGN_OR_RETURN(d->global_idx_, Buffer::ForTensor(DType::kI32, {g, topk}, device));
  SY_ASSIGN_OR_RETURN(d->local_idx_, Buffer::ForTensor(DType::kI32, {g, topk}, device));
  SY_ASSIGN_OR_RETURN(d->global_probs_, Buffer::ForTensor(probs_dtype, {g, topk}, device));
  SY_ASSIGN_OR_RETURN(d->row_map_, Buffer::ForTensor(DType::kI32, {g, topk}, device));
  SY_ASSIGN_OR_RETURN(d->global_y_, Buffer::ForTensor(dtype, {g, hidden}, device));
  SY_ASSIGN_OR_RETURN(d->padded_y_, Buffer::ForTensor(dtype, {g, hidden}, device));
  SY_ASSIGN_OR_RETURN(d->padded_probs_, Buffer::ForTensor(probs_dtype, {g, topk}, device));
  SY_ASSIGN_OR_RETURN(d->global_d_probs_, Buffer::ForTensor(probs_dtype, {g, topk}, device));
  const int64_t ws = device.is_cuda() ? kernels::PermuteWorkspaceBytes(g, d->num_local_) : 0;
  SY_ASSIGN_OR_RETURN(d->workspace_, Buffer::ForTensor(DType::kU8, {ws}, device));
  SY_ASSIGN_OR_RETURN(d->reduced_y_, Buffer::ForTensor(dtype, {max_tokens, hidden}, device));
  SY_ASSIGN_OR_RETURN(d->reduced_probs_,
                      Buffer::ForTensor(probs_dtype, {max_tokens, topk}, device));

  SY_ASSIGN_OR_RETURN(d->expert_x_, Buffer::ForTensor(dtype, {r, hidden}, device));
  SY_ASSIGN_OR_RETURN(d->expert_probs_, Buffer::ForTensor(probs_dtype, {r}, device));
  SY_ASSIGN_OR_RETURN(d->tokens_per_expert_,
                      Buffer::ForTensor(DType::kI32, {d->num_local_}, device));
  SY_ASSIGN_OR_RETURN(d->expert_out_, Buffer::ForTensor(dtype, {r, hidden}, device));
  SY_RETURN_IF_ERROR(d->grad_.Bind(grad, device, r, hidden, dtype, probs_dtype));
  d->tokens_per_rank_.assign(d->group_size_, 0);
  // [EP] gathered counts, then one word staging this rank's T (see "Host synchronisation").
  SY_RETURN_IF_ERROR(d->AllocateCountsStaging((d->group_size_ + 1) * sizeof(int32_t)));
  return d;
}

absl::Status AllGatherDispatcher::CopyOnStream(const Stream& stream, const Tensor& src,
                                               const Tensor& dst, const char* what) const {
  if (src.dtype != dst.dtype || src.numel() != dst.numel() ||
      (src.bytes() > 0 && dst.device != device_)) {
    return absl::InvalidArgumentError(absl::StrCat("AllGatherDispatcher: ", what, " ",
                                                   dst.DebugString(), " must match ",
                                                   src.DebugString(), " on ", device_.ToString()));
  }
  if (src.bytes() == 0) return absl::OkStatus();
  if (!device_.is_cuda()) return kernels::CopyTensor(src, dst);
  SY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDeviceToDevice,
                                          stream.cuda_stream));
  return absl::OkStatus();
}

std::vector<int64_t> AllGatherDispatcher::Elements(int64_t per_row) const {
  return RowsToElements(tokens_per_rank_, per_row);
}

absl::Status AllGatherDispatcher::Spread(const Stream& stream, const Tensor& compact,
                                         const Tensor& padded, int64_t width) const {
  return SpreadRows(stream, compact, tokens_per_rank_, max_rank_tokens_, width, padded);
}

absl::Status AllGatherDispatcher::DispatchPreprocess(const Stream& stream, DispatchState* state) {
  SY_RETURN_IF_ERROR(phases_.Enter(PhaseTracker::kDispatchPreprocess, stream));
  const int64_t t = state->x.rank() == 2 ? state->x.dim(0) : -1;
  if (t < 0 || state->x.dim(1) != hidden_ || t > max_tokens_ || state->x.dtype != dtype_ ||
      state->topk_idx.rank() != 2 || state->topk_idx.dim(0) != t ||
      state->topk_idx.dim(1) != topk_ || state->topk_idx.dtype != DType::kI32 ||
      state->topk_probs.rank() != 2 || state->topk_probs.dim(0) != t ||
      state->topk_probs.dim(1) != topk_ || state->topk_probs.dtype != probs_dtype_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllGatherDispatcher: x ", state->x.DebugString(), " / topk_idx ",
        state->topk_idx.DebugString(), " / topk_probs ", state->topk_probs.DebugString(),
        " must be [T <= ", max_tokens_, ", ", hidden_, "] of the activation dtype / [T, ", topk_,
        "] i32 / [T, ", topk_, "] of the probs dtype"));
  }
  if ((t > 0 && state->x.device != device_) ||
      (t > 0 && (state->topk_idx.device != device_ || state->topk_probs.device != device_))) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllGatherDispatcher: x / topk_idx / topk_probs (", state->x.DebugString(),
                     ") must be on the dispatcher's device ", device_.ToString()));
  }
  num_tokens_ = t;
  inputs_.x = state->x;
  inputs_.topk_idx = state->topk_idx;
  inputs_.topk_probs = state->topk_probs;
  state->expert_x = expert_x_.View();
  state->expert_probs = expert_probs_.View();
  state->tokens_per_expert = tokens_per_expert_.View();
  state->expert_out = expert_out_.View();
  phases_.Done(PhaseTracker::kDispatchPreprocess);
  return absl::OkStatus();
}

absl::Status AllGatherDispatcher::Dispatch(const Stream& stream, DispatchState* state) {
  (void)state;
  SY_RETURN_IF_ERROR(phases_.Enter(PhaseTracker::kDispatch, stream));
  const cudaStream_t cs = stream.cuda_stream;
  int32_t* host_counts = static_cast<int32_t*>(pinned_.get());  // CUDA only
  if (device_.is_cuda()) {
    // The pinned word is free: the previous Dispatch waited (WaitEvent below) for an event
    // recorded after the previous H2D from it (same stream).
    host_counts[group_size_] = static_cast<int32_t>(num_tokens_);
    SY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(my_count_.data(), host_counts + group_size_,
                                            sizeof(int32_t), cudaMemcpyHostToDevice, cs));
  } else {
    my_count_.View().as<int32_t>()[0] = static_cast<int32_t>(num_tokens_);
  }
  SY_RETURN_IF_ERROR(Comm("dispatch (forward)", ep_->AllGather(my_count_.View(), counts_.View())));
  const int32_t* c = counts_.View().as<int32_t>();
  if (device_.is_cuda()) {
    // The one device-to-host copy of the micro-batch (see "Host synchronisation" in the header).
    const cudaEvent_t done = event_->cuda_event();
    SY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        host_counts, counts_.data(), group_size_ * sizeof(int32_t), cudaMemcpyDeviceToHost, cs));
    SY_CUDA_RETURN_IF_ERROR(cudaEventRecord(done, cs));
    // The AllGather returned once enqueued: a bounded wait (the EP group's Synchronize, then the
    // event, which then waits for local work only), so a stuck peer fails here naming the layer.
    SY_RETURN_IF_ERROR(
        Comm("dispatch (forward)", comm::WaitEvent(*ep_, done, "the gathered token counts")));
    c = host_counts;
  }
  global_tokens_ = 0;
  max_rank_tokens_ = 0;
  for (int j = 0; j < group_size_; ++j) {
    if (c[j] < 0 || c[j] > max_tokens_) {  // a peer broke the max_tokens contract
      return absl::InternalError(absl::StrCat("AllGatherDispatcher: EP rank ", j, " has ", c[j],
                                              " tokens; max_tokens is ", max_tokens_));
    }
    tokens_per_rank_[j] = c[j];
    global_tokens_ += c[j];
    max_rank_tokens_ = std::max<int64_t>(max_rank_tokens_, c[j]);
  }
  const int64_t g = global_tokens_;
  SY_RETURN_IF_ERROR(
      Comm("dispatch (forward)",
           ep_->AllGatherV(inputs_.x, global_x_.View(dtype_, {g, hidden_}), Elements(hidden_))));
  SY_RETURN_IF_ERROR(
      Comm("dispatch (forward)",
           ep_->AllGatherV(inputs_.topk_idx, global_idx_.View(DType::kI32, {g, topk_}),
                           Elements(topk_))));
  SY_RETURN_IF_ERROR(
      Comm("dispatch (forward)",
           ep_->AllGatherV(inputs_.topk_probs, global_probs_.View(probs_dtype_, {g, topk_}),
                           Elements(topk_))));
  phases_.Done(PhaseTracker::kDispatch);
  return absl::OkStatus();
}

absl::Status AllGatherDispatcher::DispatchPostprocess(const Stream& stream, DispatchState* state) {
  (void)state;
  SY_RETURN_IF_ERROR(phases_.Enter(PhaseTracker::kDispatchPostprocess, stream));
  const int64_t g = global_tokens_;
  // Keep the slots routed to this rank's experts, renumbered to local ids (spec: routing_map[:,
  // local experts]).
  const int32_t first = ep_rank_ * num_local_;
  if (device_.is_cuda()) {
    SY_RETURN_IF_ERROR(
        internal::LocalExpertIdsCuda(stream, global_idx_.View(DType::kI32, {g, topk_}), first,
                                     num_local_, local_idx_.View(DType::kI32, {g, topk_})));
  } else {
    const int32_t* gi = global_idx_.View().as<int32_t>();
    int32_t* li = local_idx_.View().as<int32_t>();
    for (int64_t i = 0; i < g * topk_; ++i) {
      li[i] = gi[i] >= first && gi[i] < first + num_local_ ? gi[i] - first : -1;
    }
  }
  row_map_view_ = row_map_.View(DType::kI32, {g, topk_});
  SY_RETURN_IF_ERROR(kernels::Permute(
      stream, global_x_.View(dtype_, {g, hidden_}), local_idx_.View(DType::kI32, {g, topk_}),
      global_probs_.View(probs_dtype_, {g, topk_}), num_local_, 0, expert_x_.View(),
      expert_probs_.View(), row_map_view_, tokens_per_expert_.View(), workspace_.View()));
  phases_.Done(PhaseTracker::kDispatchPostprocess);
  return absl::OkStatus();
}

absl::Status AllGatherDispatcher::CombinePreprocess(const Stream& stream, DispatchState* state) {
  SY_RETURN_IF_ERROR(phases_.Enter(PhaseTracker::kCombinePreprocess, stream));
  // Per global token, the sum of its slots on this rank's experts (zeros when it has none).
  SY_RETURN_IF_ERROR(kernels::Unpermute(stream, state->expert_out, row_map_view_,
                                        global_y_.View(dtype_, {global_tokens_, hidden_})));
  phases_.Done(PhaseTracker::kCombinePreprocess);
  return absl::OkStatus();
}

absl::Status AllGatherDispatcher::Combine(const Stream& stream, DispatchState* state) {
  (void)state;
  SY_RETURN_IF_ERROR(phases_.Enter(PhaseTracker::kCombine, stream));
  const Tensor padded = padded_y_.View(dtype_, {group_size_ * max_rank_tokens_, hidden_});
  SY_RETURN_IF_ERROR(Spread(stream, global_y_.View(), padded, hidden_));
  SY_RETURN_IF_ERROR(
      Comm("combine (forward)",
           ep_->ReduceScatter(padded, reduced_y_.View(dtype_, {max_rank_tokens_, hidden_}),
                              comm::ReduceOp::kSum)));
  phases_.Done(PhaseTracker::kCombine);
  return absl::OkStatus();
}

absl::Status AllGatherDispatcher::CombinePostprocess(const Stream& stream, DispatchState* state,
                                                     const Tensor& out) {
  (void)state;
  SY_RETURN_IF_ERROR(phases_.Enter(PhaseTracker::kCombinePostprocess, stream));
  return CopyOnStream(stream, reduced_y_.View(dtype_, {num_tokens_, hidden_}), out,
                      "CombinePostprocess: out");
}

absl::Status AllGatherDispatcher::CombineBackward(const Stream& stream, const Tensor& dout,
                                                  DispatchState* state) {
  SY_RETURN_IF_ERROR(phases_.EnterBackward("CombineBackward", stream));
  if (dout.rank() != 2 || dout.dim(0) != num_tokens_ || dout.dim(1) != hidden_ ||
      dout.dtype != dtype_) {
    return absl::InvalidArgumentError(absl::StrCat("AllGatherDispatcher: dout ", dout.DebugString(),
                                                   " must be [", num_tokens_, ", ", hidden_,
                                                   "] of the activation dtype"));
  }
  grad_.Fill(state);
  // Adjoint of the reduce-scatter (all-gather), then of Unpermute.
  const Tensor global_dout = global_y_.View(dtype_, {global_tokens_, hidden_});
  SY_RETURN_IF_ERROR(
      Comm("combine (backward)", ep_->AllGatherV(dout, global_dout, Elements(hidden_))));
  return kernels::UnpermuteBackward(stream, global_dout, row_map_view_, state->d_expert_out,
                                    /*zero_unmapped_rows=*/false);
}

absl::Status AllGatherDispatcher::DispatchBackward(const Stream& stream, DispatchState* state,
                                                   const Tensor& dx, const Tensor& d_topk_probs) {
  SY_RETURN_IF_ERROR(phases_.EnterBackward("DispatchBackward", stream));
  const int64_t g = global_tokens_, tm = max_rank_tokens_;
  // Adjoint of Permute over the global batch: this rank's share of every token's gradient (slots
  // on other ranks' experts contribute 0), then of the all-gathers (reduce-scatter).
  const Tensor global_dx = global_y_.View(dtype_, {g, hidden_});
  const Tensor global_dp = global_d_probs_.View(probs_dtype_, {g, topk_});
  SY_RETURN_IF_ERROR(kernels::PermuteBackward(stream, state->d_expert_x, state->d_expert_probs,
                                              row_map_view_, global_dx, global_dp));
  const Tensor padded_x = padded_y_.View(dtype_, {group_size_ * tm, hidden_});
  const Tensor padded_p = padded_probs_.View(probs_dtype_, {group_size_ * tm, topk_});
  SY_RETURN_IF_ERROR(Spread(stream, global_dx, padded_x, hidden_));
  SY_RETURN_IF_ERROR(Spread(stream, global_dp, padded_p, topk_));
  SY_RETURN_IF_ERROR(Comm(
      "dispatch (backward)",
      ep_->ReduceScatter(padded_x, reduced_y_.View(dtype_, {tm, hidden_}), comm::ReduceOp::kSum)));
  SY_RETURN_IF_ERROR(
      Comm("dispatch (backward)",
           ep_->ReduceScatter(padded_p, reduced_probs_.View(probs_dtype_, {tm, topk_}),
                              comm::ReduceOp::kSum)));
  SY_RETURN_IF_ERROR(CopyOnStream(stream, reduced_y_.View(dtype_, {num_tokens_, hidden_}), dx,
                                  "DispatchBackward: dx"));
  return CopyOnStream(stream, reduced_probs_.View(probs_dtype_, {num_tokens_, topk_}), d_topk_probs,
                      "DispatchBackward: d_topk_probs");
}

}  // namespace switchyard::model
