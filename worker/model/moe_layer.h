// File: worker/model/moe_layer.h
//
// The MoE layer (megatron_moe.md §0): router -> dispatcher (six phases) -> grouped-GEMM SwiGLU
// experts -> combine, plus an optional shared expert, with an explicit Forward/Backward pair
// (DESIGN.md layer contract; no autograd):
//
//   xr      = jitter(x)                          (training with moe_input_jitter_eps only)
//   logits  = xr · Wrᵀ                            [T, E] fp32
//   topk    = route(logits)                       kernels/moe/router.h (+ aux/z-loss stats)
//   expert inputs = dispatch(x, topk)             worker/model/dispatcher.h
//   h = X_e · W1_e ; a = silu(h_gate) · h_lin · p ; y_e = a · W2_e      (per local expert e)
//   y = combine(y_e) (+ shared(x), gated by σ(x·w_g) when moe_shared_expert_gate)
//
// The load-balancing and z losses are not added to any loss value: Backward seeds their gradient
// into the router logits with `aux_grad_scale` (spec §2.4); their values are exposed for logging.
//
// With moe_shared_expert_overlap on CUDA, the shared expert runs on a second stream, overlapping
// the routed path, and joins the main stream before the final sum (forward and backward); without
// it, it runs on the main stream before the routed path. On the CPU both are the same sequential
// computation (bit-identical). Nothing synchronises with the host.
//
// Every phase is an NVTX range (worker/model/profiling.h), timed when a PhaseTimer is active:
// "moe.fwd" > router_gemm, route, aux_loss, the dispatcher's six phases (dispatch_preprocess,
// dispatch, dispatch_postprocess, fc1, swiglu, fc2 between them, combine_preprocess, combine,
// combine_postprocess), shared_join_add; "moe.bwd" > combine, fc2_dgrad, (act_recompute with
// moe_act recompute,) fc2_wgrad, swiglu,
// fc1_dgrad, fc1_wgrad, dispatch, route_aux, router_gemm, shared_join_add. The ranges are on the
// layer's stream: the overlapped shared expert shows up only in shared_join_add.
//
// Ownership: the layer owns its activation buffers (one micro-batch in flight: Forward must be
// followed by Backward before the next Forward), its dispatcher and its grouped-GEMM plan; the
// backward-only buffers of the routed experts and the dispatcher are borrowed scratch
// (MoEGradScratch, always), and with moe_act recompute so are the SwiGLU outputs (MoEActScratch).
// The parameters, gradients and router buffers are views owned by the caller (the model's
// contiguous parameter and gradient buffers). Use from one thread.
#ifndef SWITCHYARD_WORKER_MODEL_MOE_LAYER_H_
#define SWITCHYARD_WORKER_MODEL_MOE_LAYER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "kernels/gemm/grouped_gemm.h"
#include "kernels/moe/router.h"
#include "kernels/runtime/buffer.h"
#include "kernels/runtime/stream.h"
#include "switchyard/v1/config.pb.h"
#include "worker/comm/communicator.h"
#include "worker/model/dispatcher.h"
#include "worker/model/scratch_buffer.h"

namespace switchyard::model {

struct MoELayerConfig {
  int64_t hidden_size = 0;          // H
  int64_t ffn_hidden_size = 0;      // F: moe_ffn_hidden_size
  int64_t shared_ffn_size = 0;      // S: moe_shared_expert_intermediate_size; 0 = none
  bool shared_expert_gate = false;  // moe_shared_expert_gate
  bool pad_to_capacity = false;     // moe_pad_expert_input_to_capacity
  kernels::RouterConfig router;
  // Activation and weight dtype: bf16 on CUDA; f32 or f64 (gradient checks) on the CPU.
  DType dtype = DType::kBF16;
  // Grouped-GEMM path and tile (kernels/gemm/grouped_gemm.h); the defaults choose per device, and
  // kAuto takes the fallback kernel on CUDA when H or the local F / ETP is not a multiple of 8.
  kernels::GroupedGemmOptions gemm_options;
  // Expert parallelism (megatron_moe.md §3.2): this rank holds the L = E / ep_size experts
  // [ep_rank * L, (ep_rank + 1) * L); the expert weights (fc1, fc2) have L rows, the router stays
  // [E, H]. ep_size > 1 needs an EP communicator at Create (MoEParallelGroups).
  int ep_size = 1;
  int ep_rank = 0;
  // Expert tensor parallelism (expert_tensor_parallel_size, §3.5, §4): each of the ETP peers of an
  // EP rank holds the slice [etp_rank * F', (etp_rank + 1) * F'), F' = F / etp_size, of its
  // experts' F: fc1 column-parallel (the gate AND the up columns of that slice, so SwiGLU stays
  // local), fc2 row-parallel. The dispatcher gathers the peers' tokens so every peer runs the same
  // rows, and its combine sums the partial fc2 outputs. Needs F % etp_size == 0 and the ETP groups
  // at Create (MoEParallelGroups: etp for alltoall, etp_ep for allgather). The shared expert is
  // NOT split by ETP: Megatron runs it on the attention TP group (§4.4, sp_size below), so with
  // TP = 1 it is replicated and its gradients are dense (reduced over DP×CP).
  int64_t etp_size = 1, etp_rank = 0;
  // moe_token_dispatcher_type: the dispatcher used when ep_size > 1 (with ep_size = 1 every
  // expert is local and LocalDispatcher runs whatever this says, as Megatron's dispatchers
  // degenerate to a local permute). Megatron's default is allgather.
  enum class Dispatcher { kAllGather, kAllToAll };
  Dispatcher dispatcher = Dispatcher::kAllGather;
  // moe_shared_expert_overlap: on CUDA the shared expert runs on a side stream (forked after the
  // router input is ready, joined before its output is added), overlapping the routed path;
  // without it, on the layer's stream. On the CPU both are the same sequential computation.
  bool shared_expert_overlap = false;
  // delay_wgrad_compute (Megatron's --delay-wgrad-compute, for the EP all-to-all overlap): on CUDA
  // the routed experts' fc1 weight gradient runs on a wgrad stream, forked after fc1's data
  // gradient and joined at the end of Backward, so the dispatch-backward all-to-all and the
  // router's backward run while it does. fc2's wgrad stays in order: it reads d_expert_out, whose
  // memory fc1's dgrad overwrites (dispatcher.h). Off, or on the CPU: in order on the stream.
  bool delay_wgrad = false;
  // moe_permute_fusion (issue 16 item 1): the permutation fused into the routed experts' GEMMs.
  // fc1 (forward and weight gradient) reads the tokens x through the permutation's row index
  // (kernels/moe/permute.h PermuteIndex) instead of a permuted copy, and fc2's data and weight
  // gradients read the layer's output gradient the same way, so neither permuted copy is made
  // or kept (two [R, H] row copies per layer and micro-batch, and [R, H] of saved activations).
  // Taken where it applies: the local dispatcher (EP = 1, ETP = 1), dropless, and a grouped GEMM
  // that can gather (GroupedGemm::GatherSupported: CUTLASS SM90 with H, F/ETP and 2F/ETP
  // multiples of 128; always on the CPU, whose reference gathers into copies). Elsewhere the
  // unfused path runs; MoELayer::permute_fused() tells which. Same results up to the GEMMs'
  // fp32 summation order (bitwise on the CPU).
  bool permute_fusion = false;
  // Sequence parallelism (worker/model/gpt_model.h, "Tensor and sequence parallelism"): the
  // layer's tokens are this rank's shard, positions [sp_rank·S_loc, (sp_rank+1)·S_loc) of every
  // sequence, with S_loc = router.seq_length (the LOCAL sequence length) and sp_size·S_loc the
  // whole sequence. Then (megatron_moe.md §2.3, §1.6) the aux_loss / seq_aux_loss counts are
  // all-reduced over the TP group (MoEParallelGroups::tp) with N = T·sp_size and
  // Ns = S_loc·sp_size, the z-loss coefficient is divided by sp_size (the caller does that:
  // c_z' = c_z / size(TP×CP)), global_aux_loss's gradient factor counts DP only, and the input
  // jitter of a token is the one its global position would get, so every loss, value and
  // gradient summed over the TP ranks is the single-process one.
  // The shared expert is split over TP like the dense MLP (Megatron's SharedExpertMLP with
  // ColumnParallelLinear / RowParallelLinear, megatron_parallel.md §1.4, §1.6): this rank holds
  // S' = S / sp_size units, fc1 [H, 2S'] = the gate columns [sp_rank·S', +S') then the up columns
  // [S + sp_rank·S', +S') (SwiGLU stays local), fc2 [S', H] = those rows; the layer all-gathers the
  // shards' x over TP ([sp_size·T, H], rank-major: the expert is per token, so the order only has
  // to match the reduce-scatter's), and reduce-scatters fc2's partial sums back onto the shard;
  // backward: all-gather of dy, reduce-scatter of dx (the gathered x is kept from the forward,
  // sp_size·T·H per layer, instead of gathered again). The gate [H, 1] stays whole (TP-replicated,
  // its gradient all-reduced over TP by the trainer) and gates the shard's rows. Needs
  // S % sp_size == 0. The collectives run on the layer's stream: moe_shared_expert_overlap is
  // ignored at sp_size > 1 (no side stream).
  int sp_size = 1;
  int sp_rank = 0;
  // moe_act recompute (model.recompute_modules "moe_act", Megatron's): the SwiGLU outputs a of
  // the routed experts ([R, F']) and of the shared expert ([sp_size·T, S']) are not kept between
  // Forward and Backward. fc2 reads them from a scratch (MoEActScratch: shared by every MoE layer
  // of a model and every pipeline slot), and Backward recomputes SwiGLU from the kept fc1 output h
  // (and the expert probabilities) into it before fc2's weight gradient, the only reader of a in
  // the backward. Bit-identical to keeping a (the same deterministic kernel on the same inputs);
  // it costs one SwiGLU forward per layer and pass.
  bool recompute_act = false;
  // The model's layer index of this MoE layer (0-based, as StepMetrics' expert_load names it);
  // only used in error messages ("MoE layer 3 dispatch (forward): ..."); -1 = unknown.
  int64_t layer_number = -1;
  int64_t num_local_experts() const { return router.num_experts / ep_size; }
  // F' = F / ETP: this rank's slice of each expert's intermediate size.
  int64_t local_ffn_size() const { return ffn_hidden_size / etp_size; }
  // This rank's units of the shared expert (S / sp_size; see sp_size).
  int64_t local_shared_ffn_size() const { return shared_ffn_size / sp_size; }

  // From a defaulted and validated ModelConfig (common/config/config_defaults.h,
  // common/config/validate.h).
  static absl::StatusOr<MoELayerConfig> FromProto(const v1::ModelConfig& model, DType dtype);
  absl::Status Validate() const;
  // fp32, or fp64 when dtype is f64: the router's logits/probs dtype.
  DType router_dtype() const { return dtype == DType::kF64 ? DType::kF64 : DType::kF32; }
};

// Parameter (or gradient) views of one layer. Weight layouts ("x·W" form):
//   router_weight [E, H], fc1 [L, H, 2F'] (gate columns first), fc2 [L, F', H] (L = local experts,
//   E without expert parallelism; F' = F / ETP: fc1's gate and up columns [etp_rank·F', +F') of
//   the global [E, H, 2F], fc2's rows [etp_rank·F', +F') of the global [E, F, H]),
//   shared_fc1 [H, 2S'], shared_fc2 [S', H], shared_gate [H, 1] (empty when absent; S' = S /
//   sp_size, this TP rank's slice, MoELayerConfig::sp_size).
// Parameters have the layer dtype; gradients are f32 on CUDA (fp32 accumulation, DESIGN.md) or
// the layer dtype on the CPU, and are ACCUMULATED into by Backward.
struct MoELayerParams {
  Tensor router_weight, fc1, fc2, shared_fc1, shared_fc2, shared_gate;
};

// The process groups of an expert-parallel / data-parallel layer (borrowed; they outlive the
// layer). All optional: with none the layer is the single-process layer.
//   ep:  the EP group (size config.ep_size; the alltoall dispatcher's all-to-alls).
//   etp: the ETP group (size config.etp_size; the alltoall dispatcher's all-gather and
//        reduce-scatter around the EP all-to-all, megatron_moe.md §3.2). Needed when etp_size > 1.
//   etp_ep: the ETP×EP group, ETP-fastest (the allgather dispatcher's gathers, §3.3). Needed by
//        the allgather dispatcher when etp_size > 1 (with ETP = 1 it uses `ep`).
//   tdc: TP x DP x CP, over which global_aux_loss counts are all-reduced per micro-batch
//        (megatron_moe.md §2.3); the layer's dp_size (the N scaling) becomes its size.
//   tp:  the TP group (size config.sp_size): the aux_loss / seq_aux_loss counts of the sequence
//        shards are all-reduced over it (required when sp_size > 1).
//   cp:  the context-parallel group: each rank holds 2 chunks of every sequence, so aux_loss /
//        seq_aux_loss counts are summed over it per micro-batch and their N is the whole
//        sequence's (T·CP, S_loc·CP; §2.3), and the z-loss coefficient is divided by its size
//        (§1.6: the sum over CP ranks is the mean over the whole sequence). Its size also divides
//        the global_aux_loss gradient factor (dp_size / CP = the DP size). Together with tp
//        (TP > 1 and CP > 1: GptModel's "Tensor and context parallelism") the counts are summed
//        over tp and then over cp, together the TP×CP group of §2.3 (integer counts in f32, so
//        exactly one process's), N = T·TP·CP and Ns = S_loc·TP·CP, dp_size / (TP·CP), and the
//        z-loss coefficient is divided by TP (the caller) and CP (here).
struct MoEParallelGroups {
  comm::Communicator* ep = nullptr;
  comm::Communicator* tdc = nullptr;
  comm::Communicator* etp = nullptr;
  comm::Communicator* etp_ep = nullptr;
  comm::Communicator* tp = nullptr;
  comm::Communicator* cp = nullptr;
};

// moe_act recompute (MoELayerConfig::recompute_act): the buffers that hold the SwiGLU outputs
// from SwiGLU to fc2 (forward) and from the recompute to fc2's weight gradient (backward), one
// for the routed experts and one for the shared expert (which may run on a side stream while the
// routed experts run). Borrowed; they outlive the layer. A model passes the same two to all its
// MoE layers, whose passes run one after another; the overlapped shared expert of one layer is
// joined before the next layer's forks (Fork / Join). Null: the layer makes its own.
struct MoEActScratch {
  ScratchBuffer* routed = nullptr;
  ScratchBuffer* shared = nullptr;
};

// The routed path's backward-only buffers, which are written and read for the last time inside
// ONE layer's Backward: every MoE layer of a model and every in-flight pipeline slot share one
// buffer per role (worker/model/scratch_buffer.h), sized by the largest user, instead of one per
// layer and slot. Always on (not a knob; results are bit-identical: the same kernels on the same
// inputs, only the memory they write is shared):
//   da [R, F']  the gradient of the SwiGLU output (fc2's data gradient);
//   dh [R, 2F'] the gradient of fc1's output (SwiGLU's backward);
//   dispatcher  the dispatcher's d_expert_out, d_expert_x [R, H] and d_expert_probs [R]
//               (DispatcherGradScratch, dispatcher.h).
// What the layer keeps from its forward for its backward (h, a, expert_x, the router's
// tensors, ...) stays the layer's own. With delay_wgrad, fc1's weight gradient reads dh (and the
// layer's own expert_x) on the wgrad stream; Backward makes its stream wait for that ("wgrad_join")
// before it returns, so the next Backward's writes to dh, on the stream, come after that read.
// The shared expert's gradients (on its side stream with moe_shared_expert_overlap) stay per
// layer. Borrowed; they outlive the layer. A null role: the layer (or its dispatcher) makes its
// own; MoEGradBuffers owns a full set.
struct MoEGradScratch {
  ScratchBuffer* da = nullptr;
  ScratchBuffer* dh = nullptr;
  DispatcherGradScratch dispatcher;
};

// One ScratchBuffer per MoEGradScratch role on one device: what a model holds for its MoE layers
// (GptModel). Neither copied nor moved (the layers keep pointers to its buffers).
class MoEGradBuffers {
 public:
  explicit MoEGradBuffers(Device device)
      : da_(device),
        dh_(device),
        d_expert_out_(device),
        d_expert_x_(device),
        d_expert_probs_(device) {}
  MoEGradBuffers(const MoEGradBuffers&) = delete;
  MoEGradBuffers& operator=(const MoEGradBuffers&) = delete;
  MoEGradScratch scratch() {
    return {&da_, &dh_, {&d_expert_out_, &d_expert_x_, &d_expert_probs_}};
  }

 private:
  ScratchBuffer da_, dh_, d_expert_out_, d_expert_x_, d_expert_probs_;
};

// Non-trainable router state: expert_bias [E] f32 (aux-loss-free balancing, read when enabled)
// and local_tokens_per_expert [E] f32 (accumulated in training when expert bias is enabled; the
// trainer all-reduces it and calls kernels::UpdateExpertBias once per global batch).
struct MoERouterState {
  Tensor expert_bias, local_tokens_per_expert;
};

class MoELayer {
 public:
  // Plans the layer for at most `max_tokens` tokens per micro-batch on `device`: allocates the
  // activation buffers, the dispatcher and the grouped-GEMM plan.
  // With config.ep_size > 1 or etp_size > 1, groups.ep must be the EP group of that size (and
  // groups.etp / etp_ep the ETP / ETP×EP groups when etp_size > 1), and the layer uses the
  // dispatcher config.dispatcher names (allgather or alltoall; both dropless, no pad-to-capacity).
  // With config.recompute_act the SwiGLU outputs live in `act_scratch` (reserved here for this
  // layer's sizes; see MoEActScratch). The backward-only buffers live in `grad_scratch` (reserved
  // likewise; see MoEGradScratch).
  static absl::StatusOr<std::unique_ptr<MoELayer>> Create(const MoELayerConfig& config,
                                                          Device device, int64_t max_tokens,
                                                          const MoEParallelGroups& groups = {},
                                                          const MoEActScratch& act_scratch = {},
                                                          const MoEGradScratch& grad_scratch = {});
  MoELayer(const MoELayer&) = delete;
  MoELayer& operator=(const MoELayer&) = delete;
  ~MoELayer();

  // y [T, H] = MoE(x [T, H]); saves what Backward needs. `x` must stay valid and hold the same
  // values when Backward runs (the model's activation arena keeps it, or, with the "layernorm"
  // recompute, GptModel recomputes it into the same scratch first; the layer does not copy it).
  // `jitter_offset` selects fresh jitter noise per step (ignored unless training with input
  // jitter).
  absl::Status Forward(const Stream& stream, const MoELayerParams& params,
                       const MoERouterState& router_state, const Tensor& x, const Tensor& y,
                       uint64_t jitter_offset = 0);

  // dx [T, H] (OVERWRITTEN) from dy [T, H]; adds the weight gradients to `grads`, or, with
  // kOverwrite (the first micro-batch of a step), writes them without reading the old values:
  // the fp32 expert gradients are large (dsv3: 45 GB per layer on one GPU) and the weight-
  // gradient GEMMs are memory-bound, so not reading zeros halves their traffic.
  // aux_grad_scale seeds the aux/z-loss gradients (1/num_microbatches in a plain schedule).
  enum class GradMode { kAccumulate, kOverwrite };
  absl::Status Backward(const Stream& stream, const MoELayerParams& params,
                        const MoELayerParams& grads, const Tensor& dy, const Tensor& dx,
                        double aux_grad_scale, GradMode grad_mode = GradMode::kAccumulate);

  // After Forward (device tensors; read them after synchronising the stream):
  //   tokens_per_expert [E] i32 (kept slots per expert), topk_idx [T, k], topk_probs [T, k],
  //   losses [n + 1]: each load-balancing term (coefficient included) then the z-loss.
  const Tensor& tokens_per_expert() const { return tokens_per_expert_; }
  const Tensor& topk_idx() const { return topk_idx_; }
  const Tensor& topk_probs() const { return topk_probs_; }
  const Tensor& losses() const { return losses_; }
  // After Backward: d(objective)/d(topk_probs) [T, k], the router-probability gradient.
  Tensor dtopk_probs() const;

  // global_aux_loss: counts accumulated over the micro-batches of the global batch. Call once
  // per global batch (after the optimizer step).
  absl::Status ResetGlobalBatch();
  // Pipeline slots (worker/model/gpt_model.h "Pipeline parallelism"): the MoE layers of one
  // decoder layer's in-flight slots see the micro-batches in turn, so their global_aux_loss
  // running counts must be one: this layer then accumulates into (and averages) `owner`'s
  // (borrowed; outlives this layer), and owner's ResetGlobalBatch resets them.
  void ShareGlobalAuxCounts(MoELayer* owner) { global_owner_ = owner; }
  void set_dp_size(int dp) { dp_size_ = dp; }
  // Context parallelism: the layer's tokens are local sequences of `local_seq_len` rows, chunks
  // cp_rank and 2·cp_size−1−cp_rank of sequences of local_seq_len·cp_size tokens. The input
  // jitter then draws, for every token, the noise one process draws for it (offsets of the
  // token's row in the whole micro-batch; Forward's jitter_offset is the whole micro-batch's).
  absl::Status SetContextParallelJitter(int64_t cp_size, int64_t cp_rank, int64_t local_seq_len);
  const MoELayerConfig& config() const { return config_; }
  // Training (the default) or evaluation mode of the router (kernels::RouterConfig::training):
  // evaluation draws no input jitter, computes no aux/z-loss (so no global_aux_loss running
  // counts and no collective for them), adds nothing to local_tokens_per_expert (the
  // expert-bias update) and routes sinkhorn by plain top-k, as Megatron's model.eval() under
  // torch.no_grad(). GptModel::SetTraining switches every MoE layer.
  void set_training(bool training) { config_.router.training = training; }
  // The dispatcher in use: "local" (EP = 1), "allgather" or "alltoall".
  const char* dispatcher_name() const { return dispatcher_->name(); }
  // Whether the permutation is fused into the experts (MoELayerConfig::permute_fusion, where it
  // applies).
  bool permute_fused() const { return permute_fused_; }

 private:
  MoELayer() = default;
  absl::Status SharedForward(const Stream& s, const MoELayerParams& p, const Tensor& x);
  // fc1's weight gradient from dh: x read from expert_x, or (permute_fused_) through the row index.
  absl::Status Fc1Wgrad(const Stream& stream, const Tensor& dh, const MoELayerParams& g,
                        bool accumulate);
  absl::Status SharedBackward(const Stream& s, const MoELayerParams& p, const MoELayerParams& g,
                              const Tensor& dy, float grad_beta);
  absl::Status RoutedForward(const Stream& stream, const MoELayerParams& p,
                             const MoERouterState& rs, const Tensor& x, const Tensor& y,
                             uint64_t jitter_offset);
  // Side stream for the shared expert (CUDA only): fork waits for `main`, join makes `main`
  // wait for the side stream.
  absl::Status Fork(const Stream& main);
  absl::Status Join(const Stream& main);
  Stream SideStream(const Stream& main) const;

  MoELayerConfig config_;
  Device device_;
  int64_t max_tokens_ = 0;
  int dp_size_ = 1;
  comm::Communicator* tdc_ = nullptr;  // global_aux_loss counts (may be null)
  comm::Communicator* tp_ = nullptr;   // aux / seq_aux counts of the sequence shards (SP)
  comm::Communicator* cp_ = nullptr;   // aux / seq_aux counts under CP (null: no CP)
  int cp_size_ = 1;
  int64_t jitter_cp_size_ = 1, jitter_cp_rank_ = 0, jitter_local_seq_ = 0;
  // Calls fn(first_row, rows, jitter element offset) for each run of the t local tokens whose
  // global positions in the whole micro-batch are contiguous: all t rows at once without SP and
  // CP, one run per sequence shard with SP, one per CP chunk with CP (SP shards within the CP
  // rank's local sequence split further where a shard crosses its two chunks).
  absl::Status ForEachJitterSpan(
      int64_t t, absl::FunctionRef<absl::Status(int64_t, int64_t, uint64_t)> fn) const;
  Tensor global_step_counts_;  // [E] f32: this micro-batch's counts, all-reduced
  bool has_aux_ = false, has_global_aux_ = false;
  int64_t global_steps_ = 0;
  MoELayer* global_owner_ = this;  // whose global_counts_ / global_steps_ accumulate (see above)
  uint64_t jitter_offset_ = 0;
  int64_t tokens_ = 0;  // T of the micro-batch in flight

  std::unique_ptr<TokenDispatcher> dispatcher_;
  std::unique_ptr<kernels::GroupedGemm> gemm_;
  DispatchState state_;
  std::optional<kernels::SideStream> side_;  // the shared expert's overlap (CUDA; else none)
  // delay_wgrad: the stream fc1's wgrad runs on, with its fork / join events (CUDA; else none).
  std::optional<kernels::SideStream> wgrad_;

  // recompute_act: where a_ and sh_a_ live (views taken at each use: RoutedAct / SharedAct), and
  // the layer's own scratch when Create got none.
  ScratchBuffer* routed_act_ = nullptr;
  ScratchBuffer* shared_act_ = nullptr;
  std::unique_ptr<ScratchBuffer> own_routed_act_, own_shared_act_;
  // The routed experts' SwiGLU output [R, F'] (a_, or the scratch) and the shared expert's
  // [sp_size·T, S'] (sh_a_, or the scratch).
  Tensor RoutedAct() const;
  Tensor SharedAct() const;

  // MoEGradScratch's da and dh (views taken in Backward), and the layer's own when Create got
  // none.
  ScratchBuffer* da_ = nullptr;
  ScratchBuffer* dh_ = nullptr;
  std::unique_ptr<ScratchBuffer> own_da_, own_dh_;

  // Saved activations and scratch; see moe_layer.cc for shapes.
  std::vector<kernels::Buffer> buffers_;
  Tensor xr_, logits_, topk_idx_, topk_probs_, selected_idx_, tokens_per_expert_, router_ws_;
  Tensor aux_prob_sums_, aux_counts_, aux_lse_, aux_ws_, aux_grad_weights_, losses_;
  Tensor global_counts_, global_mean_counts_;
  Tensor h_, a_, dtopk_probs_, dlogits_, dlogits_lowp_, dx_tmp_;
  Tensor sh_h_, sh_a_, sh_y_, sh_gated_, sh_g_, sh_dy_, sh_da_, sh_dh_, sh_dg_, sh_dg_lowp_, sh_dx_;
  // sp_size > 1: the shared expert's TP-gathered input [sp_size·T, H] (kept for fc1's weight
  // gradient) and the partial sums / gathered dy [sp_size·T, H].
  Tensor sh_xall_, sh_part_;
  bool permute_fused_ = false;
  Tensor x_saved_;  // the input x of the micro-batch in flight (a view owned by the caller)
  // h_, a_ ([R, 2F'], [R, F']) with R = expert_rows_, the dispatcher's current expert-row
  // capacity (a_ empty with recompute_act); da_ and dh_ are reserved for R rows.
  std::vector<kernels::Buffer> expert_buffers_;
  int64_t expert_rows_ = -1;
  absl::Status FitExpertRows(int64_t rows);
};

}  // namespace switchyard::model

#endif  // SWITCHYARD_WORKER_MODEL_MOE_LAYER_H_
