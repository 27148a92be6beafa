// Router: config validation, planning, tensor checks and CPU/CUDA dispatch (router.h).
#include "kernels/moe/router.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/gemm/gemm.h"
#include "kernels/moe/router_internal.h"

namespace switchyard::kernels {
namespace {

absl::Status Rule(bool ok, const std::string& message) {
  return ok ? absl::OkStatus() : absl::InvalidArgumentError(message);
}

bool HasAux(const RouterConfig& c, AuxLossType type) {
  for (const AuxLossTerm& t : c.aux_losses) {
    if (t.type == type) return true;
  }
  return false;
}

// The dtype of the router math's inputs/outputs: f32 everywhere, f64 on the CPU only.
absl::Status CheckRealDtype(const Stream& stream, const Tensor& t, absl::string_view what) {
  if (t.dtype == DType::kF32 || (t.dtype == DType::kF64 && !stream.is_cuda())) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": dtype must be f32", stream.is_cuda() ? "" : " or f64", ", got ", t.DebugString()));
}

constexpr int64_t kMaxTokensCuda = int64_t{1} << 26;  // T·k and T·E stay far from 2^31

absl::Status CheckCudaTokens(const Stream& stream, int64_t num_tokens) {
  return Rule(
      !stream.is_cuda() || num_tokens <= kMaxTokensCuda,
      absl::StrCat("router (CUDA): num_tokens (", num_tokens, ") must be <= ", kMaxTokensCuda));
}

absl::Status CheckWorkspace(const Stream& stream, const Tensor& workspace, int64_t bytes,
                            absl::string_view what) {
  if (!stream.is_cuda() || bytes == 0) return absl::OkStatus();
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&workspace}));
  return Rule(
      workspace.data != nullptr && static_cast<int64_t>(workspace.bytes()) >= bytes,
      absl::StrCat(what, ".workspace: needs ", bytes, " bytes, got ", workspace.DebugString()));
}

}  // namespace

absl::Status RouterConfig::Validate() const {
  const RouterConfig& c = *this;
  SY_RETURN_IF_ERROR(Rule(c.num_experts >= 1 && c.num_experts <= kRouterMaxExperts,
                          absl::StrCat("router.num_experts (", c.num_experts, ") must be in [1, ",
                                       kRouterMaxExperts, "]")));
  SY_RETURN_IF_ERROR(Rule(c.topk >= 1 && c.topk <= std::min(c.num_experts, kRouterMaxTopk),
                          absl::StrCat("router.topk (", c.topk, ") must be in [1, min(num_experts ",
                                       c.num_experts, ", ", kRouterMaxTopk, ")]")));
  const bool softmax = c.score_function == RouterScoreFunction::kSoftmax;
  SY_RETURN_IF_ERROR(Rule(!(c.topk == 1 && softmax && !c.pre_softmax && !c.sinkhorn),
                          "router.topk == 1 with post-top-k softmax gives a zero gradient; use "
                          "router.pre_softmax, the sigmoid score function or sinkhorn"));
  SY_RETURN_IF_ERROR(
      Rule(!c.pre_softmax || softmax, "router.pre_softmax requires router.score_function softmax"));
  SY_RETURN_IF_ERROR(
      Rule(c.num_groups >= 0 && c.group_topk >= 0 && (c.num_groups > 0) == (c.group_topk > 0),
           absl::StrCat("router.num_groups (", c.num_groups,
                        ") and "
                        "router.group_topk (",
                        c.group_topk, ") must both be > 0 (group-limited) or both 0")));
  if (c.num_groups > 0) {
    SY_RETURN_IF_ERROR(
        Rule(c.num_experts % c.num_groups == 0,
             absl::StrCat("router.num_experts (", c.num_experts,
                          ") must be divisible by router.num_groups (", c.num_groups, ")")));
    SY_RETURN_IF_ERROR(Rule(c.group_topk <= c.num_groups,
                            absl::StrCat("router.group_topk (", c.group_topk,
                                         ") must be <= router.num_groups (", c.num_groups, ")")));
    SY_RETURN_IF_ERROR(
        Rule(c.group_topk <= c.topk,
             absl::StrCat("router.group_topk (", c.group_topk, ") must be <= router.topk (", c.topk,
                          "): groups are scored by their top-(topk/group_topk)")));
    SY_RETURN_IF_ERROR(Rule(int64_t{c.group_topk} * (c.num_experts / c.num_groups) >= c.topk,
                            absl::StrCat("router.group_topk (", c.group_topk, ") groups of ",
                                         c.num_experts / c.num_groups,
                                         " experts must hold router.topk (", c.topk, ") experts")));
  }
  SY_RETURN_IF_ERROR(Rule(std::isfinite(c.topk_scaling_factor) && c.topk_scaling_factor > 0,
                          absl::StrCat("router.topk_scaling_factor (", c.topk_scaling_factor,
                                       ") must be finite and > 0")));
  SY_RETURN_IF_ERROR(Rule(!c.use_expert_bias || !softmax,
                          "router.use_expert_bias requires router.score_function sigmoid"));
  if (c.sinkhorn) {
    SY_RETURN_IF_ERROR(
        Rule(c.aux_losses.empty(), "router.aux_losses must be empty with sinkhorn load balancing"));
    SY_RETURN_IF_ERROR(Rule(softmax && !c.pre_softmax && c.num_groups == 0 && !c.use_expert_bias &&
                                c.topk_scaling_factor == 1.0,
                            "sinkhorn chooses its own activation (sigmoid for topk 1, else "
                            "softmax): router.score_function must be softmax and pre_softmax, "
                            "num_groups, use_expert_bias, topk_scaling_factor must be unset"));
    SY_RETURN_IF_ERROR(Rule(!(c.capacity_factor > 0),
                            "router.capacity_factor requires aux-loss or no load balancing, "
                            "not sinkhorn"));
  }
  SY_RETURN_IF_ERROR(Rule(std::isfinite(c.capacity_factor),
                          absl::StrCat("router.capacity_factor (", c.capacity_factor,
                                       ") must be finite (<= 0: dropless)")));
  SY_RETURN_IF_ERROR(
      Rule(c.input_jitter_eps >= 0 && c.input_jitter_eps < 1,
           absl::StrCat("router.input_jitter_eps (", c.input_jitter_eps, ") must be in [0, 1)")));
  SY_RETURN_IF_ERROR(
      Rule(std::isfinite(c.z_loss_coeff) && c.z_loss_coeff >= 0,
           absl::StrCat("router.z_loss_coeff (", c.z_loss_coeff, ") must be finite and >= 0")));
  for (size_t i = 0; i < c.aux_losses.size(); ++i) {
    const AuxLossTerm& t = c.aux_losses[i];
    SY_RETURN_IF_ERROR(Rule(
        std::isfinite(t.coeff) && t.coeff >= 0,
        absl::StrCat("router.aux_losses[", i, "].coeff (", t.coeff, ") must be finite and >= 0")));
    for (size_t j = 0; j < i; ++j) {
      SY_RETURN_IF_ERROR(Rule(c.aux_losses[j].type != t.type, absl::StrCat("router.aux_losses[", i,
                                                                           "] repeats the type of "
                                                                           "router.aux_losses[",
                                                                           j, "]")));
    }
  }
  SY_RETURN_IF_ERROR(
      Rule(c.seq_length >= 0, absl::StrCat("router.seq_length (", c.seq_length, ") must be >= 0")));
  SY_RETURN_IF_ERROR(Rule(!HasAux(c, AuxLossType::kSeqAuxLoss) || c.seq_length > 0,
                          "router.seq_length must be > 0 with a seq_aux_loss term"));
  return absl::OkStatus();
}

int64_t ExpertCapacity(const RouterConfig& config, int64_t num_tokens) {
  if (!(config.capacity_factor > 0) || config.num_experts <= 0) return -1;
  const double c = std::ceil(static_cast<double>(num_tokens * config.topk) / config.num_experts *
                             config.capacity_factor);
  return c >= static_cast<double>(num_tokens) ? -1 : static_cast<int64_t>(c);
}

namespace internal {

RoutingPlan MakeRoutingPlan(const RouterConfig& c, int64_t num_tokens) {
  RoutingPlan p;
  p.num_tokens = num_tokens;
  p.num_experts = c.num_experts;
  p.topk = c.topk;
  p.scale = c.topk_scaling_factor;
  if (c.sinkhorn) {
    p.key = c.training ? KeyKind::kSinkhorn : KeyKind::kLogit;
    p.prob = c.topk == 1 ? ProbKind::kSigmoid : ProbKind::kFullSoftmax;
    p.scale = 1.0;
  } else if (c.score_function == RouterScoreFunction::kSigmoid) {
    p.key = KeyKind::kSigmoid;
    p.prob = c.topk > 1 ? ProbKind::kSigmoidNormalized : ProbKind::kSigmoid;
    p.use_bias = c.use_expert_bias;
  } else if (c.pre_softmax) {
    p.key = KeyKind::kSoftmax;
    p.prob = ProbKind::kFullSoftmax;
  } else {
    p.key = KeyKind::kLogit;
    p.prob = ProbKind::kTopkSoftmax;
  }
  p.num_groups = c.num_groups;
  p.group_topk = c.group_topk;
  p.capacity = ExpertCapacity(c, num_tokens);
  p.position_policy = c.drop_policy == CapacityDropPolicy::kPosition;
  p.seq_length = c.seq_length;
  p.num_sequences =
      c.seq_length > 0 ? std::max<int64_t>(1, (num_tokens + c.seq_length - 1) / c.seq_length) : 1;
  p.count_for_bias = c.use_expert_bias && c.training;
  return p;
}

RouterWorkspaceLayout MakeRouterWorkspaceLayout(const RoutingPlan& p) {
  RouterWorkspaceLayout l;
  int64_t at = 0;
  auto take = [&at](int64_t bytes) {
    const int64_t start = at;
    at += (bytes + 255) / 256 * 256;
    return start;
  };
  const int64_t e = p.num_experts, t = p.num_tokens;
  l.counts = take(4 * e);
  l.offsets = take(4 * e);
  l.cursor = take(4 * e);
  if (p.capacity >= 0) {
    l.bucket = take(4 * t * p.topk);
    l.bucket_key = take(4 * t * p.topk);
  }
  if (p.key == KeyKind::kSinkhorn) {
    const int64_t chunks = (t + router_math::kSinkhornChunk - 1) / router_math::kSinkhornChunk;
    l.d0 = take(8 * t);
    l.d1 = take(8 * e);
    l.d1_next = take(8 * e);
    l.diff = take(8 * e);
    l.partial = take(8 * chunks * e);
    l.flag = take(8);
  }
  l.total = at;
  return l;
}

}  // namespace internal

int64_t RouterWorkspaceBytes(const RouterConfig& config, int64_t num_tokens) {
  return internal::MakeRouterWorkspaceLayout(internal::MakeRoutingPlan(config, num_tokens)).total;
}

namespace {

// The checks RouterForward and RouterBackward start with: the config, then logits [T, E] of a
// real dtype with T within the CUDA limit. Returns T.
absl::StatusOr<int64_t> CheckConfigAndLogits(const Stream& stream, const RouterConfig& config,
                                             const Tensor& logits) {
  SY_RETURN_IF_ERROR(config.Validate());
  SY_RETURN_IF_ERROR(CheckRealDtype(stream, logits, "router.logits"));
  SY_RETURN_IF_ERROR(CheckTensor(logits, "router.logits", logits.dtype, {-1, config.num_experts}));
  const int64_t t = logits.dim(0);
  SY_RETURN_IF_ERROR(CheckCudaTokens(stream, t));
  return t;
}

}  // namespace

absl::Status RouterForward(const Stream& stream, const RouterConfig& config, const Tensor& logits,
                           const Tensor& expert_bias, const Tensor& local_tokens_per_expert,
                           const RouterOutputs& out, const Tensor& workspace) {
  SY_ASSIGN_OR_RETURN(const int64_t t, CheckConfigAndLogits(stream, config, logits));
  const int64_t e = config.num_experts, k = config.topk;
  SY_RETURN_IF_ERROR(CheckTensor(out.topk_idx, "router.topk_idx", DType::kI32, {t, k}));
  SY_RETURN_IF_ERROR(CheckTensor(out.topk_probs, "router.topk_probs", logits.dtype, {t, k}));
  SY_RETURN_IF_ERROR(CheckTensor(out.selected_idx, "router.selected_idx", DType::kI32, {t, k}));
  SY_RETURN_IF_ERROR(
      CheckTensor(out.tokens_per_expert, "router.tokens_per_expert", DType::kI32, {e}));
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&logits, &out.topk_idx, &out.topk_probs,
                                          &out.selected_idx, &out.tokens_per_expert}));
  if (config.use_expert_bias) {
    SY_RETURN_IF_ERROR(CheckTensor(expert_bias, "router.expert_bias", DType::kF32, {e}));
    SY_RETURN_IF_ERROR(CheckDevice(stream, {&expert_bias}));
    if (config.training) {
      SY_RETURN_IF_ERROR(
          CheckTensor(local_tokens_per_expert, "router.local_tokens_per_expert", DType::kF32, {e}));
      SY_RETURN_IF_ERROR(CheckDevice(stream, {&local_tokens_per_expert}));
    }
  }
  const internal::RoutingPlan plan = internal::MakeRoutingPlan(config, t);
  if (!stream.is_cuda()) {
    return internal::RouterForwardCpu(plan, logits, expert_bias, local_tokens_per_expert, out);
  }
  SY_RETURN_IF_ERROR(
      CheckWorkspace(stream, workspace, internal::MakeRouterWorkspaceLayout(plan).total, "router"));
  return internal::RouterForwardCuda(stream, plan, logits, expert_bias, local_tokens_per_expert,
                                     out, workspace);
}

absl::Status RouterBackward(const Stream& stream, const RouterConfig& config, const Tensor& logits,
                            const Tensor& selected_idx, const Tensor& topk_idx,
                            const Tensor& dtopk_probs, const Tensor& dlogits) {
  SY_ASSIGN_OR_RETURN(const int64_t t, CheckConfigAndLogits(stream, config, logits));
  const int64_t e = config.num_experts, k = config.topk;
  SY_RETURN_IF_ERROR(CheckTensor(selected_idx, "router.selected_idx", DType::kI32, {t, k}));
  SY_RETURN_IF_ERROR(CheckTensor(topk_idx, "router.topk_idx", DType::kI32, {t, k}));
  SY_RETURN_IF_ERROR(CheckTensor(dtopk_probs, "router.dtopk_probs", logits.dtype, {t, k}));
  SY_RETURN_IF_ERROR(CheckTensor(dlogits, "router.dlogits", logits.dtype, {t, e}));
  SY_RETURN_IF_ERROR(
      CheckDevice(stream, {&logits, &selected_idx, &topk_idx, &dtopk_probs, &dlogits}));
  const internal::RoutingPlan plan = internal::MakeRoutingPlan(config, t);
  if (!stream.is_cuda()) {
    return internal::RouterBackwardCpu(plan, logits, selected_idx, topk_idx, dtopk_probs, dlogits);
  }
  return internal::RouterBackwardCuda(stream, plan, logits, selected_idx, topk_idx, dtopk_probs,
                                      dlogits);
}

absl::Status UpdateExpertBias(const Stream& stream, const Tensor& counts, const Tensor& bias,
                              float rate) {
  SY_RETURN_IF_ERROR(CheckTensor(bias, "expert_bias", DType::kF32, {-1}));
  const int64_t e = bias.dim(0);
  SY_RETURN_IF_ERROR(
      Rule(e >= 1 && e <= kRouterMaxExperts,
           absl::StrCat("expert_bias: size (", e, ") must be in [1, ", kRouterMaxExperts, "]")));
  SY_RETURN_IF_ERROR(CheckTensor(counts, "tokens_per_expert counts", DType::kF32, {e}));
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&counts, &bias}));
  SY_RETURN_IF_ERROR(Rule(std::isfinite(rate), "expert bias update rate must be finite"));
  if (!stream.is_cuda()) return internal::UpdateExpertBiasCpu(counts, bias, rate);
  return internal::UpdateExpertBiasCuda(stream, counts, bias, rate);
}

namespace {

absl::Status JitterScale(const Stream& stream, const Tensor& in, float eps, uint64_t seed,
                         uint64_t offset, const Tensor& out, absl::string_view what) {
  SY_RETURN_IF_ERROR(
      Rule(in.dtype == DType::kF32 || in.dtype == DType::kBF16 ||
               (in.dtype == DType::kF64 && !stream.is_cuda()),
           absl::StrCat(what, ": dtype must be f32 or bf16 (or f64 on the CPU), got ",
                        in.DebugString())));
  SY_RETURN_IF_ERROR(
      Rule(in.rank() == 2, absl::StrCat(what, ": must be [T, H], got ", in.DebugString())));
  SY_RETURN_IF_ERROR(
      CheckTensor(out, absl::StrCat(what, " output"), in.dtype, {in.dim(0), in.dim(1)}));
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&in, &out}));
  SY_RETURN_IF_ERROR(
      Rule(eps >= 0 && eps < 1, absl::StrCat(what, ": eps (", eps, ") must be in [0, 1)")));
  if (!stream.is_cuda()) return internal::JitterScaleCpu(in, eps, seed, offset, out);
  return internal::JitterScaleCuda(stream, in, eps, seed, offset, out);
}

}  // namespace

absl::Status ApplyInputJitter(const Stream& stream, const Tensor& x, float eps, uint64_t seed,
                              uint64_t offset, const Tensor& out) {
  return JitterScale(stream, x, eps, seed, offset, out, "router input jitter: x");
}

absl::Status InputJitterBackward(const Stream& stream, const Tensor& dx_jittered, float eps,
                                 uint64_t seed, uint64_t offset, const Tensor& dx) {
  return JitterScale(stream, dx_jittered, eps, seed, offset, dx,
                     "router input jitter backward: dx_jittered");
}

absl::Status RouterGatingForward(const Stream& stream, const Tensor& x, const Tensor& w,
                                 const Tensor& logits) {
  SY_RETURN_IF_ERROR(
      Rule(x.dtype == w.dtype && (x.dtype == DType::kF32 || x.dtype == DType::kBF16 ||
                                  (x.dtype == DType::kF64 && !stream.is_cuda())),
           absl::StrCat("router gating: x ", x.DebugString(), " and w ", w.DebugString(),
                        " must both be bf16 or both f32")));
  const DType out = x.dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  SY_RETURN_IF_ERROR(CheckTensor(x, "router gating: x", x.dtype, {-1, -1}));
  SY_RETURN_IF_ERROR(CheckTensor(w, "router gating: w", w.dtype, {-1, x.dim(1)}));
  SY_RETURN_IF_ERROR(CheckTensor(logits, "router gating: logits", out, {x.dim(0), w.dim(0)}));
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&x, &w, &logits}));
  return Gemm(stream, x, false, w, true, logits);
}

absl::Status RouterGatingBackward(const Stream& stream, const Tensor& dlogits, const Tensor& x,
                                  const Tensor& w, const Tensor& dlogits_lowp, const Tensor& dx,
                                  const Tensor& dw, float dw_beta, float dx_beta) {
  SY_RETURN_IF_ERROR(
      Rule(x.dtype == w.dtype && (x.dtype == DType::kF32 || x.dtype == DType::kBF16 ||
                                  (x.dtype == DType::kF64 && !stream.is_cuda())),
           absl::StrCat("router gating backward: x ", x.DebugString(), " and w ", w.DebugString(),
                        " must both be bf16 or both f32")));
  SY_RETURN_IF_ERROR(CheckTensor(x, "router gating backward: x", x.dtype, {-1, -1}));
  const int64_t t = x.dim(0), h = x.dim(1);
  SY_RETURN_IF_ERROR(CheckTensor(w, "router gating backward: w", w.dtype, {-1, h}));
  const int64_t e = w.dim(0);
  const DType grad_dtype = x.dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  SY_RETURN_IF_ERROR(CheckTensor(dlogits, "router gating backward: dlogits", grad_dtype, {t, e}));
  SY_RETURN_IF_ERROR(Rule(dx.dtype == x.dtype || dx.dtype == grad_dtype,
                          "router gating backward: dx must have the dtype of x, or f32"));
  SY_RETURN_IF_ERROR(CheckTensor(dx, "router gating backward: dx", dx.dtype, {t, h}));
  SY_RETURN_IF_ERROR(Rule(dw.dtype == w.dtype || dw.dtype == grad_dtype,
                          "router gating backward: dw must have the dtype of w, or f32"));
  SY_RETURN_IF_ERROR(CheckTensor(dw, "router gating backward: dw", dw.dtype, {e, h}));
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&dlogits, &x, &w, &dx, &dw}));
  Tensor g = dlogits;
  if (x.dtype == DType::kBF16) {
    SY_RETURN_IF_ERROR(
        CheckTensor(dlogits_lowp, "router gating backward: dlogits_lowp", DType::kBF16, {t, e}));
    SY_RETURN_IF_ERROR(CheckDevice(stream, {&dlogits_lowp}));
    if (stream.is_cuda()) {
      SY_RETURN_IF_ERROR(internal::CastF32ToBf16Cuda(stream, dlogits, dlogits_lowp));
    } else {
      const float* src = dlogits.as<float>();
      BF16* dst = dlogits_lowp.as<BF16>();
      for (int64_t i = 0; i < t * e; ++i) dst[i] = BF16::FromFloat(src[i]);
    }
    g = dlogits_lowp;
  }
  SY_RETURN_IF_ERROR(Gemm(stream, g, false, w, false, dx, 1.0f, dx_beta));
  return Gemm(stream, g, true, x, false, dw, 1.0f, dw_beta);
}

}  // namespace switchyard::kernels
