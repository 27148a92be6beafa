// File: worker/model/dispatcher.h
//
// Token dispatchers: how routed tokens reach their experts and come back (megatron_moe.md §3).
// A dispatcher runs the spec's six phases; only Dispatch and Combine communicate, so a scheduler
// can overlap them with another micro-batch's compute:
//
//   DispatchPreprocess  permute the local tokens into expert-major order (+ split sizes)
//   Dispatch            [comm] all-to-all over EP, then all-gather over ETP (alltoall) /
//                       all-gather over ETP×EP (allgather)
//   DispatchPostprocess sort received chunks by local expert -> expert inputs
//   (experts run on state.expert_x / expert_probs / tokens_per_expert -> state.expert_out)
//   CombinePreprocess   undo the chunk sort
//   Combine             [comm] reduce-scatter over ETP, then the reverse all-to-all / the
//                       reduce-scatter over ETP×EP
//   CombinePostprocess  unpermute: sum each token's k expert outputs
//
// Unlike Megatron's dispatchers, the phases do not talk through hidden instance attributes: every
// per-micro-batch tensor lives in the caller-visible DispatchState, so the order of calls is
// checked and nothing is re-entrant by accident. A dispatcher owns its buffers (sized at Create for
// a maximum token count; the alltoall dispatcher's expert side grows with the counts), except the
// backward's expert-side ones, which it may borrow (DispatcherGradScratch), and is used from one
// thread.
#ifndef SWITCHYARD_WORKER_MODEL_DISPATCHER_H_
#define SWITCHYARD_WORKER_MODEL_DISPATCHER_H_

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
#include "worker/model/scratch_buffer.h"

namespace switchyard::model {

// The tensors of one micro-batch as it passes through a dispatcher. Views into dispatcher-owned
// buffers, valid until the next DispatchPreprocess.
struct DispatchState {
  // Inputs (set by the layer before DispatchPreprocess).
  Tensor x;           // [T, H] activation dtype
  Tensor topk_idx;    // [T, k] i32, -1 = dropped
  Tensor topk_probs;  // [T, k] f32 (f64 on the CPU in f64 runs)
  // Expert side (set by DispatchPostprocess): rows grouped by LOCAL expert.
  Tensor expert_x;           // [R, H]
  Tensor expert_probs;       // [R] probs dtype
  Tensor tokens_per_expert;  // [local experts] i32, device
  Tensor expert_out;         // [R, H]: the experts write their output here
  // Backward (set by the layer / the dispatcher). d_expert_x MAY SHARE MEMORY with d_expert_out
  // (and expert_out; AllToAllDispatcher does, to save two [R, H] buffers): the experts' backward
  // must have read d_expert_out for the last time before it writes d_expert_x (MoELayer: fc2's
  // dgrad and wgrad, then SwiGLU, then fc1's dgrad writes d_expert_x).
  Tensor d_expert_out;    // [R, H]: CombineBackward writes it
  Tensor d_expert_x;      // [R, H]: the experts write it
  Tensor d_expert_probs;  // [R]:    the experts write it
  // The permutation fused into the experts (LocalDispatcher with gather_rows, MoELayer's
  // moe_permute_fusion): when expert_rows ([R] i32, set by DispatchPreprocess) is set, expert_x
  // and d_expert_out are NOT written (empty): row p of the experts' input is x[expert_rows[p]]
  // and row p of the output gradient is dout[expert_rows[p]] (for p below the counts' total),
  // dout being what the layer passes to CombineBackward. The experts read both through the row
  // index (kernels/gemm/grouped_gemm.h, the *Gathered ops).
  Tensor expert_rows;
};

// Where a dispatcher keeps the backward's expert-side tensors (DispatchState::d_expert_out,
// d_expert_x, d_expert_probs). They live from CombineBackward to the DispatchBackward of the same
// micro-batch, inside one MoELayer::Backward, and nothing reads them afterwards, so the MoE layers
// of a model (and its pipeline slots) share one scratch per role (MoEGradScratch,
// worker/model/moe_layer.h): a dispatcher reserves its row capacity in them at Create (and when
// its expert side grows) and views them in CombineBackward. Borrowed; they outlive the dispatcher.
// A null role: the dispatcher makes its own. AllToAllDispatcher keeps d_expert_out and d_expert_x
// in its expert_out buffer (see above) and uses d_expert_probs only.
struct DispatcherGradScratch {
  ScratchBuffer* d_expert_out = nullptr;
  ScratchBuffer* d_expert_x = nullptr;
  ScratchBuffer* d_expert_probs = nullptr;
};

// A dispatcher's backward expert-side tensors d_expert_out, d_expert_x [rows, H] and
// d_expert_probs [rows]: borrowed from a DispatcherGradScratch (null members: owned), reserved for
// these sizes by Bind. Used by the dispatchers whose three gradients all live in scratch.
class DispatcherGradBuffers {
 public:
  // `with_out` false: no d_expert_out (out_ stays null; the gathered experts read the output
  // gradient itself).
  absl::Status Bind(const DispatcherGradScratch& grad, Device device, int64_t rows, int64_t hidden,
                    DType dtype, DType probs_dtype, bool with_out = true);
  // Sets state->d_expert_out (empty without it), d_expert_x and d_expert_probs to views of the
  // bound sizes.
  void Fill(DispatchState* state) const;

 private:
  ScratchBuffer *out_ = nullptr, *x_ = nullptr, *probs_ = nullptr;
  std::unique_ptr<ScratchBuffer> own_out_, own_x_, own_probs_;
  int64_t rows_ = 0, hidden_ = 0;
  DType dtype_ = DType::kBF16, probs_dtype_ = DType::kF32;
};

class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;

  // "local", "allgather" or "alltoall" (Megatron's moe_token_dispatcher_type names), for logs
  // and tests.
  virtual const char* name() const = 0;
  // Row capacity R of the expert-side buffers (the state's expert tensors have R rows). Fixed at
  // Create except for AllToAllDispatcher, whose expert side follows the counts and may grow in
  // Dispatch (alltoall_dispatcher.h, "Receive buffers").
  virtual int64_t ExpertRowCapacity() const = 0;
  virtual int num_local_experts() const = 0;
  // True when padding rows (pad-to-capacity) are part of the expert inputs.
  virtual bool pads_to_capacity() const = 0;

  // Forward phases (see the file comment). `state.x/topk_*` must be set; T <= max tokens.
  virtual absl::Status DispatchPreprocess(const Stream& stream, DispatchState* state) = 0;
  virtual absl::Status Dispatch(const Stream& stream, DispatchState* state) = 0;
  virtual absl::Status DispatchPostprocess(const Stream& stream, DispatchState* state) = 0;
  virtual absl::Status CombinePreprocess(const Stream& stream, DispatchState* state) = 0;
  virtual absl::Status Combine(const Stream& stream, DispatchState* state) = 0;
  virtual absl::Status CombinePostprocess(const Stream& stream, DispatchState* state,
                                          const Tensor& out) = 0;

  // Backward: the adjoint of the combine phases (dout [T, H] -> state.d_expert_out), then the
  // adjoint of the dispatch phases (state.d_expert_x, d_expert_probs -> dx [T, H] OVERWRITTEN,
  // d_topk_probs [T, k]).
  virtual absl::Status CombineBackward(const Stream& stream, const Tensor& dout,
                                       DispatchState* state) = 0;
  virtual absl::Status DispatchBackward(const Stream& stream, DispatchState* state,
                                        const Tensor& dx, const Tensor& d_topk_probs) = 0;
};

// EP = 1: every expert is local; dispatch and combine are no-ops, preprocess is Permute and
// postprocess is Unpermute (kernels/moe/permute.h), with no host synchronisation.
//
// gather_rows (the permutation fused into the experts, DispatchState::expert_rows): preprocess
// is PermuteIndex (the row index, no copy of x) and CombineBackward copies nothing (the experts
// read dout through the index); no expert_x or d_expert_out buffer exists. Dropless only.
class LocalDispatcher final : public TokenDispatcher {
 public:
  // `pad_to_capacity` C > 0 gives every expert exactly C rows (R = E*C); else R = max_tokens*k.
  // The backward's expert-side tensors live in `grad` (DispatcherGradScratch; its own when null).
  static absl::StatusOr<std::unique_ptr<LocalDispatcher>> Create(
      Device device, DType dtype, DType probs_dtype, int64_t max_tokens, int64_t hidden,
      int num_experts, int topk, int64_t pad_to_capacity, const DispatcherGradScratch& grad = {},
      bool gather_rows = false);

  const char* name() const override { return "local"; }
  int64_t ExpertRowCapacity() const override { return rows_; }
  int num_local_experts() const override { return num_experts_; }
  bool pads_to_capacity() const override { return pad_ > 0; }

  absl::Status DispatchPreprocess(const Stream& stream, DispatchState* state) override;
  absl::Status Dispatch(const Stream&, DispatchState*) override { return absl::OkStatus(); }
  absl::Status DispatchPostprocess(const Stream&, DispatchState*) override {
    return absl::OkStatus();
  }
  absl::Status CombinePreprocess(const Stream&, DispatchState*) override {
    return absl::OkStatus();
  }
  absl::Status Combine(const Stream&, DispatchState*) override { return absl::OkStatus(); }
  absl::Status CombinePostprocess(const Stream& stream, DispatchState* state,
                                  const Tensor& out) override;
  absl::Status CombineBackward(const Stream& stream, const Tensor& dout,
                               DispatchState* state) override;
  absl::Status DispatchBackward(const Stream& stream, DispatchState* state, const Tensor& dx,
                                const Tensor& d_topk_probs) override;

 private:
  LocalDispatcher() = default;

  int64_t rows_ = 0, hidden_ = 0, max_tokens_ = 0, pad_ = 0;
  int num_experts_ = 0, topk_ = 0;
  bool gather_rows_ = false;
  DType dtype_ = DType::kF32, probs_dtype_ = DType::kF32;
  kernels::Buffer expert_x_, expert_probs_, tokens_per_expert_, expert_out_, row_map_, workspace_;
  kernels::Buffer expert_rows_;  // gather_rows: [R] i32, the token of each expert row
  // The backward's d_expert_out, d_expert_x [R, H] and d_expert_probs [R] (DispatcherGradScratch),
  // and the ones this dispatcher owns when Create got none.
  DispatcherGradBuffers grad_;
  Tensor row_map_view_;  // [T, k] of the current micro-batch
};

// The argument rules shared by the expert-parallel dispatchers (AllToAllDispatcher,
// AllGatherDispatcher): positive sizes, ep_size equal to the EP group's size, num_experts
// divisible by ep_size, topk <= num_experts. `who` prefixes the message (the class name).
absl::Status CheckExpertParallelArgs(const char* who, const void* ep_group, int group_size,
                                     const std::string& group_name, int64_t max_tokens,
                                     int64_t hidden, int num_experts, int ep_size, int topk);

// The CUDA rule shared by the expert-parallel dispatchers: on a CUDA device the EP group must be
// an NcclCommunicator on that device (its stream orders the collectives after the kernels).
// Returns it; nullptr on the CPU. INVALID_ARGUMENT prefixed with `who` otherwise.
absl::StatusOr<comm::NcclCommunicator*> NcclGroupForDevice(const char* who,
                                                           comm::Communicator* ep_group,
                                                           Device device);
// Lays `compact` [sum(rows_per_rank), width] (rank-ordered chunks) out as `padded`
// [rows_per_rank.size() * max_rows, width]: chunk j at row j * max_rows, padding rows zeroed.
// A ReduceScatter takes equal chunks, so the dispatchers reduce uneven per-rank row counts through
// this layout (AllGatherDispatcher over ETP×EP, AllToAllDispatcher over ETP). On `stream`: async
// copies and memsets on CUDA (same device for both tensors), plain memcpy on the CPU.
absl::Status SpreadRows(const Stream& stream, const Tensor& compact,
                        const std::vector<int64_t>& rows_per_rank, int64_t max_rows, int64_t width,
                        const Tensor& padded);

// Row counts -> element counts (x per_row), for the communicator's V collectives.
std::vector<int64_t> RowsToElements(const std::vector<int64_t>& rows, int64_t per_row);

// The phase order of the expert-parallel dispatchers (TokenDispatcher's six forward phases, each
// after the one before it; the backward after a forward DispatchPostprocess) and the stream
// rules of every phase. `who` prefixes the messages (the class name):
//   FAILED_PRECONDITION "<who>::Combine must follow CombinePreprocess" out of order;
//   INVALID_ARGUMENT when the stream is not on `device` or, with an NCCL group, is not the
//   group's own stream (its calls are ordered on that stream).
// A phase calls Enter first and, when it has succeeded, Done. DispatchPreprocess starts a new
// micro-batch (the previous one's backward is no longer possible); CombinePostprocess ends it as
// soon as it is entered.
class PhaseTracker {
 public:
  enum Phase {
    kDispatchPreprocess,
    kDispatch,
    kDispatchPostprocess,
    kCombinePreprocess,
    kCombine,
    kCombinePostprocess,
  };

  PhaseTracker() = default;
  PhaseTracker(const char* who, Device device, const comm::NcclCommunicator* nccl)
      : who_(who), device_(device), nccl_(nccl) {}

  absl::Status Enter(Phase phase, const Stream& stream);
  void Done(Phase phase);
  // CombineBackward / DispatchBackward (`name`): after a forward DispatchPostprocess.
  absl::Status EnterBackward(const char* name, const Stream& stream) const;

 private:
  absl::Status CheckStream(const char* phase, const Stream& stream) const;

  const char* who_ = "";
  Device device_;
  const comm::NcclCommunicator* nccl_ = nullptr;
  int done_ = -1;              // the last phase done of the current micro-batch, -1 = none
  bool have_forward_ = false;  // sizes valid for the backward
};

// What the expert-parallel dispatchers (AllToAllDispatcher, AllGatherDispatcher) share: the EP
// group, the sizes, the phase order, the label of their errors and the pinned host memory their
// one host read (the gathered counts) goes through. Experts are sharded in blocks of
// num_local_experts() = num_experts / ep_size; no pad-to-capacity.
class ExpertParallelDispatcher : public TokenDispatcher {
 public:
  int num_local_experts() const override { return num_local_; }
  bool pads_to_capacity() const override { return false; }

 protected:
  // Sets the members below from the (checked) arguments of Create. `who` (the class name) prefixes
  // argument and order errors and is the label when `label` is empty; `nccl` is ep_group on a
  // CUDA device, else null.
  void InitExpertParallel(const char* who, comm::Communicator* ep_group,
                          comm::NcclCommunicator* nccl, Device device, DType dtype,
                          DType probs_dtype, int64_t max_tokens, int64_t hidden, int num_experts,
                          int ep_size, int topk, std::string label);
  // CUDA: allocates pinned_ (`bytes`, with device_ current, then restores the current device)
  // and event_. Nothing on the CPU.
  absl::Status AllocateCountsStaging(size_t bytes);
  // A collective's `status` prefixed with label_ and `phase` ("MoE layer 3 dispatch (forward):
  // group 'ep[0,1]' rank 0/2 AllToAllV: ..."): the communicator's message names the group, the
  // rank, the operation and (Gloo's AllToAllV) the peers that had not delivered; this adds which
  // MoE layer and phase was waiting. OK stays OK.
  absl::Status Comm(const char* phase, const absl::Status& status) const;

  comm::Communicator* ep_ = nullptr;
  std::string label_;
  comm::NcclCommunicator* nccl_ = nullptr;  // ep_ on a CUDA device, else null
  Device device_;
  // The phase order and the stream rules of every phase (the subclasses' stream contracts).
  PhaseTracker phases_;
  int num_experts_ = 0, num_local_ = 0, topk_ = 0;
  int64_t hidden_ = 0, max_tokens_ = 0;
  DType dtype_ = DType::kF32, probs_dtype_ = DType::kF32;
  // CUDA only: pinned host memory (the D2H target of the gathered counts) and the event that copy
  // is waited on with.
  std::shared_ptr<void> pinned_;
  std::shared_ptr<kernels::Event> event_;
  int64_t num_tokens_ = 0;  // T of the current micro-batch
};

}  // namespace switchyard::model

#endif  // SWITCHYARD_WORKER_MODEL_DISPATCHER_H_
