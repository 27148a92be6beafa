#include "worker/model/allgather_dispatcher.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/moe/permute.h"

namespace switchyard::model {

using kernels::Buffer;

namespace {

absl::Status OutOfOrder(const char* phase, const char* needs) {
  return absl::FailedPreconditionError(
      absl::StrCat("AllGatherDispatcher::", phase, " must follow ", needs));
}

}  // namespace

absl::StatusOr<std::unique_ptr<AllGatherDispatcher>> AllGatherDispatcher::Create(
    comm::Communicator* ep_group, Device device, DType dtype, DType probs_dtype, int64_t max_tokens,
    int64_t hidden, int num_experts, int ep_size, int topk) {
  SY_RETURN_IF_ERROR(CheckExpertParallelArgs(
      "AllGatherDispatcher", ep_group, ep_group ? ep_group->size() : 0,
      ep_group ? ep_group->name() : "", max_tokens, hidden, num_experts, ep_size, topk));
  if (device.is_cuda()) {
    // TODO(cuda): the CUDA path needs the gathered token counts T_j on the host before the
    // AllGatherV of the rows (spec §3.2 "host synchronisation design"): one small non-blocking D2H
    // copy of the all-gathered [EP] i32 counts into pinned memory and one event sync (or, when
    // every rank is known to hold max_tokens, a plain AllGather with no sync at all). The
    // local-expert filter of topk_idx needs a small kernel (ids outside [r*L, (r+1)*L) -> -1,
    // others -= r*L), Spread becomes one cudaMemcpy2DAsync per rank + a memset of the padding,
    // and the gathers / reduce-scatters go through NcclCommunicator on `stream`. Until then only
    // the CPU (Gloo) path exists.
    return absl::UnimplementedError(
        "AllGatherDispatcher: only the CPU path exists (CUDA needs the D2H count copy, a "
        "local-expert filter kernel and NCCL collectives; see the TODO in "
        "allgather_dispatcher.cc)");
  }
  std::unique_ptr<AllGatherDispatcher> d(new AllGatherDispatcher());
  d->ep_ = ep_group;
  d->ep_size_ = ep_size;
  d->ep_rank_ = ep_group->rank();
  d->num_experts_ = num_experts;
  d->num_local_ = num_experts / ep_size;
  d->topk_ = topk;
  d->hidden_ = hidden;
  d->max_tokens_ = max_tokens;
  d->dtype_ = dtype;
  d->probs_dtype_ = probs_dtype;
  const int64_t g = ep_size * max_tokens;
  // Permute's dropless contract on the global batch: >= T' * k rows.
  d->rows_ = g * topk;
  const int64_t r = d->rows_;
  SY_ASSIGN_OR_RETURN(d->my_count_, Buffer::ForTensor(DType::kI32, {1}, device));
  SY_ASSIGN_OR_RETURN(d->counts_, Buffer::ForTensor(DType::kI32, {ep_size}, device));
  SY_ASSIGN_OR_RETURN(d->global_x_, Buffer::ForTensor(dtype, {g, hidden}, device));
  SY_ASSIGN_OR_RETURN(d->global_idx_, Buffer::ForTensor(DType::kI32, {g, topk}, device));
  SY_ASSIGN_OR_RETURN(d->local_idx_, Buffer::ForTensor(DType::kI32, {g, topk}, device));
  SY_ASSIGN_OR_RETURN(d->global_probs_, Buffer::ForTensor(probs_dtype, {g, topk}, device));
  SY_ASSIGN_OR_RETURN(d->row_map_, Buffer::ForTensor(DType::kI32, {g, topk}, device));
  SY_ASSIGN_OR_RETURN(d->global_y_, Buffer::ForTensor(dtype, {g, hidden}, device));
  SY_ASSIGN_OR_RETURN(d->padded_y_, Buffer::ForTensor(dtype, {g, hidden}, device));
  SY_ASSIGN_OR_RETURN(d->padded_probs_, Buffer::ForTensor(probs_dtype, {g, topk}, device));
  SY_ASSIGN_OR_RETURN(d->global_d_probs_, Buffer::ForTensor(probs_dtype, {g, topk}, device));
  SY_ASSIGN_OR_RETURN(d->workspace_, Buffer::ForTensor(DType::kU8, {0}, device));
  SY_ASSIGN_OR_RETURN(d->reduced_y_, Buffer::ForTensor(dtype, {max_tokens, hidden}, device));
  SY_ASSIGN_OR_RETURN(d->reduced_probs_,
                      Buffer::ForTensor(probs_dtype, {max_tokens, topk}, device));

  SY_ASSIGN_OR_RETURN(d->expert_x_, Buffer::ForTensor(dtype, {r, hidden}, device));
  SY_ASSIGN_OR_RETURN(d->expert_probs_, Buffer::ForTensor(probs_dtype, {r}, device));
  SY_ASSIGN_OR_RETURN(d->tokens_per_expert_,
                      Buffer::ForTensor(DType::kI32, {d->num_local_}, device));
  SY_ASSIGN_OR_RETURN(d->expert_out_, Buffer::ForTensor(dtype, {r, hidden}, device));
  SY_ASSIGN_OR_RETURN(d->d_expert_out_, Buffer::ForTensor(dtype, {r, hidden}, device));
  SY_ASSIGN_OR_RETURN(d->d_expert_x_, Buffer::ForTensor(dtype, {r, hidden}, device));
  SY_ASSIGN_OR_RETURN(d->d_expert_probs_, Buffer::ForTensor(probs_dtype, {r}, device));
  d->tokens_per_rank_.assign(ep_size, 0);
  return d;
}

std::vector<int64_t> AllGatherDispatcher::Elements(int64_t per_row) const {
  std::vector<int64_t> e(tokens_per_rank_.size());
  for (size_t i = 0; i < e.size(); ++i) e[i] = tokens_per_rank_[i] * per_row;
  return e;
}

void AllGatherDispatcher::Spread(const Tensor& compact, const Tensor& padded, int64_t width) const {
  const int64_t row_bytes = width * DTypeSize(compact.dtype);
  const char* src = static_cast<const char*>(compact.data);
  char* dst = static_cast<char*>(padded.data);
  int64_t first = 0;
  for (int j = 0; j < ep_size_; ++j) {
    const int64_t n = tokens_per_rank_[j];
    char* chunk = dst + j * max_rank_tokens_ * row_bytes;
    if (n > 0) std::memcpy(chunk, src + first * row_bytes, n * row_bytes);
    if (n < max_rank_tokens_)
      std::memset(chunk + n * row_bytes, 0, (max_rank_tokens_ - n) * row_bytes);
    first += n;
  }
}

absl::Status AllGatherDispatcher::DispatchPreprocess(const Stream& stream, DispatchState* state) {
  (void)stream;
  phase_ = Phase::kIdle;
  have_forward_ = false;
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
  num_tokens_ = t;
  inputs_.x = state->x;
  inputs_.topk_idx = state->topk_idx;
  inputs_.topk_probs = state->topk_probs;
  state->expert_x = expert_x_.View();
  state->expert_probs = expert_probs_.View();
  state->tokens_per_expert = tokens_per_expert_.View();
  state->expert_out = expert_out_.View();
  phase_ = Phase::kPreprocessed;
  return absl::OkStatus();
}

absl::Status AllGatherDispatcher::Dispatch(const Stream& stream, DispatchState* state) {
  (void)stream;
  (void)state;
  if (phase_ != Phase::kPreprocessed) return OutOfOrder("Dispatch", "DispatchPreprocess");
  my_count_.View().as<int32_t>()[0] = static_cast<int32_t>(num_tokens_);
  SY_RETURN_IF_ERROR(ep_->AllGather(my_count_.View(), counts_.View()));
  // CPU: the counts are host memory (see the CUDA TODO in Create).
  const int32_t* c = counts_.View().as<int32_t>();
  global_tokens_ = 0;
  max_rank_tokens_ = 0;
  for (int j = 0; j < ep_size_; ++j) {
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
      ep_->AllGatherV(inputs_.x, global_x_.View(dtype_, {g, hidden_}), Elements(hidden_)));
  SY_RETURN_IF_ERROR(ep_->AllGatherV(inputs_.topk_idx, global_idx_.View(DType::kI32, {g, topk_}),
                                     Elements(topk_)));
  SY_RETURN_IF_ERROR(ep_->AllGatherV(
      inputs_.topk_probs, global_probs_.View(probs_dtype_, {g, topk_}), Elements(topk_)));
  phase_ = Phase::kDispatched;
  return absl::OkStatus();
}

absl::Status AllGatherDispatcher::DispatchPostprocess(const Stream& stream, DispatchState* state) {
  (void)state;
  if (phase_ != Phase::kDispatched) return OutOfOrder("DispatchPostprocess", "Dispatch");
  const int64_t g = global_tokens_;
  // Keep the slots routed to this rank's experts, renumbered to local ids (spec: routing_map[:,
  // local experts]).
  const int32_t* gi = global_idx_.View().as<int32_t>();
  int32_t* li = local_idx_.View().as<int32_t>();
  const int32_t first = ep_rank_ * num_local_;
  for (int64_t i = 0; i < g * topk_; ++i) {
    li[i] = gi[i] >= first && gi[i] < first + num_local_ ? gi[i] - first : -1;
  }
  row_map_view_ = row_map_.View(DType::kI32, {g, topk_});
  SY_RETURN_IF_ERROR(kernels::Permute(
      stream, global_x_.View(dtype_, {g, hidden_}), local_idx_.View(DType::kI32, {g, topk_}),
      global_probs_.View(probs_dtype_, {g, topk_}), num_local_, 0, expert_x_.View(),
      expert_probs_.View(), row_map_view_, tokens_per_expert_.View(), workspace_.View()));
  phase_ = Phase::kPostprocessed;
  have_forward_ = true;
  return absl::OkStatus();
}

absl::Status AllGatherDispatcher::CombinePreprocess(const Stream& stream, DispatchState* state) {
  if (phase_ != Phase::kPostprocessed) {
    return OutOfOrder("CombinePreprocess", "DispatchPostprocess");
  }
  // Per global token, the sum of its slots on this rank's experts (zeros when it has none).
  SY_RETURN_IF_ERROR(kernels::Unpermute(stream, state->expert_out, row_map_view_,
                                        global_y_.View(dtype_, {global_tokens_, hidden_})));
  phase_ = Phase::kCombinePre;
  return absl::OkStatus();
}

absl::Status AllGatherDispatcher::Combine(const Stream& stream, DispatchState* state) {
  (void)stream;
  (void)state;
  if (phase_ != Phase::kCombinePre) return OutOfOrder("Combine", "CombinePreprocess");
  const Tensor padded = padded_y_.View(dtype_, {ep_size_ * max_rank_tokens_, hidden_});
  Spread(global_y_.View(), padded, hidden_);
  SY_RETURN_IF_ERROR(ep_->ReduceScatter(
      padded, reduced_y_.View(dtype_, {max_rank_tokens_, hidden_}), comm::ReduceOp::kSum));
  phase_ = Phase::kCombined;
  return absl::OkStatus();
}

absl::Status AllGatherDispatcher::CombinePostprocess(const Stream& stream, DispatchState* state,
                                                     const Tensor& out) {
  (void)stream;
  (void)state;
  if (phase_ != Phase::kCombined) return OutOfOrder("CombinePostprocess", "Combine");
  phase_ = Phase::kIdle;
  return Annotate(kernels::CopyTensor(reduced_y_.View(dtype_, {num_tokens_, hidden_}), out),
                  "AllGatherDispatcher::CombinePostprocess (out)");
}

absl::Status AllGatherDispatcher::CombineBackward(const Stream& stream, const Tensor& dout,
                                                  DispatchState* state) {
  if (!have_forward_) return OutOfOrder("CombineBackward", "a forward DispatchPostprocess");
  if (dout.rank() != 2 || dout.dim(0) != num_tokens_ || dout.dim(1) != hidden_ ||
      dout.dtype != dtype_) {
    return absl::InvalidArgumentError(absl::StrCat("AllGatherDispatcher: dout ", dout.DebugString(),
                                                   " must be [", num_tokens_, ", ", hidden_,
                                                   "] of the activation dtype"));
  }
  state->d_expert_out = d_expert_out_.View();
  state->d_expert_x = d_expert_x_.View();
  state->d_expert_probs = d_expert_probs_.View();
  // Adjoint of the reduce-scatter (all-gather), then of Unpermute.
  const Tensor global_dout = global_y_.View(dtype_, {global_tokens_, hidden_});
  SY_RETURN_IF_ERROR(ep_->AllGatherV(dout, global_dout, Elements(hidden_)));
  return kernels::UnpermuteBackward(stream, global_dout, row_map_view_, state->d_expert_out,
                                    /*zero_unmapped_rows=*/false);
}

absl::Status AllGatherDispatcher::DispatchBackward(const Stream& stream, DispatchState* state,
                                                   const Tensor& dx, const Tensor& d_topk_probs) {
  if (!have_forward_) return OutOfOrder("DispatchBackward", "a forward DispatchPostprocess");
  const int64_t g = global_tokens_, tm = max_rank_tokens_;
  // Adjoint of Permute over the global batch: this rank's share of every token's gradient (slots
  // on other ranks' experts contribute 0), then of the all-gathers (reduce-scatter).
  const Tensor global_dx = global_y_.View(dtype_, {g, hidden_});
  const Tensor global_dp = global_d_probs_.View(probs_dtype_, {g, topk_});
  SY_RETURN_IF_ERROR(kernels::PermuteBackward(stream, state->d_expert_x, state->d_expert_probs,
                                              row_map_view_, global_dx, global_dp));
  const Tensor padded_x = padded_y_.View(dtype_, {ep_size_ * tm, hidden_});
  const Tensor padded_p = padded_probs_.View(probs_dtype_, {ep_size_ * tm, topk_});
  Spread(global_dx, padded_x, hidden_);
  Spread(global_dp, padded_p, topk_);
  SY_RETURN_IF_ERROR(
      ep_->ReduceScatter(padded_x, reduced_y_.View(dtype_, {tm, hidden_}), comm::ReduceOp::kSum));
  SY_RETURN_IF_ERROR(ep_->ReduceScatter(padded_p, reduced_probs_.View(probs_dtype_, {tm, topk_}),
                                        comm::ReduceOp::kSum));
  SY_RETURN_IF_ERROR(
      Annotate(kernels::CopyTensor(reduced_y_.View(dtype_, {num_tokens_, hidden_}), dx),
               "AllGatherDispatcher::DispatchBackward (dx)"));
  return Annotate(
      kernels::CopyTensor(reduced_probs_.View(probs_dtype_, {num_tokens_, topk_}), d_topk_probs),
      "AllGatherDispatcher::DispatchBackward (d_topk_probs)");
}

}  // namespace switchyard::model
