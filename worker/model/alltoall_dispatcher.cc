#include "worker/model/alltoall_dispatcher.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status.h"
#include "kernels/moe/permute.h"

namespace switchyard::model {

using kernels::Buffer;

namespace {

absl::Status OutOfOrder(const char* phase, const char* needs) {
  return absl::FailedPreconditionError(
      absl::StrCat("AllToAllDispatcher::", phase, " must follow ", needs));
}

}  // namespace

absl::Status AllToAllDispatcher::Comm(const char* phase, const absl::Status& status) const {
  if (status.ok()) return status;
  // The communicator's message names the group, this rank, the operation and (Gloo's AllToAllV)
  // the peers that had not delivered; this adds which MoE layer and phase was waiting, so that a
  // stalled or dead peer is reported as "MoE layer 3 dispatch (forward): group 'ep[0,1]' ...".
  return absl::Status(status.code(), absl::StrCat(label_, " ", phase, ": ", status.message()));
}

absl::StatusOr<std::unique_ptr<AllToAllDispatcher>> AllToAllDispatcher::Create(
    comm::Communicator* ep_group, Device device, DType dtype, DType probs_dtype, int64_t max_tokens,
    int64_t hidden, int num_experts, int ep_size, int topk, comm::Communicator* etp_group,
    std::string label, int64_t expert_row_limit) {
  SY_RETURN_IF_ERROR(CheckExpertParallelArgs(
      "AllToAllDispatcher", ep_group, ep_group ? ep_group->size() : 0,
      ep_group ? ep_group->name() : "", max_tokens, hidden, num_experts, ep_size, topk));
  const int etp_size = etp_group != nullptr ? etp_group->size() : 1;
  // SortChunks sorts ETP·EP·L = ETP·E chunks.
  if (static_cast<int64_t>(num_experts) * etp_size > kernels::kMaxSortChunks) {
    return absl::InvalidArgumentError(absl::StrCat("AllToAllDispatcher: num_experts (", num_experts,
                                                   ") x ETP (", etp_size,
                                                   ") must be <= ", kernels::kMaxSortChunks));
  }
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
  d->ep_ = ep_group;
  d->label_ = label.empty() ? "AllToAllDispatcher" : std::move(label);
  d->etp_ = etp_size > 1 ? etp_group : nullptr;
  d->etp_size_ = etp_size;
  d->etp_rank_ = etp_size > 1 ? etp_group->rank() : 0;
  d->nccl_ = nccl;
  d->device_ = device;
  d->ep_size_ = ep_size;
  d->ep_rank_ = ep_group->rank();
  d->num_experts_ = num_experts;
  d->num_local_ = num_experts / ep_size;
  d->topk_ = topk;
  d->hidden_ = hidden;
  d->max_tokens_ = max_tokens;
  d->dtype_ = dtype;
  d->probs_dtype_ = probs_dtype;
  // The most one rank can receive over EP: every token of every EP rank routed to its experts
  // (the bound; see "Receive buffers" in the header). The buffers start at the balanced receipt
  // plus a quarter and grow in Dispatch to what the counts need.
  d->recv_bound_ = ep_size * max_tokens * std::min(topk, d->num_local_);
  d->expert_row_limit_ = expert_row_limit;
  const int64_t initial = std::min(d->recv_bound_, max_tokens * topk + (max_tokens * topk) / 4);
  const int sources = etp_size * ep_size;  // chunk sources, (etp, ep src) order
  SY_ASSIGN_OR_RETURN(d->order_, kernels::LocalExpertChunkOrder(sources, d->num_local_));

  const int64_t sent = max_tokens * topk;
  SY_ASSIGN_OR_RETURN(d->permuted_x_, Buffer::ForTensor(dtype, {sent, hidden}, device));
  SY_ASSIGN_OR_RETURN(d->permuted_probs_, Buffer::ForTensor(probs_dtype, {sent}, device));
  SY_ASSIGN_OR_RETURN(d->row_map_, Buffer::ForTensor(DType::kI32, {max_tokens, topk}, device));
  SY_ASSIGN_OR_RETURN(d->counts_, Buffer::ForTensor(DType::kI32, {num_experts}, device));
  SY_ASSIGN_OR_RETURN(d->gathered_counts_,
                      Buffer::ForTensor(DType::kI32, {ep_size, num_experts}, device));
  // One send-side buffer for the rows (and one for the probs): the permuted rows live from
  // DispatchPreprocess to Dispatch's all-to-all, the combined rows from Combine to
  // CombinePostprocess, their gradients from CombineBackward to DispatchBackward's PermuteBackward,
  // one after the other (the phases run in order, one micro-batch at a time), so all of them use
  // permuted_x_ / permuted_probs_ (issue 15: 2·t·k·H fewer elements per MoE layer at EP > 1).
  const int64_t ws = device.is_cuda()
                         ? std::max(kernels::PermuteWorkspaceBytes(max_tokens, num_experts),
                                    kernels::SortChunksWorkspaceBytes(sources * d->num_local_))
                         : 0;
  SY_ASSIGN_OR_RETURN(d->workspace_, Buffer::ForTensor(DType::kU8, {ws}, device));

  SY_ASSIGN_OR_RETURN(
      d->all_counts_,
      Buffer::ForTensor(DType::kI32, {etp_size > 1 ? sources : 0, num_experts}, device));
  const int64_t num_sizes = sources * d->num_local_ + d->num_local_;
  SY_ASSIGN_OR_RETURN(d->local_sizes_, Buffer::ForTensor(DType::kI32, {num_sizes}, device));
  SY_RETURN_IF_ERROR(d->GrowExpertSide(initial));
  d->input_splits_.assign(ep_size, 0);
  d->output_splits_.assign(ep_size, 0);
  d->chunk_rows_.assign(sources * d->num_local_, 0);
  d->tp_rows_.assign(etp_size, 0);
  if (device.is_cuda()) {
    int previous = 0;
    SY_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous));
    SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(device.index));
    void* pinned = nullptr;
    const size_t pinned_bytes = (sources * num_experts + num_sizes) * sizeof(int32_t);
    cudaError_t e = cudaMallocHost(&pinned, pinned_bytes);
    if (e == cudaSuccess)
      d->pinned_ = std::shared_ptr<void>(pinned, [](void* p) { cudaFreeHost(p); });
    cudaEvent_t event = nullptr;
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (e == cudaSuccess) {
      d->event_ = std::shared_ptr<void>(
          event, [](void* ev) { cudaEventDestroy(static_cast<cudaEvent_t>(ev)); });
    }
    SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(previous));
    SY_CUDA_RETURN_IF_ERROR(e);
  }
  return d;
}

absl::Status AllToAllDispatcher::GrowExpertSide(int64_t recv_rows) {
  recv_cap_ = recv_rows;
  rows_ = etp_size_ * recv_rows;
  const int64_t r = rows_, rc = recv_cap_, rt = etp_size_ > 1 ? r : 0, h = hidden_;
  // Release before allocating, so that growing never holds the old and the new buffers at once.
  // (On CUDA, cudaFree waits for the device, so no queued kernel still uses the old memory.)
  for (Buffer* b : {&recv_x_, &recv_probs_, &tp_x_, &tp_probs_, &padded_x_, &padded_probs_,
                    &expert_x_, &expert_probs_, &expert_out_, &d_expert_probs_}) {
    *b = Buffer();
  }
  SY_ASSIGN_OR_RETURN(recv_x_, Buffer::ForTensor(dtype_, {rc, h}, device_));
  SY_ASSIGN_OR_RETURN(recv_probs_, Buffer::ForTensor(probs_dtype_, {rc}, device_));
  SY_ASSIGN_OR_RETURN(tp_x_, Buffer::ForTensor(dtype_, {rt, h}, device_));
  SY_ASSIGN_OR_RETURN(tp_probs_, Buffer::ForTensor(probs_dtype_, {rt}, device_));
  SY_ASSIGN_OR_RETURN(padded_x_, Buffer::ForTensor(dtype_, {rt, h}, device_));
  SY_ASSIGN_OR_RETURN(padded_probs_, Buffer::ForTensor(probs_dtype_, {rt}, device_));
  SY_ASSIGN_OR_RETURN(expert_x_, Buffer::ForTensor(dtype_, {r, h}, device_));
  SY_ASSIGN_OR_RETURN(expert_probs_, Buffer::ForTensor(probs_dtype_, {r}, device_));
  // expert_out, d_expert_out and d_expert_x share one buffer (see DispatchState in
  // dispatcher.h): the experts' output is dead once CombinePreprocess has unsorted it, and
  // d_expert_out once the experts' backward has read it, before it writes d_expert_x.
  SY_ASSIGN_OR_RETURN(expert_out_, Buffer::ForTensor(dtype_, {r, h}, device_));
  SY_ASSIGN_OR_RETURN(d_expert_probs_, Buffer::ForTensor(probs_dtype_, {r}, device_));
  return absl::OkStatus();
}

Tensor AllToAllDispatcher::SplitSizes() const {
  return local_sizes_.View(DType::kI32, {etp_size_ * ep_size_ * num_local_});
}

Tensor AllToAllDispatcher::TokensPerExpert() const {
  return Tensor(DType::kI32, {num_local_}, device_,
                static_cast<int32_t*>(local_sizes_.data()) + etp_size_ * ep_size_ * num_local_);
}

absl::Status AllToAllDispatcher::ReduceScatterTp(const Stream& stream, const Tensor& rows,
                                                 const kernels::Buffer& padded, int64_t width,
                                                 const kernels::Buffer& out) {
  const DType dt = rows.dtype;
  auto shape = [width](int64_t n) {
    return width > 1 ? std::vector<int64_t>{n, width} : std::vector<int64_t>{n};
  };
  const Tensor in = padded.View(dt, shape(etp_size_ * tp_max_rows_));
  SY_RETURN_IF_ERROR(SpreadRows(stream, rows, tp_rows_, tp_max_rows_, width, in));
  return etp_->ReduceScatter(in, out.View(dt, shape(tp_max_rows_)), comm::ReduceOp::kSum);
}

absl::Status AllToAllDispatcher::CheckStream(const Stream& stream, const char* phase) const {
  return CheckPhaseStream("AllToAllDispatcher", phase, stream, device_, nccl_);
}

std::vector<int64_t> AllToAllDispatcher::Elements(const std::vector<int64_t>& rows,
                                                  int64_t per_row) const {
  std::vector<int64_t> e(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) e[i] = rows[i] * per_row;
  return e;
}

absl::Status AllToAllDispatcher::DispatchPreprocess(const Stream& stream, DispatchState* state) {
  phase_ = Phase::kIdle;
  have_forward_ = false;
  SY_RETURN_IF_ERROR(CheckStream(stream, "DispatchPreprocess"));
  const int64_t t = state->x.rank() == 2 ? state->x.dim(0) : -1;
  if (t < 0 || state->x.dim(1) != hidden_ || t > max_tokens_ || state->topk_idx.rank() != 2 ||
      state->topk_idx.dim(0) != t || state->topk_idx.dim(1) != topk_) {
    return absl::InvalidArgumentError(absl::StrCat("AllToAllDispatcher: x ", state->x.DebugString(),
                                                   " / topk_idx ", state->topk_idx.DebugString(),
                                                   " must be [T <= ", max_tokens_, ", ", hidden_,
                                                   "] / [T, ", topk_, "]"));
  }
  num_tokens_ = t;
  row_map_view_ = row_map_.View(DType::kI32, {t, topk_});
  state->tokens_per_expert = TokensPerExpert();
  // The expert-side views are handed out by Dispatch, which may grow their buffers.
  state->expert_x = Tensor();
  state->expert_probs = Tensor();
  state->expert_out = Tensor();
  // Permutation 1, over the E global experts: the rows for EP rank j (experts [j*L, (j+1)*L))
  // are contiguous, in expert-major, token-ascending order. counts_ = n stays on the device.
  SY_RETURN_IF_ERROR(kernels::Permute(stream, state->x, state->topk_idx, state->topk_probs,
                                      num_experts_, 0, permuted_x_.View(), permuted_probs_.View(),
                                      row_map_view_, counts_.View(), workspace_.View()));
  phase_ = Phase::kPreprocessed;
  return absl::OkStatus();
}

absl::Status AllToAllDispatcher::Dispatch(const Stream& stream, DispatchState* state) {
  if (phase_ != Phase::kPreprocessed) return OutOfOrder("Dispatch", "DispatchPreprocess");
  SY_RETURN_IF_ERROR(CheckStream(stream, "Dispatch"));
  // G[j, e] = rows EP rank j routes to global expert e (on the device for CUDA); with ETP, G'[t]
  // is ETP peer t's G (the spec's allgather over ETP×EP, reshaped [ETP, EP, E]).
  SY_RETURN_IF_ERROR(
      Comm("dispatch (forward)", ep_->AllGather(counts_.View(), gathered_counts_.View())));
  const kernels::Buffer& counts = etp_size_ > 1 ? all_counts_ : gathered_counts_;
  if (etp_size_ > 1)
    SY_RETURN_IF_ERROR(
        Comm("dispatch (forward)", etp_->AllGather(gathered_counts_.View(), counts.View())));
  const int32_t* g_all = counts.View().as<int32_t>();
  const int sources = etp_size_ * ep_size_;
  int32_t* staged = nullptr;  // [ETP*EP*L + L] host values of local_sizes_
  std::vector<int32_t> cpu_staged;
  if (device_.is_cuda()) {
    // The one device-to-host copy of the micro-batch (see "Host synchronisation" in the header).
    const cudaStream_t s = static_cast<cudaStream_t>(stream.cuda_stream);
    const cudaEvent_t done = static_cast<cudaEvent_t>(event_.get());
    int32_t* host_g = static_cast<int32_t*>(pinned_.get());
    SY_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host_g, counts.data(), counts.bytes(), cudaMemcpyDeviceToHost, s));
    SY_CUDA_RETURN_IF_ERROR(cudaEventRecord(done, s));
    SY_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done));
    g_all = host_g;
    staged = host_g + sources * num_experts_;
  } else {
    cpu_staged.assign(sources * num_local_ + num_local_, 0);
    staged = cpu_staged.data();
  }
  // This peer's G: row ep_rank of it is this rank's own n, so input_splits[j] = rows for EP rank
  // j's experts; output_splits[j] = rows EP rank j sends here.
  const int32_t* g = g_all + static_cast<int64_t>(etp_rank_) * ep_size_ * num_experts_;
  sent_rows_ = 0;
  for (int j = 0; j < ep_size_; ++j) {
    int64_t in = 0, out = 0;
    for (int l = 0; l < num_local_; ++l) {
      in += g[ep_rank_ * num_experts_ + j * num_local_ + l];
      out += g[j * num_experts_ + ep_rank_ * num_local_ + l];
    }
    input_splits_[j] = in;
    output_splits_[j] = out;
    sent_rows_ += in;
  }
  // Chunk (t, j, l): rows ETP peer t received from EP rank j for local expert l.
  tp_total_rows_ = 0;
  tp_max_rows_ = 0;
  for (int t = 0; t < etp_size_; ++t) {
    int64_t rows = 0;
    for (int j = 0; j < ep_size_; ++j) {
      for (int l = 0; l < num_local_; ++l) {
        const int32_t c = g_all[(static_cast<int64_t>(t) * ep_size_ + j) * num_experts_ +
                                ep_rank_ * num_local_ + l];
        chunk_rows_[(t * ep_size_ + j) * num_local_ + l] = c;
        rows += c;
      }
    }
    tp_rows_[t] = rows;
    tp_total_rows_ += rows;
    tp_max_rows_ = std::max(tp_max_rows_, rows);
  }
  recv_rows_ = tp_rows_[etp_rank_];
  // The bounds and the limit, checked on the counts of EVERY rank of the ETP×EP block (each rank
  // holds them all, so every rank decides alike: a violation stops them all here, before any row
  // moves, instead of leaving the others waiting in the all-to-all). received[t * EP + j]: rows
  // ETP peer t of EP rank j receives.
  int64_t most_sent = 0, most_received = 0;
  std::vector<int64_t> received(sources, 0);
  for (int src = 0; src < sources; ++src) {
    int64_t sent = 0;
    for (int e = 0; e < num_experts_; ++e) {
      const int32_t c = g_all[src * num_experts_ + e];
      sent += c;
      received[(src / ep_size_) * ep_size_ + e / num_local_] += c;
    }
    most_sent = std::max(most_sent, sent);
  }
  for (int64_t r : received) most_received = std::max(most_received, r);
  if (most_sent > max_tokens_ * topk_ || most_received > recv_bound_) {
    // impossible unless a peer broke the top-k contract or the counts were corrupted
    return Comm("dispatch (forward)",
                absl::InternalError(absl::StrCat(
                    "AllToAllDispatcher: ", most_sent, " rows to send / ", most_received,
                    " to receive exceed the bounds ", max_tokens_ * topk_, " / ", recv_bound_)));
  }
  if (expert_row_limit_ > 0) {
    for (int j = 0; j < ep_size_; ++j) {
      int64_t rows = 0;  // EP rank j's expert rows: its ETP peers' receipts together
      for (int t = 0; t < etp_size_; ++t) rows += received[t * ep_size_ + j];
      if (rows > expert_row_limit_) {
        return Comm("dispatch (forward)",
                    absl::ResourceExhaustedError(absl::StrCat(
                        "EP rank ", j, " of group '", ep_->name(), "' would receive ", rows,
                        " expert rows, more than expert_row_limit ", expert_row_limit_,
                        " (every rank of the group stops here, before the all-to-all)")));
      }
    }
  }
  if (tp_max_rows_ > recv_cap_) {
    // Receive buffers sized by the actual counts: grow to what this micro-batch needs plus a
    // quarter (fewer regrowths as the routing settles), never past the bound. The host already
    // waited for the counts, so this costs no extra synchronisation.
    SY_RETURN_IF_ERROR(
        GrowExpertSide(std::min(recv_bound_, std::max(tp_max_rows_, recv_cap_ + recv_cap_ / 4))));
  }
  state->expert_x = expert_x_.View();
  state->expert_probs = expert_probs_.View();
  state->expert_out = expert_out_.View();
  for (int l = 0; l < num_local_; ++l) {
    int32_t sum = 0;
    for (int src = 0; src < sources; ++src) sum += chunk_rows_[src * num_local_ + l];
    staged[sources * num_local_ + l] = sum;
  }
  std::memcpy(staged, chunk_rows_.data(), chunk_rows_.size() * sizeof(int32_t));
  const size_t sizes_bytes = (sources * num_local_ + num_local_) * sizeof(int32_t);
  if (device_.is_cuda()) {
    SY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(local_sizes_.data(), staged, sizes_bytes,
                                            cudaMemcpyHostToDevice,
                                            static_cast<cudaStream_t>(stream.cuda_stream)));
  } else {
    std::memcpy(local_sizes_.data(), staged, sizes_bytes);
  }
  // The EP all-to-all of the rows, then of the probs (same splits, separate tensor, as Megatron).
  SY_RETURN_IF_ERROR(Comm(
      "dispatch (forward)",
      ep_->AllToAllV(permuted_x_.View(dtype_, {sent_rows_, hidden_}),
                     Elements(input_splits_, hidden_), recv_x_.View(dtype_, {recv_rows_, hidden_}),
                     Elements(output_splits_, hidden_))));
  SY_RETURN_IF_ERROR(
      Comm("dispatch (forward)",
           ep_->AllToAllV(permuted_probs_.View(probs_dtype_, {sent_rows_}), input_splits_,
                          recv_probs_.View(probs_dtype_, {recv_rows_}), output_splits_)));
  if (etp_size_ > 1) {
    // The spec's AG(TP) after the EP all-to-all: every ETP peer gets every peer's receipt.
    SY_RETURN_IF_ERROR(
        Comm("dispatch (forward)", etp_->AllGatherV(recv_x_.View(dtype_, {recv_rows_, hidden_}),
                                                    tp_x_.View(dtype_, {tp_total_rows_, hidden_}),
                                                    Elements(tp_rows_, hidden_))));
    SY_RETURN_IF_ERROR(
        Comm("dispatch (forward)",
             etp_->AllGatherV(recv_probs_.View(probs_dtype_, {recv_rows_}),
                              tp_probs_.View(probs_dtype_, {tp_total_rows_}), tp_rows_)));
  }
  phase_ = Phase::kDispatched;
  return absl::OkStatus();
}

absl::Status AllToAllDispatcher::DispatchPostprocess(const Stream& stream, DispatchState* state) {
  (void)state;
  if (phase_ != Phase::kDispatched) return OutOfOrder("DispatchPostprocess", "Dispatch");
  SY_RETURN_IF_ERROR(CheckStream(stream, "DispatchPostprocess"));
  // (etp, src, local e) -> (local e, etp, src).
  SY_RETURN_IF_ERROR(kernels::SortChunks(stream, SourceRows(), SplitSizes(), order_.sort,
                                         expert_x_.View(), SourceProbs(), expert_probs_.View(),
                                         workspace_.View()));
  phase_ = Phase::kPostprocessed;
  have_forward_ = true;
  return absl::OkStatus();
}

absl::Status AllToAllDispatcher::CombinePreprocess(const Stream& stream, DispatchState* state) {
  if (phase_ != Phase::kPostprocessed) {
    return OutOfOrder("CombinePreprocess", "DispatchPostprocess");
  }
  SY_RETURN_IF_ERROR(CheckStream(stream, "CombinePreprocess"));
  // (local e, etp, src) -> (etp, src, local e); the source buffer is free again once the experts
  // have their input.
  SY_RETURN_IF_ERROR(kernels::UnsortChunks(stream, state->expert_out, SplitSizes(), order_.sort,
                                           SourceRows(), Tensor(), Tensor(), workspace_.View()));
  phase_ = Phase::kCombinePre;
  return absl::OkStatus();
}

absl::Status AllToAllDispatcher::Combine(const Stream& stream, DispatchState* state) {
  (void)state;
  if (phase_ != Phase::kCombinePre) return OutOfOrder("Combine", "CombinePreprocess");
  SY_RETURN_IF_ERROR(CheckStream(stream, "Combine"));
  if (etp_size_ > 1) {
    // The spec's RS(TP): sums the ETP partial fc2 outputs (row-parallel) and hands each peer back
    // the rows it received.
    SY_RETURN_IF_ERROR(Comm("combine (forward)",
                            ReduceScatterTp(stream, tp_x_.View(dtype_, {tp_total_rows_, hidden_}),
                                            padded_x_, hidden_, recv_x_)));
  }
  SY_RETURN_IF_ERROR(Comm(
      "combine (forward)",
      ep_->AllToAllV(recv_x_.View(dtype_, {recv_rows_, hidden_}), Elements(output_splits_, hidden_),
                     permuted_x_.View(dtype_, {sent_rows_, hidden_}),
                     Elements(input_splits_, hidden_))));
  phase_ = Phase::kCombined;
  return absl::OkStatus();
}

absl::Status AllToAllDispatcher::CombinePostprocess(const Stream& stream, DispatchState* state,
                                                    const Tensor& out) {
  (void)state;
  if (phase_ != Phase::kCombined) return OutOfOrder("CombinePostprocess", "Combine");
  SY_RETURN_IF_ERROR(CheckStream(stream, "CombinePostprocess"));
  phase_ = Phase::kIdle;
  return kernels::Unpermute(stream, permuted_x_.View(), row_map_view_, out);
}

absl::Status AllToAllDispatcher::CombineBackward(const Stream& stream, const Tensor& dout,
                                                 DispatchState* state) {
  if (!have_forward_) return OutOfOrder("CombineBackward", "a forward DispatchPostprocess");
  SY_RETURN_IF_ERROR(CheckStream(stream, "CombineBackward"));
  state->d_expert_out = expert_out_.View();
  state->d_expert_x = expert_out_.View();  // shares d_expert_out's memory (dispatcher.h)
  state->d_expert_probs = d_expert_probs_.View();
  // Adjoint of Unpermute (every permuted row is mapped: dropless), of the combine all-to-all (the
  // dispatch direction), of the ETP reduce-scatter (an all-gather) and of UnsortChunks
  // (SortChunks).
  SY_RETURN_IF_ERROR(kernels::UnpermuteBackward(stream, dout, row_map_view_, permuted_x_.View(),
                                                /*zero_unmapped_rows=*/false));
  SY_RETURN_IF_ERROR(Comm(
      "combine (backward)",
      ep_->AllToAllV(permuted_x_.View(dtype_, {sent_rows_, hidden_}),
                     Elements(input_splits_, hidden_), recv_x_.View(dtype_, {recv_rows_, hidden_}),
                     Elements(output_splits_, hidden_))));
  if (etp_size_ > 1) {
    SY_RETURN_IF_ERROR(
        Comm("combine (backward)", etp_->AllGatherV(recv_x_.View(dtype_, {recv_rows_, hidden_}),
                                                    tp_x_.View(dtype_, {tp_total_rows_, hidden_}),
                                                    Elements(tp_rows_, hidden_))));
  }
  return kernels::SortChunks(stream, SourceRows(), SplitSizes(), order_.sort, state->d_expert_out,
                             Tensor(), Tensor(), workspace_.View());
}

absl::Status AllToAllDispatcher::DispatchBackward(const Stream& stream, DispatchState* state,
                                                  const Tensor& dx, const Tensor& d_topk_probs) {
  if (!have_forward_) return OutOfOrder("DispatchBackward", "a forward DispatchPostprocess");
  SY_RETURN_IF_ERROR(CheckStream(stream, "DispatchBackward"));
  SY_RETURN_IF_ERROR(kernels::UnsortChunks(stream, state->d_expert_x, SplitSizes(), order_.sort,
                                           SourceRows(), state->d_expert_probs, SourceProbs(),
                                           workspace_.View()));
  if (etp_size_ > 1) {
    // Adjoint of the ETP all-gather: each peer's F slice gave a partial input (and prob)
    // gradient of every gathered row; the sums of this peer's rows come back to it.
    SY_RETURN_IF_ERROR(Comm("dispatch (backward)",
                            ReduceScatterTp(stream, tp_x_.View(dtype_, {tp_total_rows_, hidden_}),
                                            padded_x_, hidden_, recv_x_)));
    SY_RETURN_IF_ERROR(Comm("dispatch (backward)",
                            ReduceScatterTp(stream, tp_probs_.View(probs_dtype_, {tp_total_rows_}),
                                            padded_probs_, 1, recv_probs_)));
  }
  SY_RETURN_IF_ERROR(Comm(
      "dispatch (backward)",
      ep_->AllToAllV(recv_x_.View(dtype_, {recv_rows_, hidden_}), Elements(output_splits_, hidden_),
                     permuted_x_.View(dtype_, {sent_rows_, hidden_}),
                     Elements(input_splits_, hidden_))));
  SY_RETURN_IF_ERROR(
      Comm("dispatch (backward)",
           ep_->AllToAllV(recv_probs_.View(probs_dtype_, {recv_rows_}), output_splits_,
                          permuted_probs_.View(probs_dtype_, {sent_rows_}), input_splits_)));
  return kernels::PermuteBackward(stream, permuted_x_.View(), permuted_probs_.View(), row_map_view_,
                                  dx, d_topk_probs);
}

}  // namespace switchyard::model
