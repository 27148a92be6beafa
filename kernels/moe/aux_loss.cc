// Aux losses: planning, tensor checks and CPU/CUDA dispatch (aux_loss.h).
#include "kernels/moe/aux_loss.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/moe/router_internal.h"

namespace switchyard::kernels {
namespace {

bool HasAux(const RouterConfig& c, AuxLossType type) {
  for (const AuxLossTerm& t : c.aux_losses) {
    if (t.type == type) return true;
  }
  return false;
}

absl::Status CheckLogits(const Stream& stream, const RouterConfig& config, const Tensor& logits) {
  if (!(logits.dtype == DType::kF32 || (logits.dtype == DType::kF64 && !stream.is_cuda()))) {
    return absl::InvalidArgumentError(absl::StrCat("aux_loss.logits: dtype must be f32",
                                                   stream.is_cuda() ? "" : " or f64", ", got ",
                                                   logits.DebugString()));
  }
  SY_RETURN_IF_ERROR(
      CheckTensor(logits, "aux_loss.logits", logits.dtype, {-1, config.num_experts}));
  return CheckDevice(stream, {&logits});
}

// T is compatible with the sequence split of seq_aux_loss and the CUDA size limit.
absl::Status CheckTokens(const Stream& stream, const RouterConfig& config, int64_t t) {
  if (HasAux(config, AuxLossType::kSeqAuxLoss) && t % config.seq_length != 0) {
    return absl::InvalidArgumentError(absl::StrCat("aux_loss: num_tokens (", t,
                                                   ") must be a multiple of router.seq_length (",
                                                   config.seq_length, ") for seq_aux_loss"));
  }
  if (stream.is_cuda() && t > (int64_t{1} << 26)) {
    return absl::InvalidArgumentError(
        absl::StrCat("aux_loss (CUDA): num_tokens (", t, ") must be <= 2^26"));
  }
  return absl::OkStatus();
}

absl::Status CheckStats(const Stream& stream, const RouterConfig& config, const AuxLossStats& stats,
                        int64_t b) {
  const int64_t e = config.num_experts;
  SY_RETURN_IF_ERROR(CheckTensor(stats.prob_sums, "aux_loss.stats.prob_sums", DType::kF64, {b, e}));
  SY_RETURN_IF_ERROR(CheckTensor(stats.counts, "aux_loss.stats.counts", DType::kF32, {b, e}));
  SY_RETURN_IF_ERROR(CheckTensor(stats.lse_sq_sum, "aux_loss.stats.lse_sq_sum", DType::kF64, {1}));
  return CheckDevice(stream, {&stats.prob_sums, &stats.counts, &stats.lse_sq_sum});
}

}  // namespace

bool AuxTopkIsRouterTopk(const RouterConfig& config) {
  return config.score_function == RouterScoreFunction::kSoftmax && !config.pre_softmax &&
         config.num_groups == 0 && !config.sinkhorn && !config.use_expert_bias;
}

int64_t AuxLossNumSequences(const RouterConfig& config, int64_t num_tokens) {
  if (!HasAux(config, AuxLossType::kSeqAuxLoss) || config.seq_length <= 0) return 1;
  return std::max<int64_t>(1, num_tokens / config.seq_length);
}

namespace internal {

AuxPlan MakeAuxPlan(const RouterConfig& config, int64_t num_tokens) {
  AuxPlan p;
  p.num_tokens = num_tokens;
  p.num_experts = config.num_experts;
  p.topk = config.topk;
  p.sigmoid = config.score_function == RouterScoreFunction::kSigmoid;
  p.num_sequences = AuxLossNumSequences(config, num_tokens);
  p.tokens_per_sequence = num_tokens / p.num_sequences;
  p.chunks_per_sequence =
      (p.tokens_per_sequence + router_math::kAuxChunk - 1) / router_math::kAuxChunk;
  p.num_chunks = p.num_sequences * p.chunks_per_sequence;
  return p;
}

}  // namespace internal

int64_t AuxLossWorkspaceBytes(const RouterConfig& config, int64_t num_tokens) {
  const internal::AuxPlan p = internal::MakeAuxPlan(config, num_tokens);
  const int64_t psum = (8 * p.num_chunks * p.num_experts + 255) / 256 * 256;
  return psum + (8 * p.num_chunks + 255) / 256 * 256;
}

namespace {

// The checks AuxLossStatsForward and AuxLossBackward start with (the config, logits [T, E], T),
// then their plan.
absl::StatusOr<internal::AuxPlan> PlanForLogits(const Stream& stream, const RouterConfig& config,
                                                const Tensor& logits) {
  SY_RETURN_IF_ERROR(config.Validate());
  SY_RETURN_IF_ERROR(CheckLogits(stream, config, logits));
  SY_RETURN_IF_ERROR(CheckTokens(stream, config, logits.dim(0)));
  return internal::MakeAuxPlan(config, logits.dim(0));
}

}  // namespace

absl::Status AuxLossStatsForward(const Stream& stream, const RouterConfig& config,
                                 const Tensor& logits, const AuxLossStats& stats,
                                 const Tensor& workspace, const Tensor& selected_idx) {
  SY_ASSIGN_OR_RETURN(const internal::AuxPlan plan, PlanForLogits(stream, config, logits));
  const int64_t t = plan.num_tokens;
  SY_RETURN_IF_ERROR(CheckStats(stream, config, stats, plan.num_sequences));
  Tensor selected;  // empty: the losses' own top-k
  if (selected_idx.data != nullptr && AuxTopkIsRouterTopk(config)) {
    SY_RETURN_IF_ERROR(
        CheckTensor(selected_idx, "aux_loss.selected_idx", DType::kI32, {t, config.topk}));
    SY_RETURN_IF_ERROR(CheckDevice(stream, {&selected_idx}));
    selected = selected_idx;
  }
  if (!stream.is_cuda()) return internal::AuxLossStatsCpu(plan, logits, selected, stats);
  const int64_t bytes = AuxLossWorkspaceBytes(config, t);
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&workspace}));
  if (workspace.data == nullptr || static_cast<int64_t>(workspace.bytes()) < bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("aux_loss.workspace: needs ", bytes, " bytes, got ", workspace.DebugString()));
  }
  return internal::AuxLossStatsCuda(stream, plan, logits, selected, stats, workspace);
}

absl::Status AuxLossForward(const Stream& stream, const RouterConfig& config, int64_t num_tokens,
                            const AuxLossStats& stats, const AuxLossNorms& norms,
                            const Tensor& losses, const Tensor& grad_weights) {
  SY_RETURN_IF_ERROR(config.Validate());
  SY_RETURN_IF_ERROR(CheckTokens(stream, config, num_tokens));
  if (num_tokens < 1) return absl::InvalidArgumentError("aux_loss: num_tokens must be >= 1");
  const internal::AuxPlan plan = internal::MakeAuxPlan(config, num_tokens);
  SY_RETURN_IF_ERROR(CheckStats(stream, config, stats, plan.num_sequences));
  const DType real = losses.dtype;
  if (!(real == DType::kF32 || (real == DType::kF64 && !stream.is_cuda()))) {
    return absl::InvalidArgumentError(absl::StrCat("aux_loss.losses: dtype must be f32",
                                                   stream.is_cuda() ? "" : " or f64", ", got ",
                                                   losses.DebugString()));
  }
  const int64_t n = static_cast<int64_t>(config.aux_losses.size());
  SY_RETURN_IF_ERROR(CheckTensor(losses, "aux_loss.losses", real, {n + 1}));
  SY_RETURN_IF_ERROR(CheckTensor(grad_weights, "aux_loss.grad_weights", real,
                                 {plan.num_sequences, config.num_experts}));
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&losses, &grad_weights}));
  if (HasAux(config, AuxLossType::kGlobalAuxLoss)) {
    SY_RETURN_IF_ERROR(CheckTensor(norms.global_counts, "aux_loss.norms.global_counts", DType::kF32,
                                   {config.num_experts}));
    SY_RETURN_IF_ERROR(CheckDevice(stream, {&norms.global_counts}));
    if (!(norms.global_num_tokens > 0) || norms.dp_size < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("aux_loss.norms: global_aux_loss needs global_num_tokens (",
                       norms.global_num_tokens, ") > 0 and dp_size (", norms.dp_size, ") >= 1"));
    }
  }
  if (!std::isfinite(norms.aux_num_tokens) || !std::isfinite(norms.seq_num_tokens)) {
    return absl::InvalidArgumentError("aux_loss.norms: token counts must be finite");
  }
  if (!stream.is_cuda()) {
    return internal::AuxLossForwardCpu(config, plan, stats, norms, losses, grad_weights);
  }
  return internal::AuxLossForwardCuda(stream, config, plan, stats, norms, losses, grad_weights);
}

absl::Status AuxLossBackward(const Stream& stream, const RouterConfig& config, const Tensor& logits,
                             const Tensor& grad_weights, double aux_grad_scale,
                             const Tensor& dlogits) {
  SY_ASSIGN_OR_RETURN(const internal::AuxPlan plan, PlanForLogits(stream, config, logits));
  const int64_t t = plan.num_tokens;
  SY_RETURN_IF_ERROR(CheckTensor(grad_weights, "aux_loss.grad_weights", logits.dtype,
                                 {plan.num_sequences, config.num_experts}));
  SY_RETURN_IF_ERROR(
      CheckTensor(dlogits, "aux_loss.dlogits", logits.dtype, {t, config.num_experts}));
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&grad_weights, &dlogits}));
  if (!std::isfinite(aux_grad_scale)) {
    return absl::InvalidArgumentError("aux_loss: aux_grad_scale must be finite");
  }
  if (!stream.is_cuda()) {
    return internal::AuxLossBackwardCpu(config, plan, logits, grad_weights, aux_grad_scale,
                                        dlogits);
  }
  return internal::AuxLossBackwardCuda(stream, config, plan, logits, grad_weights, aux_grad_scale,
                                       dlogits);
}

}  // namespace switchyard::kernels
