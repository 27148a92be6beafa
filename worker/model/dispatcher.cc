// File: worker/model/dispatcher.cc
#include "worker/model/dispatcher.h"

#include <cuda_runtime.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/moe/permute.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::model {

using kernels::Buffer;

absl::StatusOr<std::unique_ptr<LocalDispatcher>> LocalDispatcher::Create(
    Device device, DType dtype, DType probs_dtype, int64_t max_tokens, int64_t hidden,
    int num_experts, int topk, int64_t pad_to_capacity, const DispatcherGradScratch& grad,
    bool gather_rows) {
  if (max_tokens <= 0 || hidden <= 0 || num_experts <= 0 || topk <= 0) {
    return absl::InvalidArgumentError("LocalDispatcher: sizes must be positive");
  }
  if (gather_rows && pad_to_capacity > 0) {
    return absl::InvalidArgumentError(
        "LocalDispatcher: gather_rows (moe_permute_fusion) is dropless only, not with "
        "pad_to_capacity");
  }
  std::unique_ptr<LocalDispatcher> d(new LocalDispatcher());
  d->max_tokens_ = max_tokens;
  d->hidden_ = hidden;
  d->num_experts_ = num_experts;
  d->topk_ = topk;
  d->dtype_ = dtype;
  d->probs_dtype_ = probs_dtype;
  d->pad_ = pad_to_capacity > 0 ? pad_to_capacity : 0;
  d->rows_ = d->pad_ > 0 ? num_experts * d->pad_ : max_tokens * topk;
  d->gather_rows_ = gather_rows;
  const int64_t r = d->rows_;
  if (gather_rows) {
    SY_ASSIGN_OR_RETURN(d->expert_rows_, Buffer::ForTensor(DType::kI32, {r}, device));
  } else {
    SY_ASSIGN_OR_RETURN(d->expert_x_, Buffer::ForTensor(dtype, {r, hidden}, device));
  }
  SY_ASSIGN_OR_RETURN(d->expert_probs_, Buffer::ForTensor(probs_dtype, {r}, device));
  SY_ASSIGN_OR_RETURN(d->tokens_per_expert_, Buffer::ForTensor(DType::kI32, {num_experts}, device));
  SY_ASSIGN_OR_RETURN(d->expert_out_, Buffer::ForTensor(dtype, {r, hidden}, device));
  SY_ASSIGN_OR_RETURN(d->row_map_, Buffer::ForTensor(DType::kI32, {max_tokens, topk}, device));
  // The backward's expert-side tensors: shared scratch (DispatcherGradScratch), sized here.
  SY_RETURN_IF_ERROR(d->grad_.Bind(grad, device, r, hidden, dtype, probs_dtype, !gather_rows));
  const int64_t ws = device.is_cuda() ? kernels::PermuteWorkspaceBytes(max_tokens, num_experts) : 0;
  SY_ASSIGN_OR_RETURN(d->workspace_, Buffer::ForTensor(DType::kU8, {ws}, device));
  return d;
}

absl::Status LocalDispatcher::DispatchPreprocess(const Stream& stream, DispatchState* state) {
  const int64_t t = state->x.dim(0);
  if (t > max_tokens_ || state->topk_idx.dim(1) != topk_) {
    return absl::InvalidArgumentError(absl::StrCat("LocalDispatcher: ", t,
                                                   " tokens exceed the planned maximum ",
                                                   max_tokens_, " or top-k differs"));
  }
  row_map_view_ = row_map_.View(DType::kI32, {t, topk_});
  state->expert_probs = expert_probs_.View();
  state->tokens_per_expert = tokens_per_expert_.View();
  state->expert_out = expert_out_.View();
  if (gather_rows_) {
    state->expert_x = Tensor();
    state->expert_rows = expert_rows_.View();
    return kernels::PermuteIndex(stream, state->topk_idx, state->topk_probs, num_experts_,
                                 state->expert_probs, row_map_view_, state->expert_rows,
                                 state->tokens_per_expert, workspace_.View());
  }
  state->expert_x = expert_x_.View();
  state->expert_rows = Tensor();
  return kernels::Permute(stream, state->x, state->topk_idx, state->topk_probs, num_experts_, pad_,
                          state->expert_x, state->expert_probs, row_map_view_,
                          state->tokens_per_expert, workspace_.View());
}

absl::Status LocalDispatcher::CombinePostprocess(const Stream& stream, DispatchState* state,
                                                 const Tensor& out) {
  return kernels::Unpermute(stream, state->expert_out, row_map_view_, out);
}

absl::Status LocalDispatcher::CombineBackward(const Stream& stream, const Tensor& dout,
                                              DispatchState* state) {
  grad_.Fill(state);
  if (gather_rows_) return absl::OkStatus();  // the experts read dout through expert_rows
  return kernels::UnpermuteBackward(stream, dout, row_map_view_, state->d_expert_out,
                                    /*zero_unmapped_rows=*/pad_ > 0);
}

absl::Status LocalDispatcher::DispatchBackward(const Stream& stream, DispatchState* state,
                                               const Tensor& dx, const Tensor& d_topk_probs) {
  return kernels::PermuteBackward(stream, state->d_expert_x, state->d_expert_probs, row_map_view_,
                                  dx, d_topk_probs);
}

absl::Status DispatcherGradBuffers::Bind(const DispatcherGradScratch& grad, Device device,
                                         int64_t rows, int64_t hidden, DType dtype,
                                         DType probs_dtype, bool with_out) {
  rows_ = rows;
  hidden_ = hidden;
  dtype_ = dtype;
  probs_dtype_ = probs_dtype;
  x_ = BorrowOrOwn(grad.d_expert_x, device, &own_x_);
  probs_ = BorrowOrOwn(grad.d_expert_probs, device, &own_probs_);
  if (with_out) {
    out_ = BorrowOrOwn(grad.d_expert_out, device, &own_out_);
    SY_RETURN_IF_ERROR(out_->Reserve(rows * hidden * DTypeSize(dtype)));
  }
  SY_RETURN_IF_ERROR(x_->Reserve(rows * hidden * DTypeSize(dtype)));
  return probs_->Reserve(rows * DTypeSize(probs_dtype));
}

void DispatcherGradBuffers::Fill(DispatchState* state) const {
  state->d_expert_out = out_ != nullptr ? out_->View(dtype_, {rows_, hidden_}) : Tensor();
  state->d_expert_x = x_->View(dtype_, {rows_, hidden_});
  state->d_expert_probs = probs_->View(probs_dtype_, {rows_});
}

absl::Status CheckExpertParallelArgs(const char* who, const void* ep_group, int group_size,
                                     const std::string& group_name, int64_t max_tokens,
                                     int64_t hidden, int num_experts, int ep_size, int topk) {
  if (ep_group == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": ep_group must not be null"));
  }
  if (max_tokens <= 0 || hidden <= 0 || num_experts <= 0 || topk <= 0 || ep_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": max_tokens (", max_tokens, "), hidden (", hidden, "), num_experts (", num_experts,
        "), ep_size (", ep_size, ") and topk (", topk, ") must be positive"));
  }
  if (ep_size != group_size) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": ep_size (", ep_size,
                                                   ") must equal the size of group '", group_name,
                                                   "' (", group_size, ")"));
  }
  if (num_experts % ep_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": num_experts (", num_experts, ") must be divisible by ep_size (", ep_size, ")"));
  }
  if (topk > num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": topk (", topk, ") must be <= num_experts (", num_experts, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<comm::NcclCommunicator*> NcclGroupForDevice(const char* who,
                                                           comm::Communicator* ep_group,
                                                           Device device) {
  if (!device.is_cuda()) return nullptr;
  auto* nccl = dynamic_cast<comm::NcclCommunicator*>(ep_group);
  if (nccl == nullptr || nccl->device() != device.index) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": ep_group '", ep_group->name(),
        "' must be an NcclCommunicator on the dispatcher's device cuda:", device.index,
        " for a CUDA dispatcher (its stream orders the collectives after the kernels)"));
  }
  return nccl;
}

absl::Status SpreadRows(const Stream& stream, const Tensor& compact,
                        const std::vector<int64_t>& rows_per_rank, int64_t max_rows, int64_t width,
                        const Tensor& padded) {
  const int64_t row_bytes = width * DTypeSize(compact.dtype);
  int64_t total = 0;
  for (int64_t n : rows_per_rank) total += n;
  if (padded.dtype != compact.dtype || compact.numel() < total * width ||
      padded.numel() < static_cast<int64_t>(rows_per_rank.size()) * max_rows * width) {
    return absl::InternalError(absl::StrCat("SpreadRows: ", compact.DebugString(), " -> ",
                                            padded.DebugString(), " cannot hold ", total,
                                            " rows padded to ", max_rows, " per rank"));
  }
  const char* src = static_cast<const char*>(compact.data);
  char* dst = static_cast<char*>(padded.data);
  const cudaStream_t cs = stream.cuda_stream;
  int64_t first = 0;
  for (size_t j = 0; j < rows_per_rank.size(); ++j) {
    const int64_t n = rows_per_rank[j];
    char* chunk = dst + j * max_rows * row_bytes;
    const size_t pad_bytes = (max_rows - n) * row_bytes;
    if (stream.device.is_cuda()) {
      if (n > 0) {
        SY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(chunk, src + first * row_bytes, n * row_bytes,
                                                cudaMemcpyDeviceToDevice, cs));
      }
      if (pad_bytes > 0) {
        SY_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(chunk + n * row_bytes, 0, pad_bytes, cs));
      }
    } else {
      if (n > 0) std::memcpy(chunk, src + first * row_bytes, n * row_bytes);
      if (pad_bytes > 0) std::memset(chunk + n * row_bytes, 0, pad_bytes);
    }
    first += n;
  }
  return absl::OkStatus();
}

std::vector<int64_t> RowsToElements(const std::vector<int64_t>& rows, int64_t per_row) {
  std::vector<int64_t> e(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) e[i] = rows[i] * per_row;
  return e;
}

namespace {

constexpr const char* kPhaseNames[] = {"DispatchPreprocess", "Dispatch", "DispatchPostprocess",
                                       "CombinePreprocess",  "Combine",  "CombinePostprocess"};

}  // namespace

absl::Status PhaseTracker::Enter(Phase phase, const Stream& stream) {
  if (phase == kDispatchPreprocess) {
    done_ = -1;
    have_forward_ = false;
  } else if (done_ != phase - 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(who_, "::", kPhaseNames[phase], " must follow ", kPhaseNames[phase - 1]));
  }
  SY_RETURN_IF_ERROR(CheckStream(kPhaseNames[phase], stream));
  if (phase == kCombinePostprocess) done_ = -1;
  return absl::OkStatus();
}

void PhaseTracker::Done(Phase phase) {
  if (phase == kCombinePostprocess) return;  // the micro-batch ended in Enter
  done_ = phase;
  if (phase == kDispatchPostprocess) have_forward_ = true;
}

absl::Status PhaseTracker::EnterBackward(const char* name, const Stream& stream) const {
  if (!have_forward_) {
    return absl::FailedPreconditionError(
        absl::StrCat(who_, "::", name, " must follow a forward DispatchPostprocess"));
  }
  return CheckStream(name, stream);
}

absl::Status PhaseTracker::CheckStream(const char* phase, const Stream& stream) const {
  if (!(stream.device == device_)) {
    return absl::InvalidArgumentError(
        absl::StrCat(who_, "::", phase, ": stream of ", stream.device.ToString(),
                     " must be on the dispatcher's device ", device_.ToString()));
  }
  if (nccl_ != nullptr && stream.cuda_stream != nccl_->stream()) {
    return absl::InvalidArgumentError(absl::StrCat(
        who_, "::", phase, ": stream must be the EP communicator's stream (group '", nccl_->name(),
        "'): create the NcclCommunicator with the stream the phases run on"));
  }
  return absl::OkStatus();
}

void ExpertParallelDispatcher::InitExpertParallel(const char* who, comm::Communicator* ep_group,
                                                  comm::NcclCommunicator* nccl, Device device,
                                                  DType dtype, DType probs_dtype,
                                                  int64_t max_tokens, int64_t hidden,
                                                  int num_experts, int ep_size, int topk,
                                                  std::string label) {
  ep_ = ep_group;
  label_ = label.empty() ? who : std::move(label);
  nccl_ = nccl;
  device_ = device;
  phases_ = PhaseTracker(who, device, nccl);
  num_experts_ = num_experts;
  num_local_ = num_experts / ep_size;
  topk_ = topk;
  hidden_ = hidden;
  max_tokens_ = max_tokens;
  dtype_ = dtype;
  probs_dtype_ = probs_dtype;
}

absl::Status ExpertParallelDispatcher::AllocateCountsStaging(size_t bytes) {
  if (!device_.is_cuda()) return absl::OkStatus();
  int previous = 0;
  SY_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous));
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_.index));
  void* host = nullptr;
  cudaError_t e = cudaMallocHost(&host, bytes);
  if (e == cudaSuccess) pinned_ = std::shared_ptr<void>(host, [](void* p) { cudaFreeHost(p); });
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(previous));
  SY_CUDA_RETURN_IF_ERROR(e);
  SY_ASSIGN_OR_RETURN(kernels::Event event, kernels::Event::Create(device_));
  event_ = std::make_shared<kernels::Event>(std::move(event));
  return absl::OkStatus();
}

absl::Status ExpertParallelDispatcher::Comm(const char* phase, const absl::Status& status) const {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(label_, " ", phase, ": ", status.message()));
}

}  // namespace switchyard::model
