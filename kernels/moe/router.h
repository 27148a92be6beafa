// File: kernels/moe/router.h
//
// The MoE router (megatron_moe.md §1): from router logits to a compact top-k routing, forward and
// backward, plus expert-bias balancing, input jitter and the router GEMMs. The load-balancing and
// z losses are in aux_loss.h.
//
// Representation (shared with permute.h and the experts):
//   x            [T, H]  tokens as rows, BATCH-MAJOR: row t = b*S + s (sequence b owns rows
//                        [b*S, (b+1)*S)). Megatron's rows are seq-major (s*B + b); the semantics
//                        are the same, and where order matters (the "position" drop policy,
//                        seq_aux_loss) we convert explicitly.
//   logits       [T, E]  f32 = x·Wᵀ (RouterGatingForward). f64 is accepted on the CPU (gradient
//                        checks); outputs then are f64 where they would be f32.
//   topk_idx     [T, k]  i32 expert ids in descending selection-score order; -1 = dropped by the
//                        capacity limit.
//   topk_probs   [T, k]  f32 routing weights; 0 in dropped slots.
//   selected_idx [T, k]  i32 the selection BEFORE capacity dropping; saved for the backward pass,
//                        which needs the probabilities of dropped slots' partners.
//   tokens_per_expert [E] i32 routed (kept) slots per expert, on the op's device.
//
// Routing (§1.3-1.5, §1.8, §1.9), per token t with logits z:
//   softmax, post (default): select top-k of z; p = softmax over the k selected logits.
//   softmax, pre:            s = softmax_E(z); select top-k of s; p = s (not renormalised).
//   sigmoid:                 s = σ(z); select top-k of s (+ expert_bias, selection only);
//                            p = s / (Σ_selected s + 1e-20) if k > 1, else p = s.
//   group-limited (num_groups G, group_topk g): group score = sum of the top-(k/g) selection
//                            scores in each contiguous group of E/G experts; keep the g best
//                            groups; select top-k among their experts.
//   p *= topk_scaling_factor after normalisation.
//   sinkhorn, training:      select top-k of the Sinkhorn-balanced d1 ⊙ exp(z) ⊙ d0 (iterated
//                            until mean|Δd1| <= 1e-4, at most 2000 iterations); p = act(z) at the
//                            selection, act = σ if k == 1 else softmax_E, not renormalised.
//   sinkhorn, eval:          plain top-k of act(z).
//   capacity (capacity_factor > 0): C = ceil((T·k/E)·capacity_factor) with T the local token
//                            count; if C < T, each expert keeps C of the tokens that selected it:
//                            policy probs keeps the largest p (ties: lower row), policy position
//                            the earliest (sequence position, then sequence index, when
//                            seq_length > 0; else lower row). Dropped slots: idx -1, prob 0.
// Top-k ties: the lower expert index wins (also for group ties: the lower group), identically on
// the CPU and the GPU. All score math runs in fp64 from the fp32 logits and is rounded once to the
// output dtype; the CPU and CUDA paths evaluate the same expressions in the same order
// (router_math.h), so the GPU's selection equals the reference's bit for bit.
//
// Deliberate differences from Megatron (document any new one here):
//   * Pre-softmax and sinkhorn-eval selection use the fp64 score; post-softmax selection uses
//     the logits themselves (as Megatron). Megatron's ties inside fp32 rounding are unspecified.
//   * Sinkhorn runs in fp64 (Megatron fp32: exp overflows for logits > 88) with an iteration cap.
//   * Input jitter is applied only when training (Megatron also jitters in eval).
//   * The "position" policy keeps the earliest sequence positions explicitly (Megatron relies on
//     torch.topk's tie order over 0/1 values).
//   * Padding to capacity is done by Permute (permute.h), not here.
//
// CUDA: one warp per token; E <= kRouterMaxExperts, k <= kRouterMaxTopk. No host
// synchronisation, no allocation: ops take a device workspace sized at plan time. Every result is
// deterministic run to run (integer atomics only; floating-point sums in a fixed order). Sinkhorn
// uses one cooperative launch (grid-wide sync), so the device must support cooperative launches.
#ifndef SWITCHYARD_KERNELS_MOE_ROUTER_H_
#define SWITCHYARD_KERNELS_MOE_ROUTER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/tensor.h"

namespace switchyard::kernels {

inline constexpr int kRouterMaxExperts = 512;
inline constexpr int kRouterMaxTopk = 16;

enum class RouterScoreFunction { kSoftmax, kSigmoid };
enum class CapacityDropPolicy { kProbs, kPosition };
enum class AuxLossType { kAuxLoss, kSeqAuxLoss, kGlobalAuxLoss };

// One load-balancing loss with its coefficient (moe_router_load_balancing_type[i],
// moe_aux_loss_coeff[i]).
struct AuxLossTerm {
  AuxLossType type = AuxLossType::kAuxLoss;
  double coeff = 0.0;
};

// Router configuration; field names follow Megatron's arguments.
struct RouterConfig {
  int num_experts = 0;  // num_moe_experts (E)
  int topk = 0;         // moe_router_topk (k)
  RouterScoreFunction score_function = RouterScoreFunction::kSoftmax;
  bool pre_softmax = false;          // moe_router_pre_softmax
  int num_groups = 0;                // moe_router_num_groups; 0 = no group-limited routing
  int group_topk = 0;                // moe_router_group_topk
  double topk_scaling_factor = 1.0;  // moe_router_topk_scaling_factor; 1 = off
  bool use_expert_bias = false;      // moe_router_enable_expert_bias
  bool sinkhorn = false;             // moe_router_load_balancing_type == "sinkhorn"
  double capacity_factor = 0.0;      // moe_expert_capacity_factor; <= 0 = dropless
  CapacityDropPolicy drop_policy = CapacityDropPolicy::kProbs;  // moe_token_drop_policy
  double input_jitter_eps = 0.0;                                // moe_input_jitter_eps; 0 = off
  double z_loss_coeff = 0.0;                                    // moe_z_loss_coeff
  std::vector<AuxLossTerm> aux_losses;                          // at most one term per type
  int64_t seq_length = 0;  // S: tokens per sequence (seq_aux_loss, "position" policy)
  bool training = true;

  // INVALID_ARGUMENT naming the field and the rule, e.g.
  // "router.group_topk (5) must be <= router.num_groups (4)".
  absl::Status Validate() const;
};

// Per-expert capacity C for `num_tokens` local tokens, or -1 when nothing is dropped (dropless,
// or C >= num_tokens).
int64_t ExpertCapacity(const RouterConfig& config, int64_t num_tokens);

// Bytes of device workspace RouterForward needs on CUDA (the CPU path needs none).
int64_t RouterWorkspaceBytes(const RouterConfig& config, int64_t num_tokens);

struct RouterOutputs {
  Tensor topk_idx;           // i32 [T, k]
  Tensor topk_probs;         // f32 [T, k] (f64 with f64 logits)
  Tensor selected_idx;       // i32 [T, k]
  Tensor tokens_per_expert;  // i32 [E]
};

// Routing forward. Preconditions: config.Validate() is OK; all tensors on the stream's device.
//   logits [T, E] f32 (or f64 on the CPU).
//   expert_bias [E] f32: read when use_expert_bias, else may be empty.
//   local_tokens_per_expert [E] f32: when use_expert_bias and training, tokens_per_expert is
//     ADDED to it (Megatron's count for the bias update); may be empty otherwise.
//   workspace: >= RouterWorkspaceBytes bytes on CUDA; ignored (may be empty) on the CPU.
absl::Status RouterForward(const Stream& stream, const RouterConfig& config, const Tensor& logits,
                           const Tensor& expert_bias, const Tensor& local_tokens_per_expert,
                           const RouterOutputs& out, const Tensor& workspace);

// Routing backward: dlogits [T, E] = ∂(Σ dtopk_probs ⊙ topk_probs)/∂logits, OVERWRITTEN.
// Dropped slots (topk_idx == -1) contribute nothing but stay in the normalisation; the selection
// itself (top-k, groups, bias, sinkhorn) is constant. Aux/z-loss gradients are added afterwards
// by AuxLossBackward. logits, dtopk_probs and dlogits share one dtype (f32; f64 on the CPU).
absl::Status RouterBackward(const Stream& stream, const RouterConfig& config, const Tensor& logits,
                            const Tensor& selected_idx, const Tensor& topk_idx,
                            const Tensor& dtopk_probs, const Tensor& dlogits);

// Aux-loss-free balancing update, once per global batch, after the caller has summed the counts
// over TP×DP×CP: bias[e] += rate·sign(mean(counts) − counts[e]) (fp32, sign(0) = 0), then
// counts = 0. counts, bias: f32 [E].
absl::Status UpdateExpertBias(const Stream& stream, const Tensor& counts, const Tensor& bias,
                              float rate);

// Input jitter (§1.7): out = x ⊙ u, u[i] = JitterMultiplier(eps, seed, offset + i) (rng.h), i the
// flat element index. x, out [T, H] f32 or bf16, f64 on the CPU (same dtype; may alias). The layer
// calls it only when training with input_jitter_eps > 0 (Megatron also jitters in eval; we do not),
// with a fresh (seed, offset) per step and layer; the backward regenerates u from them instead of
// saving it.
absl::Status ApplyInputJitter(const Stream& stream, const Tensor& x, float eps, uint64_t seed,
                              uint64_t offset, const Tensor& out);

// Backward of the jitter: dx = dx_jittered ⊙ u (same u as ApplyInputJitter; may alias).
absl::Status InputJitterBackward(const Stream& stream, const Tensor& dx_jittered, float eps,
                                 uint64_t seed, uint64_t offset, const Tensor& dx);

// logits [T, E] f32 = x [T, H] · w [E, H]ᵀ with fp32 accumulation (x, w both bf16 or both f32;
// x is the jittered input when jitter is on).
absl::Status RouterGatingForward(const Stream& stream, const Tensor& x, const Tensor& w,
                                 const Tensor& logits);

// dx = dlogits·w + dx_beta·dx and dw = dlogitsᵀ·x + dw_beta·dw (dx_beta 1: the layer adds the
// router's input gradient straight into its dx, no separate add pass). dlogits is f32; with bf16 x
// and w it is first rounded to bf16 into `dlogits_lowp` [T, E] bf16 (Megatron instead upcasts x and
// w to fp32, which would need an fp32 copy of x: 470 MB at T=16384, H=7168), and both GEMMs run in
// bf16 with fp32 accumulation. With f32 x and w, `dlogits_lowp` may be empty.
//   dx [T, H]: dtype of x, or f32. dw [E, H]: f32, or the dtype of w.
absl::Status RouterGatingBackward(const Stream& stream, const Tensor& dlogits, const Tensor& x,
                                  const Tensor& w, const Tensor& dlogits_lowp, const Tensor& dx,
                                  const Tensor& dw, float dw_beta, float dx_beta = 0.0f);

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_MOE_ROUTER_H_
