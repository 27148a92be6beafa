#include "worker/model/moe_layer.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/attention/rope.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/gemm/gemm.h"
#include "kernels/moe/aux_loss.h"
#include "kernels/moe/swiglu.h"
#include "kernels/runtime/cuda_status.h"
#include "worker/model/allgather_dispatcher.h"
#include "worker/model/alltoall_dispatcher.h"
#include "worker/model/profiling.h"

namespace switchyard::model {

using kernels::Buffer;

absl::Status MoELayerConfig::Validate() const {
  if (hidden_size <= 0 || ffn_hidden_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("moe layer: hidden_size (", hidden_size,
                                                   ") and moe_ffn_hidden_size (", ffn_hidden_size,
                                                   ") must be positive"));
  }
  if (shared_ffn_size < 0) {
    return absl::InvalidArgumentError(
        "moe layer: moe_shared_expert_intermediate_size must be >= 0");
  }
  if (shared_expert_gate && shared_ffn_size == 0) {
    return absl::InvalidArgumentError(
        "moe layer: moe_shared_expert_gate requires moe_shared_expert_intermediate_size > 0");
  }
  if (ep_size < 1 || ep_rank < 0 || ep_rank >= ep_size || router.num_experts % ep_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe layer: num_experts (", router.num_experts,
                     ") must be divisible by expert_model_parallel_size (", ep_size,
                     ") and ep_rank (", ep_rank, ") in [0, ", ep_size, ")"));
  }
  if (etp_size < 1 || etp_rank < 0 || etp_rank >= etp_size) {
    return absl::InvalidArgumentError(absl::StrCat("moe layer: expert_tensor_parallel_size (",
                                                   etp_size, ") must be >= 1 and ", "etp_rank (",
                                                   etp_rank, ") in [0, ", etp_size, ")"));
  }
  if (ffn_hidden_size % etp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "moe layer: moe_ffn_hidden_size (", ffn_hidden_size,
        ") must be divisible by expert_tensor_parallel_size (", etp_size,
        "): each ETP rank holds an equal slice of every expert's fc1 columns and fc2 rows"));
  }
  if ((ep_size > 1 || etp_size > 1) && pad_to_capacity) {
    return absl::InvalidArgumentError(
        "moe layer: moe_pad_expert_input_to_capacity is not supported with "
        "expert_model_parallel_size or expert_tensor_parallel_size > 1 (the allgather and "
        "alltoall dispatchers are dropless)");
  }
  if (sp_size < 1 || sp_rank < 0 || sp_rank >= sp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe layer: sp_rank (", sp_rank, ") must be in [0, sp_size ", sp_size, ")"));
  }
  if (sp_size > 1 && shared_ffn_size % sp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.moe_shared_expert_intermediate_size (", shared_ffn_size,
                     ") must be divisible by parallel.tensor_model_parallel_size (", sp_size,
                     "): the shared expert is split over the TP ranks like the dense MLP"));
  }
  if (sp_size > 1 && router.seq_length < 1) {
    return absl::InvalidArgumentError(
        "moe layer: sequence parallelism needs router.seq_length (the local sequence length)");
  }
  if (pad_to_capacity && router.capacity_factor <= 0) {
    return absl::InvalidArgumentError(
        "moe layer: moe_pad_expert_input_to_capacity requires moe_expert_capacity_factor > 0");
  }
  return router.Validate();
}

absl::StatusOr<MoELayerConfig> MoELayerConfig::FromProto(const v1::ModelConfig& m, DType dtype) {
  MoELayerConfig c;
  c.dtype = dtype;
  c.hidden_size = m.hidden_size();
  c.ffn_hidden_size = m.has_moe_ffn_hidden_size() ? m.moe_ffn_hidden_size() : m.ffn_hidden_size();
  c.shared_ffn_size = m.moe_shared_expert_intermediate_size();
  c.shared_expert_gate = m.moe_shared_expert_gate();
  c.pad_to_capacity = m.moe_pad_expert_input_to_capacity();
  c.shared_expert_overlap = m.moe_shared_expert_overlap();
  c.delay_wgrad = m.delay_wgrad_compute();
  c.permute_fusion = m.moe_permute_fusion();
  const std::string& dispatcher = m.moe_token_dispatcher_type();
  if (dispatcher.empty() || dispatcher == "allgather") {
    c.dispatcher = MoELayerConfig::Dispatcher::kAllGather;
  } else if (dispatcher == "alltoall") {
    c.dispatcher = MoELayerConfig::Dispatcher::kAllToAll;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("model.moe_token_dispatcher_type (\"", dispatcher,
                     "\") must be one of \"allgather\", \"alltoall\""));
  }
  if (!m.moe_router_dtype().empty() && m.moe_router_dtype() != "fp32") {
    return absl::InvalidArgumentError(
        absl::StrCat("model.moe_router_dtype (\"", m.moe_router_dtype(),
                     "\") is not supported: the router runs in fp32"));
  }
  kernels::RouterConfig& r = c.router;
  r.num_experts = m.num_experts();
  r.topk = m.moe_router_topk();
  r.score_function = m.moe_router_score_function() == "sigmoid"
                         ? kernels::RouterScoreFunction::kSigmoid
                         : kernels::RouterScoreFunction::kSoftmax;
  r.pre_softmax = m.moe_router_pre_softmax();
  r.num_groups = m.moe_router_num_groups();
  r.group_topk = m.moe_router_group_topk();
  r.topk_scaling_factor =
      m.has_moe_router_topk_scaling_factor() ? m.moe_router_topk_scaling_factor() : 1.0;
  r.use_expert_bias = m.moe_router_enable_expert_bias();
  r.capacity_factor = m.has_moe_expert_capacity_factor() ? m.moe_expert_capacity_factor() : 0.0;
  r.drop_policy = m.moe_token_drop_policy() == "position" ? kernels::CapacityDropPolicy::kPosition
                                                          : kernels::CapacityDropPolicy::kProbs;
  r.input_jitter_eps = m.moe_input_jitter_eps();
  r.z_loss_coeff = m.moe_z_loss_coeff();
  r.seq_length = m.seq_length();
  for (int i = 0; i < m.moe_router_load_balancing_type_size(); ++i) {
    const std::string& type = m.moe_router_load_balancing_type(i);
    const double coeff = i < m.moe_aux_loss_coeff_size() ? m.moe_aux_loss_coeff(i) : 0.0;
    if (type == "sinkhorn") {
      r.sinkhorn = true;
    } else if (type == "aux_loss") {
      r.aux_losses.push_back({kernels::AuxLossType::kAuxLoss, coeff});
    } else if (type == "seq_aux_loss") {
      r.aux_losses.push_back({kernels::AuxLossType::kSeqAuxLoss, coeff});
    } else if (type == "global_aux_loss") {
      r.aux_losses.push_back({kernels::AuxLossType::kGlobalAuxLoss, coeff});
    } else if (type != "none") {
      return absl::InvalidArgumentError(absl::StrCat("model.moe_router_load_balancing_type[", i,
                                                     "]: unknown type \"", type, "\""));
    }
  }
  SY_RETURN_IF_ERROR(c.Validate());
  return c;
}

MoELayer::~MoELayer() = default;

absl::StatusOr<std::unique_ptr<MoELayer>> MoELayer::Create(const MoELayerConfig& config,
                                                           Device device, int64_t max_tokens,
                                                           const MoEParallelGroups& groups,
                                                           const MoEActScratch& act_scratch,
                                                           const MoEGradScratch& grad_scratch) {
  SY_RETURN_IF_ERROR(config.Validate());
  if (max_tokens <= 0) return absl::InvalidArgumentError("MoELayer: max_tokens must be positive");
  if (device.is_cuda() && config.dtype == DType::kF64) {
    return absl::InvalidArgumentError("MoELayer: f64 runs only on the CPU");
  }
  std::unique_ptr<MoELayer> l(new MoELayer());
  l->config_ = config;
  l->device_ = device;
  l->max_tokens_ = max_tokens;
  const kernels::RouterConfig& rc = config.router;
  // f: this rank's slice of the experts' intermediate size (F / ETP).
  const int64_t t = max_tokens, h = config.hidden_size, f = config.local_ffn_size();
  // s: this rank's shared-expert units; ts: the rows the shared expert's GEMMs see (the TP-gathered
  // tokens at sp_size > 1).
  const int64_t e = rc.num_experts, k = rc.topk, s = config.local_shared_ffn_size();
  const int64_t ts = t * config.sp_size;
  const DType dt = config.dtype, rdt = config.router_dtype();
  for (const auto& term : rc.aux_losses) {
    l->has_aux_ = true;
    if (term.type == kernels::AuxLossType::kGlobalAuxLoss) l->has_global_aux_ = true;
  }
  l->has_aux_ = l->has_aux_ || rc.z_loss_coeff > 0;

  // Pad-to-capacity: every expert gets exactly C rows. When C >= T nothing is dropped and the
  // padding is T rows per expert, which keeps the shapes static.
  const int64_t capacity = kernels::ExpertCapacity(rc, t);
  const int64_t pad_rows = config.pad_to_capacity ? (capacity > 0 ? capacity : t) : 0;
  // The CUTLASS SM90 grouped GEMM needs K and N multiples of 8 (TMA alignment): fc1 is
  // [H, 2f], fc2 [f, H]. An ETP slice can break that where the full size does not (F = 24 at
  // ETP 2 gives f = 12), so with kAuto such a layer runs the portable fallback kernel (correct,
  // slower) instead of failing its first step. A path forced by the caller is kept as given.
  kernels::GroupedGemmOptions gemm_options = config.gemm_options;
  if (device.is_cuda() && gemm_options.path == kernels::GroupedGemmPath::kAuto &&
      (h % 8 != 0 || f % 8 != 0)) {
    gemm_options.path = kernels::GroupedGemmPath::kFallback;
  }
  SY_ASSIGN_OR_RETURN(
      l->gemm_, kernels::GroupedGemm::Create(device, static_cast<int>(config.num_local_experts()),
                                             gemm_options));
  // moe_permute_fusion where it applies (MoELayerConfig::permute_fusion).
  l->permute_fused_ = config.permute_fusion && config.ep_size == 1 && config.etp_size == 1 &&
                      pad_rows == 0 && l->gemm_->GatherSupported(h, 2 * f) &&
                      l->gemm_->GatherSupported(f, h);
  if (config.ep_size > 1 || config.etp_size > 1) {
    if (groups.ep == nullptr || groups.ep->size() != config.ep_size ||
        groups.ep->rank() != config.ep_rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("MoELayer: expert_model_parallel_size ", config.ep_size, " (ep_rank ",
                       config.ep_rank, ") needs the EP group of that size and rank, got ",
                       groups.ep ? absl::StrCat("'", groups.ep->name(), "' rank ",
                                                groups.ep->rank(), "/", groups.ep->size())
                                 : std::string("none")));
    }
    const bool alltoall = config.dispatcher == MoELayerConfig::Dispatcher::kAllToAll;
    if (config.etp_size > 1) {
      // alltoall: ETP group for the AG/RS around the EP all-to-all; allgather: one ETP×EP group.
      comm::Communicator* need = alltoall ? groups.etp : groups.etp_ep;
      const int64_t size = alltoall ? config.etp_size : config.etp_size * config.ep_size;
      const int64_t rank =
          alltoall ? config.etp_rank : config.ep_rank * config.etp_size + config.etp_rank;
      if (need == nullptr || need->size() != size || need->rank() != rank) {
        return absl::InvalidArgumentError(absl::StrCat(
            "MoELayer: expert_tensor_parallel_size ", config.etp_size, " (etp_rank ",
            config.etp_rank, ") with the ", alltoall ? "alltoall" : "allgather",
            " dispatcher needs the ", alltoall ? "ETP" : "ETP x EP", " group of size ", size,
            " and rank ", rank, ", got ",
            need ? absl::StrCat("'", need->name(), "' rank ", need->rank(), "/", need->size())
                 : std::string("none")));
      }
    }
    // Communication errors name the layer: "MoE layer 3 dispatch (forward): ...".
    const std::string label = config.layer_number >= 0
                                  ? absl::StrCat("MoE layer ", config.layer_number)
                                  : std::string("MoE layer");
    if (alltoall) {
      SY_ASSIGN_OR_RETURN(l->dispatcher_, AllToAllDispatcher::Create(
                                              groups.ep, device, dt, rdt, t, h, static_cast<int>(e),
                                              config.ep_size, static_cast<int>(k),
                                              config.etp_size > 1 ? groups.etp : nullptr, label,
                                              /*expert_row_limit=*/0, grad_scratch.dispatcher));
    } else {
      SY_ASSIGN_OR_RETURN(l->dispatcher_,
                          AllGatherDispatcher::Create(
                              config.etp_size > 1 ? groups.etp_ep : groups.ep, device, dt, rdt, t,
                              h, static_cast<int>(e), config.ep_size, static_cast<int>(k),
                              static_cast<int>(config.etp_size), label, grad_scratch.dispatcher));
    }
  } else {
    SY_ASSIGN_OR_RETURN(l->dispatcher_,
                        LocalDispatcher::Create(device, dt, rdt, t, h, e, k, pad_rows,
                                                grad_scratch.dispatcher, l->permute_fused_));
  }
  l->tdc_ = groups.tdc;
  if (groups.tdc != nullptr) l->dp_size_ = groups.tdc->size();
  if (config.sp_size > 1) {
    if (groups.tp == nullptr || groups.tp->size() != config.sp_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("moe layer: sp_size ", config.sp_size, " needs a TP group of that size"));
    }
    l->tp_ = groups.tp;
  }
  if (groups.cp != nullptr && groups.cp->size() > 1) {
    l->cp_ = groups.cp;
    l->cp_size_ = groups.cp->size();
    // §1.6: c_z' = moe_z_loss_coeff / size(TP×CP): each CP rank's z-loss is the mean over its
    // own tokens, so the sum over the CP ranks is the mean over the whole sequence. (The TP
    // share of the division is the caller's, with sp_size: MoELayerConfig::sp_size.)
    l->config_.router.z_loss_coeff /= l->cp_size_;
  }
  const int64_t r = l->dispatcher_->ExpertRowCapacity();
  // The backward-only da and dh (MoEGradScratch), reserved by FitExpertRows.
  l->da_ = BorrowOrOwn(grad_scratch.da, device, &l->own_da_);
  l->dh_ = BorrowOrOwn(grad_scratch.dh, device, &l->own_dh_);
  if (config.recompute_act) {
    // moe_act: the SwiGLU outputs live in the (shared) scratch, reserved for this layer's sizes
    // here (FitExpertRows for the routed experts' rows).
    l->routed_act_ = act_scratch.routed;
    if (l->routed_act_ == nullptr) {
      l->own_routed_act_ = std::make_unique<ScratchBuffer>(device);
      l->routed_act_ = l->own_routed_act_.get();
    }
    l->shared_act_ = act_scratch.shared;
    if (l->shared_act_ == nullptr && s > 0) {
      l->own_shared_act_ = std::make_unique<ScratchBuffer>(device);
      l->shared_act_ = l->own_shared_act_.get();
    }
  }

  auto alloc = [&](DType d, std::vector<int64_t> shape, Tensor* view) -> absl::Status {
    SY_ASSIGN_OR_RETURN(Buffer b, Buffer::ForTensor(d, std::move(shape), device));
    *view = b.View();
    l->buffers_.push_back(std::move(b));
    return absl::OkStatus();
  };
  const bool lowp = dt == DType::kBF16;
  SY_RETURN_IF_ERROR(alloc(dt, {rc.input_jitter_eps > 0 ? t : 0, h}, &l->xr_));
  SY_RETURN_IF_ERROR(alloc(rdt, {t, e}, &l->logits_));
  SY_RETURN_IF_ERROR(alloc(DType::kI32, {t, k}, &l->topk_idx_));
  SY_RETURN_IF_ERROR(alloc(rdt, {t, k}, &l->topk_probs_));
  SY_RETURN_IF_ERROR(alloc(DType::kI32, {t, k}, &l->selected_idx_));
  SY_RETURN_IF_ERROR(alloc(DType::kI32, {e}, &l->tokens_per_expert_));
  SY_RETURN_IF_ERROR(alloc(
      DType::kU8, {device.is_cuda() ? kernels::RouterWorkspaceBytes(rc, t) : 0}, &l->router_ws_));
  const int64_t b = kernels::AuxLossNumSequences(rc, t);
  SY_RETURN_IF_ERROR(alloc(DType::kF64, {b, e}, &l->aux_prob_sums_));
  SY_RETURN_IF_ERROR(alloc(DType::kF32, {b, e}, &l->aux_counts_));
  SY_RETURN_IF_ERROR(alloc(DType::kF64, {1}, &l->aux_lse_));
  SY_RETURN_IF_ERROR(alloc(
      DType::kU8, {device.is_cuda() ? kernels::AuxLossWorkspaceBytes(rc, t) : 0}, &l->aux_ws_));
  SY_RETURN_IF_ERROR(alloc(rdt, {b, e}, &l->aux_grad_weights_));
  SY_RETURN_IF_ERROR(alloc(rdt, {static_cast<int64_t>(rc.aux_losses.size()) + 1}, &l->losses_));
  SY_RETURN_IF_ERROR(alloc(DType::kF32, {e}, &l->global_counts_));
  SY_RETURN_IF_ERROR(alloc(DType::kF32, {e}, &l->global_mean_counts_));
  SY_RETURN_IF_ERROR(alloc(DType::kF32, {l->tdc_ ? e : 0}, &l->global_step_counts_));
  SY_RETURN_IF_ERROR(kernels::FillBytes(l->global_counts_, 0));
  SY_RETURN_IF_ERROR(kernels::FillBytes(l->losses_, 0));
  SY_RETURN_IF_ERROR(l->FitExpertRows(r));
  SY_RETURN_IF_ERROR(alloc(rdt, {t, k}, &l->dtopk_probs_));
  SY_RETURN_IF_ERROR(alloc(rdt, {t, e}, &l->dlogits_));
  SY_RETURN_IF_ERROR(alloc(DType::kBF16, {lowp ? t : 0, e}, &l->dlogits_lowp_));
  // The router's input gradient needs its own buffer only to be jittered before the add; without
  // jitter the gating GEMM adds it into dx itself (Backward).
  SY_RETURN_IF_ERROR(alloc(dt, {rc.input_jitter_eps > 0 ? t : 0, h}, &l->dx_tmp_));
  if (s > 0) {
    SY_RETURN_IF_ERROR(alloc(dt, {ts, 2 * s}, &l->sh_h_));
    if (config.recompute_act) {
      SY_RETURN_IF_ERROR(l->shared_act_->Reserve(ts * s * DTypeSize(dt)));
    } else {
      SY_RETURN_IF_ERROR(alloc(dt, {ts, s}, &l->sh_a_));
    }
    SY_RETURN_IF_ERROR(alloc(dt, {t, h}, &l->sh_y_));
    SY_RETURN_IF_ERROR(alloc(dt, {ts, s}, &l->sh_da_));
    SY_RETURN_IF_ERROR(alloc(dt, {ts, 2 * s}, &l->sh_dh_));
    SY_RETURN_IF_ERROR(alloc(dt, {t, h}, &l->sh_dx_));
    if (config.sp_size > 1) {
      SY_RETURN_IF_ERROR(alloc(dt, {ts, h}, &l->sh_xall_));
      SY_RETURN_IF_ERROR(alloc(dt, {ts, h}, &l->sh_part_));
    }
    if (config.shared_expert_gate) {
      SY_RETURN_IF_ERROR(alloc(rdt, {t, 1}, &l->sh_g_));
      SY_RETURN_IF_ERROR(alloc(dt, {t, h}, &l->sh_dy_));
      SY_RETURN_IF_ERROR(alloc(dt, {t, h}, &l->sh_gated_));
      SY_RETURN_IF_ERROR(alloc(rdt, {t}, &l->sh_dg_));
      SY_RETURN_IF_ERROR(alloc(dt, {t, 1}, &l->sh_dg_lowp_));
    }
    // At sp_size > 1 the shared expert's TP collectives run on the layer's stream: no side stream.
    if (device.is_cuda() && config.shared_expert_overlap && config.sp_size == 1) {
      SY_ASSIGN_OR_RETURN(l->side_, kernels::SideStream::Create(device));
    }
  }
  // delay_wgrad_compute concerns the routed experts: with or without a shared expert.
  if (device.is_cuda() && config.delay_wgrad) {
    SY_ASSIGN_OR_RETURN(l->wgrad_, kernels::SideStream::Create(device));
  }
  return l;
}

Stream MoELayer::SideStream(const Stream& main) const { return side_ ? side_->view() : main; }

absl::Status MoELayer::Fork(const Stream& main) {
  return side_ ? side_->Fork(main) : absl::OkStatus();
}

absl::Status MoELayer::Join(const Stream& main) {
  return side_ ? side_->Join(main) : absl::OkStatus();
}

namespace {
Tensor Rows(const Tensor& t, int64_t rows) {
  Tensor v = t;
  v.shape[0] = rows;
  return v;
}
// Rows [first, first + rows) of a row-major [N, ...] tensor.
Tensor RowRange(const Tensor& t, int64_t first, int64_t rows) {
  Tensor v = Rows(t, rows);
  v.data = static_cast<char*>(t.data) +
           first * (t.numel() / std::max<int64_t>(1, t.dim(0))) * DTypeSize(t.dtype);
  return v;
}
}  // namespace

absl::Status MoELayer::SetContextParallelJitter(int64_t cp_size, int64_t cp_rank,
                                                int64_t local_seq_len) {
  if (cp_size < 1 || cp_rank < 0 || cp_rank >= cp_size ||
      (cp_size > 1 && (local_seq_len < 2 || local_seq_len % 2 != 0))) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoELayer::SetContextParallelJitter: cp_rank ", cp_rank, " of cp_size ",
                     cp_size, " with local sequence length ", local_seq_len, " (must be even)"));
  }
  jitter_cp_size_ = cp_size;
  jitter_cp_rank_ = cp_rank;
  jitter_local_seq_ = local_seq_len;
  return absl::OkStatus();
}

absl::Status MoELayer::Forward(const Stream& stream, const MoELayerParams& p,
                               const MoERouterState& rs, const Tensor& x, const Tensor& y,
                               uint64_t jitter_offset) {
  const int64_t t = x.dim(0);
  SY_RETURN_IF_ERROR(CheckTensor(x, "moe.x", config_.dtype, {-1, config_.hidden_size}));
  SY_RETURN_IF_ERROR(CheckTensor(y, "moe.y", config_.dtype, {t, config_.hidden_size}));
  if (t > max_tokens_) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe.x: ", t, " tokens exceed the planned ", max_tokens_));
  }
  tokens_ = t;
  x_saved_ = x;
  ScopedRange range(stream, "moe.fwd");
  jitter_offset_ = jitter_offset;
  if (config_.shared_ffn_size > 0) {
    SY_RETURN_IF_ERROR(Fork(stream));
    SY_RETURN_IF_ERROR(SharedForward(SideStream(stream), p, x));
  }
  SY_RETURN_IF_ERROR(RoutedForward(stream, p, rs, x, y, jitter_offset));
  if (config_.shared_ffn_size > 0) {
    ScopedRange join(stream, "shared_join_add");
    SY_RETURN_IF_ERROR(Join(stream));
    const Tensor& shared_out = config_.shared_expert_gate ? sh_gated_ : sh_y_;
    SY_RETURN_IF_ERROR(kernels::Axpby(stream, 1.0f, y, 1.0f, Rows(shared_out, t), y));
  }
  return absl::OkStatus();
}

absl::Status MoELayer::ForEachJitterSpan(
    int64_t t, absl::FunctionRef<absl::Status(int64_t, int64_t, uint64_t)> fn) const {
  const int64_t sp = config_.sp_size, cp = jitter_cp_size_;
  if (sp == 1 && cp <= 1) return fn(0, t, 0);
  const int64_t h = config_.hidden_size;
  // s_loc: this rank's rows of each sequence (the SP shard with SP, else the CP rank's local
  // sequence); s_cp: the CP rank's local sequence (= the whole sequence without CP), which SP
  // shards into sp pieces; c: one CP chunk (local chunk 0 is global chunk cp_rank, local chunk 1
  // is global chunk 2·CP−1−cp_rank).
  const int64_t s_loc = sp > 1 ? config_.router.seq_length : jitter_local_seq_;
  const int64_t s_cp = s_loc * sp, c = cp > 1 ? s_cp / 2 : s_cp;
  const auto global_token = [&](int64_t row) -> int64_t {
    const int64_t b = row / s_loc, p = config_.sp_rank * s_loc + row % s_loc, q = p / c;
    const int64_t id = cp <= 1 ? q : kernels::CpChunkId(q, cp, jitter_cp_rank_);
    return b * s_cp * cp + id * c + p % c;
  };
  // Runs of rows whose global tokens are consecutive (element offset = token·H).
  for (int64_t row = 0; row < t;) {
    const int64_t first = global_token(row);
    int64_t n = 1;
    while (row + n < t && global_token(row + n) == first + n) ++n;
    SY_RETURN_IF_ERROR(fn(row, n, static_cast<uint64_t>(first * h)));
    row += n;
  }
  return absl::OkStatus();
}

absl::Status MoELayer::RoutedForward(const Stream& stream, const MoELayerParams& p,
                                     const MoERouterState& rs, const Tensor& x, const Tensor& y,
                                     uint64_t jitter_offset) {
  const kernels::RouterConfig& rc = config_.router;
  const int64_t t = tokens_;
  PhaseSequence phase(stream);
  phase.Next("router_gemm");
  Tensor xr = x;
  if (rc.training && rc.input_jitter_eps > 0) {
    xr = Rows(xr_, t);
    // Per run of contiguous global positions (SP shard, CP chunk), with the offsets of those rows
    // in the whole micro-batch: the same noise as one process draws for these tokens.
    SY_RETURN_IF_ERROR(ForEachJitterSpan(t, [&](int64_t row, int64_t rows, uint64_t offset) {
      return kernels::ApplyInputJitter(
          stream, RowRange(x, row, rows), static_cast<float>(rc.input_jitter_eps),
          /*seed=*/0x5157u, jitter_offset + offset, RowRange(xr, row, rows));
    }));
  }
  const Tensor logits = Rows(logits_, t);
  SY_RETURN_IF_ERROR(kernels::RouterGatingForward(stream, xr, p.router_weight, logits));
  phase.Next("route");
  kernels::RouterOutputs ro{Rows(topk_idx_, t), Rows(topk_probs_, t), Rows(selected_idx_, t),
                            tokens_per_expert_};
  SY_RETURN_IF_ERROR(kernels::RouterForward(stream, rc, logits, rs.expert_bias,
                                            rs.local_tokens_per_expert, ro, router_ws_));
  phase.Next("aux_loss");
  if (has_aux_ && rc.training) {
    kernels::AuxLossStats stats{aux_prob_sums_, aux_counts_, aux_lse_};
    const int64_t b = kernels::AuxLossNumSequences(rc, t);
    stats.prob_sums = Rows(aux_prob_sums_, b);
    stats.counts = Rows(aux_counts_, b);
    // The router's selection stands in for the losses' own top-k where they are the same
    // (kernels::AuxTopkIsRouterTopk; ignored otherwise).
    SY_RETURN_IF_ERROR(
        kernels::AuxLossStatsForward(stream, rc, logits, stats, aux_ws_, ro.selected_idx));
    kernels::AuxLossNorms norms;
    // global_aux_loss's gradient factor is the DATA-parallel size (aux_loss.h): the TP ranks
    // share one micro-batch (MoELayerConfig::sp_size) and the sum over the CP ranks of their
    // shares already is the whole sequence's.
    norms.dp_size = std::max(1, dp_size_ / (config_.sp_size * cp_size_));
    if (has_global_aux_) {
      // Running mean of the counts over the micro-batches of this global batch (spec §2.3),
      // each micro-batch's counts summed over TP x DP x CP first. The running counts are the
      // owner's (ShareGlobalAuxCounts: one for all pipeline slots of this decoder layer).
      Tensor& counts = global_owner_->global_counts_;
      if (tdc_ != nullptr) {
        SY_RETURN_IF_ERROR(kernels::FillBytes(global_step_counts_, 0));
        SY_RETURN_IF_ERROR(kernels::AddColumnSums(stream, stats.counts, global_step_counts_));
        SY_RETURN_IF_ERROR(
            tdc_->AllReduce(global_step_counts_, global_step_counts_, comm::ReduceOp::kSum));
        SY_RETURN_IF_ERROR(kernels::Axpby(stream, 1.0f, counts, 1.0f, global_step_counts_, counts));
      } else {
        SY_RETURN_IF_ERROR(kernels::AddColumnSums(stream, stats.counts, counts));
      }
      const int64_t steps = ++global_owner_->global_steps_;
      SY_RETURN_IF_ERROR(
          kernels::Axpby(stream, 1.0f / steps, counts, 0.0f, counts, global_mean_counts_));
      norms.global_counts = global_mean_counts_;
      // N = T · size(TP×DP×CP): the tokens the all-reduced counts were taken over (§2.3).
      norms.global_num_tokens = static_cast<double>(t) * dp_size_;
    }
    if (tp_ != nullptr) {
      // aux_loss and seq_aux_loss count over whole sequences: the TP shards' counts summed, with
      // the token counts of the whole sequences (spec §2.3). After global_aux_loss took the local
      // counts above (it sums them over TP×DP×CP itself).
      SY_RETURN_IF_ERROR(tp_->AllReduce(stats.counts, stats.counts, comm::ReduceOp::kSum));
      norms.aux_num_tokens = static_cast<double>(t * config_.sp_size);
      norms.seq_num_tokens = static_cast<double>(rc.seq_length * config_.sp_size);
    }
    if (cp_ != nullptr) {
      // Context parallelism (§2.3, group TP×CP): this rank's tokens are 2 of the 2·CP chunks of
      // each sequence. aux_loss and seq_aux_loss take the counts of the whole sequences, and N
      // of the whole sequences; Σ P stays local, so the sum of the CP ranks' losses (and of their
      // gradients, summed by the DP×CP gradient reduction) is the one-process loss. After the
      // global_aux_loss block: its counts are reduced over TP×DP×CP on their own. With TP too,
      // the two all-reduces sum over TP×CP (integer counts in f32: exact in any order) and N
      // multiplies by both sizes.
      SY_RETURN_IF_ERROR(cp_->AllReduce(stats.counts, stats.counts, comm::ReduceOp::kSum));
      norms.aux_num_tokens = static_cast<double>(t) * config_.sp_size * cp_size_;
      norms.seq_num_tokens = static_cast<double>(rc.seq_length) * config_.sp_size * cp_size_;
    }
    SY_RETURN_IF_ERROR(
        kernels::AuxLossForward(stream, rc, t, stats, norms, losses_, Rows(aux_grad_weights_, b)));
  }
  state_.x = x;
  state_.topk_idx = ro.topk_idx;
  state_.topk_probs = ro.topk_probs;
  // The dispatcher's six phases (DESIGN.md), each its own range.
  phase.Next("dispatch_preprocess");
  SY_RETURN_IF_ERROR(dispatcher_->DispatchPreprocess(stream, &state_));
  phase.Next("dispatch");
  SY_RETURN_IF_ERROR(dispatcher_->Dispatch(stream, &state_));
  phase.Next("dispatch_postprocess");
  SY_RETURN_IF_ERROR(dispatcher_->DispatchPostprocess(stream, &state_));
  // The alltoall dispatcher sizes its expert side by the counts (it may have grown in Dispatch).
  SY_RETURN_IF_ERROR(
      FitExpertRows(permute_fused_ ? state_.expert_rows.dim(0) : state_.expert_x.dim(0)));
  // Experts: h = X·W1, a = swiglu(h)·p, y = a·W2 (rows past the device counts are skipped).
  phase.Next("fc1");
  if (permute_fused_) {
    SY_RETURN_IF_ERROR(gemm_->FpropGathered(stream, state_.x, state_.expert_rows, p.fc1,
                                            state_.tokens_per_expert, h_));
  } else {
    SY_RETURN_IF_ERROR(gemm_->Fprop(stream, state_.expert_x, p.fc1, state_.tokens_per_expert, h_));
  }
  phase.Next("swiglu");
  const Tensor a = RoutedAct();
  SY_RETURN_IF_ERROR(
      kernels::SwigluForward(stream, h_, state_.expert_probs, state_.tokens_per_expert, a));
  phase.Next("fc2");
  SY_RETURN_IF_ERROR(gemm_->Fprop(stream, a, p.fc2, state_.tokens_per_expert, state_.expert_out));
  phase.Next("combine_preprocess");
  SY_RETURN_IF_ERROR(dispatcher_->CombinePreprocess(stream, &state_));
  phase.Next("combine");
  SY_RETURN_IF_ERROR(dispatcher_->Combine(stream, &state_));
  phase.Next("combine_postprocess");
  return dispatcher_->CombinePostprocess(stream, &state_, y);
}

absl::Status MoELayer::FitExpertRows(int64_t rows) {
  if (rows == expert_rows_) return absl::OkStatus();
  // h, a, da, dh have the dispatcher's expert-row capacity (the grouped GEMMs take equal row
  // counts). It only grows (AllToAllDispatcher, "Receive buffers"), between micro-batches, so a
  // backward always sees the rows of its own forward. Release first: never both at once.
  expert_rows_ = rows;
  const DType dt = config_.dtype;
  const int64_t f = config_.local_ffn_size();
  // moe_act recompute: a is in the shared scratch (RoutedAct), made large enough for these rows;
  // so are the backward's da and dh (MoEGradScratch), always.
  const bool keep_a = !config_.recompute_act;
  const std::vector<int64_t> widths = {2 * f, keep_a ? f : 0};
  Tensor* views[] = {&h_, &a_};
  expert_buffers_.clear();
  if (!keep_a) SY_RETURN_IF_ERROR(routed_act_->Reserve(rows * f * DTypeSize(dt)));
  SY_RETURN_IF_ERROR(da_->Reserve(rows * f * DTypeSize(dt)));
  SY_RETURN_IF_ERROR(dh_->Reserve(rows * 2 * f * DTypeSize(dt)));
  for (size_t i = 0; i < widths.size(); ++i) {
    SY_ASSIGN_OR_RETURN(kernels::Buffer b,
                        kernels::Buffer::ForTensor(dt, {rows, widths[i]}, device_));
    *views[i] = b.View();
    expert_buffers_.push_back(std::move(b));
  }
  return absl::OkStatus();
}

Tensor MoELayer::RoutedAct() const {
  if (!config_.recompute_act) return a_;
  return routed_act_->View(config_.dtype, {expert_rows_, config_.local_ffn_size()});
}

Tensor MoELayer::SharedAct() const {
  if (!config_.recompute_act) return sh_a_;
  return shared_act_->View(config_.dtype,
                           {max_tokens_ * config_.sp_size, config_.local_shared_ffn_size()});
}

absl::Status MoELayer::SharedForward(const Stream& s, const MoELayerParams& p, const Tensor& x) {
  const int64_t t = tokens_, ts = t * config_.sp_size;
  const bool tp = config_.sp_size > 1;
  const Tensor sh_h = Rows(sh_h_, ts), sh_a = Rows(SharedAct(), ts), sh_y = Rows(sh_y_, t);
  // TP (see MoELayerConfig::sp_size): column-parallel fc1 over the gathered tokens, row-parallel
  // fc2 whose partial sums are reduce-scattered back onto this rank's rows.
  const Tensor x_in = tp ? Rows(sh_xall_, ts) : x;
  if (tp) SY_RETURN_IF_ERROR(tp_->AllGather(x, x_in));
  SY_RETURN_IF_ERROR(kernels::Gemm(s, x_in, false, p.shared_fc1, false, sh_h));
  SY_RETURN_IF_ERROR(kernels::SwigluForward(s, sh_h, Tensor(), Tensor(), sh_a));
  if (tp) {
    const Tensor part = Rows(sh_part_, ts);
    SY_RETURN_IF_ERROR(kernels::Gemm(s, sh_a, false, p.shared_fc2, false, part));
    SY_RETURN_IF_ERROR(tp_->ReduceScatter(part, sh_y, comm::ReduceOp::kSum));
  } else {
    SY_RETURN_IF_ERROR(kernels::Gemm(s, sh_a, false, p.shared_fc2, false, sh_y));
  }
  if (config_.shared_expert_gate) {
    // sh_y keeps the ungated output (needed by the gate's backward); sh_gated is what is added.
    const Tensor g = Rows(sh_g_, t);
    SY_RETURN_IF_ERROR(kernels::Gemm(s, x, false, p.shared_gate, false, g));
    Tensor g1(g.dtype, {t}, g.device, g.data);
    SY_RETURN_IF_ERROR(kernels::SigmoidGateForward(s, sh_y, g1, Rows(sh_gated_, t)));
  }
  return absl::OkStatus();
}

absl::Status MoELayer::Backward(const Stream& stream, const MoELayerParams& p,
                                const MoELayerParams& g, const Tensor& dy, const Tensor& dx,
                                double aux_grad_scale, GradMode grad_mode) {
  const bool accumulate = grad_mode == GradMode::kAccumulate;
  const float grad_beta = accumulate ? 1.0f : 0.0f;
  const kernels::RouterConfig& rc = config_.router;
  const int64_t t = tokens_;
  SY_RETURN_IF_ERROR(CheckTensor(dy, "moe.dy", config_.dtype, {t, config_.hidden_size}));
  SY_RETURN_IF_ERROR(CheckTensor(dx, "moe.dx", config_.dtype, {t, config_.hidden_size}));
  ScopedRange range(stream, "moe.bwd");
  if (config_.shared_ffn_size > 0) {
    SY_RETURN_IF_ERROR(Fork(stream));
    SY_RETURN_IF_ERROR(SharedBackward(SideStream(stream), p, g, dy, grad_beta));
  }
  // Routed experts, in reverse.
  PhaseSequence phase(stream);
  phase.Next("combine");
  SY_RETURN_IF_ERROR(dispatcher_->CombineBackward(stream, dy, &state_));
  const Tensor& tpe = state_.tokens_per_expert;
  // The shared backward scratch (MoEGradScratch): nothing reserves it during a Backward, so the
  // views hold until it returns.
  const int64_t f = config_.local_ffn_size();
  const Tensor da = da_->View(config_.dtype, {expert_rows_, f});
  const Tensor dh = dh_->View(config_.dtype, {expert_rows_, 2 * f});
  phase.Next("fc2_dgrad");
  // The output gradient: d_expert_out, or (permute_fused_) dy itself through the row index.
  const Tensor& rows = state_.expert_rows;
  if (permute_fused_) {
    SY_RETURN_IF_ERROR(gemm_->DgradGathered(stream, dy, rows, p.fc2, tpe, da));
  } else {
    SY_RETURN_IF_ERROR(gemm_->Dgrad(stream, state_.d_expert_out, p.fc2, tpe, da));
  }
  const Tensor a = RoutedAct();
  if (config_.recompute_act) {
    // moe_act: a = swiglu(h)·p again, as the forward computed it, for fc2's weight gradient.
    phase.Next("act_recompute");
    SY_RETURN_IF_ERROR(kernels::SwigluForward(stream, h_, state_.expert_probs, tpe, a));
  }
  phase.Next("fc2_wgrad");
  if (permute_fused_) {
    SY_RETURN_IF_ERROR(gemm_->WgradGathered(stream, a, Tensor(), dy, rows, tpe, g.fc2, accumulate));
  } else {
    SY_RETURN_IF_ERROR(gemm_->Wgrad(stream, a, state_.d_expert_out, tpe, g.fc2, accumulate));
  }
  phase.Next("swiglu");
  SY_RETURN_IF_ERROR(
      kernels::SwigluBackward(stream, da, h_, state_.expert_probs, tpe, dh, state_.d_expert_probs));
  phase.Next("fc1_dgrad");
  SY_RETURN_IF_ERROR(gemm_->Dgrad(stream, dh, p.fc1, tpe, state_.d_expert_x));
  phase.Next("fc1_wgrad");
  if (wgrad_) {
    // delay_wgrad_compute: fc1's wgrad on the wgrad stream, after fc1's dgrad. Its inputs are
    // not written again until it is joined: expert_x (the layer's own) before the next forward
    // of this layer (with permute_fused_, x: the caller's, kept until this Backward returns), dh
    // (shared by every MoE layer, MoEGradScratch) before the next Backward of any of them, which
    // the join at the end of this Backward ("wgrad_join") orders after it.
    SY_RETURN_IF_ERROR(wgrad_->Fork(stream));
    SY_RETURN_IF_ERROR(Fc1Wgrad(wgrad_->view(), dh, g, accumulate));
    SY_RETURN_IF_ERROR(wgrad_->RecordJoin());
  } else {
    SY_RETURN_IF_ERROR(Fc1Wgrad(stream, dh, g, accumulate));
  }
  const Tensor dtopk = Rows(dtopk_probs_, t);
  phase.Next("dispatch");
  SY_RETURN_IF_ERROR(dispatcher_->DispatchBackward(stream, &state_, dx, dtopk));
  // Router.
  phase.Next("route_aux");
  const Tensor logits = Rows(logits_, t), dlogits = Rows(dlogits_, t);
  SY_RETURN_IF_ERROR(kernels::RouterBackward(stream, rc, logits, Rows(selected_idx_, t),
                                             Rows(topk_idx_, t), dtopk, dlogits));
  if (has_aux_ && rc.training) {
    const int64_t b = kernels::AuxLossNumSequences(rc, t);
    SY_RETURN_IF_ERROR(kernels::AuxLossBackward(stream, rc, logits, Rows(aux_grad_weights_, b),
                                                aux_grad_scale, dlogits));
  }
  phase.Next("router_gemm");
  const bool jitter = rc.training && rc.input_jitter_eps > 0;
  const Tensor xr = jitter ? Rows(xr_, t) : x_saved_;
  const Tensor lowp = dlogits_lowp_.numel() > 0 ? Rows(dlogits_lowp_, t) : Tensor();
  if (!jitter) {
    // dx += dlogits·W_r inside the GEMM (beta 1): one rounding of the sum, no temporary.
    SY_RETURN_IF_ERROR(kernels::RouterGatingBackward(stream, dlogits, xr, p.router_weight, lowp, dx,
                                                     g.router_weight, grad_beta,
                                                     /*dx_beta=*/1.0f));
  } else {
    // The jitter multiplies the router's input gradient (not the experts'): a temporary first.
    const Tensor dx_router = Rows(dx_tmp_, t);
    SY_RETURN_IF_ERROR(kernels::RouterGatingBackward(stream, dlogits, xr, p.router_weight, lowp,
                                                     dx_router, g.router_weight, grad_beta));
    SY_RETURN_IF_ERROR(ForEachJitterSpan(t, [&](int64_t row, int64_t rows, uint64_t offset) {
      return kernels::InputJitterBackward(stream, RowRange(dx_router, row, rows),
                                          static_cast<float>(rc.input_jitter_eps), 0x5157u,
                                          jitter_offset_ + offset, RowRange(dx_router, row, rows));
    }));
    SY_RETURN_IF_ERROR(kernels::Axpby(stream, 1.0f, dx, 1.0f, dx_router, dx));
  }
  phase.Close();
  if (wgrad_) {
    // Before returning, also for the shared dh: the stream's next writer of dh is another
    // layer's Backward (MoEGradScratch).
    ScopedRange join(stream, "wgrad_join");
    SY_RETURN_IF_ERROR(wgrad_->WaitJoin(stream));
  }
  if (config_.shared_ffn_size > 0) {
    ScopedRange join(stream, "shared_join_add");
    SY_RETURN_IF_ERROR(Join(stream));
    SY_RETURN_IF_ERROR(kernels::Axpby(stream, 1.0f, dx, 1.0f, Rows(sh_dx_, t), dx));
  }
  return absl::OkStatus();
}

absl::Status MoELayer::Fc1Wgrad(const Stream& stream, const Tensor& dh, const MoELayerParams& g,
                                bool accumulate) {
  const Tensor& tpe = state_.tokens_per_expert;
  if (permute_fused_) {
    // x itself (the caller keeps it until this Backward returns), through the row index.
    return gemm_->WgradGathered(stream, state_.x, state_.expert_rows, dh, Tensor(), tpe, g.fc1,
                                accumulate);
  }
  return gemm_->Wgrad(stream, state_.expert_x, dh, tpe, g.fc1, accumulate);
}

absl::Status MoELayer::SharedBackward(const Stream& s, const MoELayerParams& p,
                                      const MoELayerParams& g, const Tensor& dy, float grad_beta) {
  const int64_t t = tokens_, ts = t * config_.sp_size;
  const bool tp = config_.sp_size > 1;
  const Tensor& x = x_saved_;
  Tensor dys = dy;
  Tensor dg_gate;  // TP: the gate's dg, whose dx GEMM is added after the reduce-scatter
  if (config_.shared_expert_gate) {
    const Tensor gl = Rows(sh_g_, t);
    Tensor g1(gl.dtype, {t}, gl.device, gl.data);
    const Tensor dg = Rows(sh_dg_, t);
    dys = Rows(sh_dy_, t);
    SY_RETURN_IF_ERROR(kernels::SigmoidGateBackward(s, dy, Rows(sh_y_, t), g1, dys, dg));
    // d(x·w_g): both GEMMs in the layer dtype (dg rounded once, as the router's dlogits).
    const Tensor dg_lowp = Rows(sh_dg_lowp_, t);
    SY_RETURN_IF_ERROR(kernels::Cast(s, dg, dg_lowp));
    SY_RETURN_IF_ERROR(kernels::Gemm(s, x, true, dg_lowp, false, g.shared_gate, 1.0f, grad_beta));
    if (tp) {
      dg_gate = dg_lowp;
    } else {
      SY_RETURN_IF_ERROR(
          kernels::Gemm(s, dg_lowp, false, p.shared_gate, true, Rows(sh_dx_, t), 1.0f, 0.0f));
    }
  }
  const Tensor sh_h = Rows(sh_h_, ts), sh_a = Rows(SharedAct(), ts), sh_da = Rows(sh_da_, ts);
  const Tensor sh_dh = Rows(sh_dh_, ts), sh_dx = Rows(sh_dx_, t);
  if (config_.recompute_act) {
    // moe_act: the shared expert's SwiGLU output again, for fc2's weight gradient below.
    SY_RETURN_IF_ERROR(kernels::SwigluForward(s, sh_h, Tensor(), Tensor(), sh_a));
  }
  if (tp) {
    // The reduce-scatter's backward: all-gather dy; fc2 and fc1 over the gathered rows; the
    // partial dx reduce-scattered (the all-gather's backward), then the gate's dx added.
    const Tensor part = Rows(sh_part_, ts), x_all = Rows(sh_xall_, ts);
    SY_RETURN_IF_ERROR(tp_->AllGather(dys, part));
    SY_RETURN_IF_ERROR(kernels::Gemm(s, part, false, p.shared_fc2, true, sh_da));
    SY_RETURN_IF_ERROR(kernels::Gemm(s, sh_a, true, part, false, g.shared_fc2, 1.0f, grad_beta));
    SY_RETURN_IF_ERROR(
        kernels::SwigluBackward(s, sh_da, sh_h, Tensor(), Tensor(), sh_dh, Tensor()));
    SY_RETURN_IF_ERROR(kernels::Gemm(s, x_all, true, sh_dh, false, g.shared_fc1, 1.0f, grad_beta));
    SY_RETURN_IF_ERROR(kernels::Gemm(s, sh_dh, false, p.shared_fc1, true, part));
    SY_RETURN_IF_ERROR(tp_->ReduceScatter(part, sh_dx, comm::ReduceOp::kSum));
    if (dg_gate.data != nullptr) {
      SY_RETURN_IF_ERROR(kernels::Gemm(s, dg_gate, false, p.shared_gate, true, sh_dx, 1.0f, 1.0f));
    }
    return absl::OkStatus();
  }
  SY_RETURN_IF_ERROR(kernels::Gemm(s, dys, false, p.shared_fc2, true, sh_da));
  SY_RETURN_IF_ERROR(kernels::Gemm(s, sh_a, true, dys, false, g.shared_fc2, 1.0f, grad_beta));
  SY_RETURN_IF_ERROR(kernels::SwigluBackward(s, sh_da, sh_h, Tensor(), Tensor(), sh_dh, Tensor()));
  SY_RETURN_IF_ERROR(kernels::Gemm(s, sh_dh, false, p.shared_fc1, true, sh_dx, 1.0f,
                                   config_.shared_expert_gate ? 1.0f : 0.0f));
  SY_RETURN_IF_ERROR(kernels::Gemm(s, x, true, sh_dh, false, g.shared_fc1, 1.0f, grad_beta));
  return absl::OkStatus();
}

Tensor MoELayer::dtopk_probs() const { return Rows(dtopk_probs_, tokens_); }

absl::Status MoELayer::ResetGlobalBatch() {
  global_steps_ = 0;
  return kernels::FillBytes(global_counts_, 0);
}

}  // namespace switchyard::model
