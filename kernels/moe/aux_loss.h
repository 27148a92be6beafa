// File: kernels/moe/aux_loss.h
//
// Load-balancing losses and the router z-loss (megatron_moe.md §1.6, §2), forward and backward.
//
// The losses use their OWN plain top-k (§2.2), not the routing (but see selected_idx below): P =
// softmax_E(z) (softmax score function) or σ(z)/Σ_E σ(z) (sigmoid), map_aux = top-k of P (= top-k
// of z: both are monotone), ignoring groups, expert bias, capacity and pre/post-softmax. Counts are
// constants: no gradient flows through them, as in Megatron. Where that top-k IS the router's
// selection (AuxTopkIsRouterTopk: softmax, post-softmax, no groups; the router then selects the
// top-k of the same fp32 logits with the same tie rule, lower expert index first, before any
// capacity drop), the caller may pass the router's `selected_idx` and the counts are taken from it
// instead of a second top-k over the logits (the same counts, without k rounds of arg-max per
// token).
//
// Three calls per micro-batch, so that a distributed caller can all-reduce the counts in between:
//   1. AuxLossStatsForward: per-sequence column sums of P, counts of map_aux, Σ_t lse(z_t)².
//   2. (caller) sum `counts` over TP×CP, accumulate the global counts for global_aux_loss.
//   3. AuxLossForward: loss values for logging, and ∂(total aux)/∂P per (sequence, expert).
//   4. AuxLossBackward (in the backward pass): dlogits += aux_grad_scale·∂(aux + z)/∂logits.
// This is Megatron's MoEAuxLossAutoScaler (§2.4) without autograd: the losses are never added to
// the LM loss; the backward seeds d(loss) = aux_grad_scale (loss_scale·CP/num_microbatches in
// Megatron's schedule).
//
// Definitions, with k = topk, E = num_experts, T local tokens, B = T/S sequences of S tokens
// (rows batch-major, see router.h), Psum[b,e] = Σ_{t∈b} P[t,e], c[b,e] = counts:
//   aux_loss        α·E/(k·N²) · Σ_e (Σ_b Psum[b,e])·(Σ_b c[b,e]),        N = aux_num_tokens (T)
//   seq_aux_loss    (1/B)·Σ_b α·E/(k·Ns²) · Σ_e Psum[b,e]·c[b,e],           Ns = seq_num_tokens (S)
//   global_aux_loss α·E/(k·Ng²) · Σ_e (Σ_b Psum[b,e])·c̄_e,   c̄, Ng given by the caller
//   z_loss          c_z · (1/T)·Σ_t (logsumexp_e z[t,e])²
// seq_aux_loss with one sequence equals aux_loss exactly; with uniform P every load-balancing
// loss equals its α exactly (given N = T, c̄ = c, Ng = T).
//
// Deliberate difference from Megatron (issue #3672): global_aux_loss's GRADIENT is dp_size ×
// ∂(value)/∂P, so that after data-parallel gradient averaging it has the same strength as
// aux_loss; Megatron's is ~1/DP too small. The returned VALUE stays Megatron's (each rank's share;
// the sum over TP×DP×CP ranks is the global loss), so logs are comparable.
//
// Determinism: fixed-order fp64 sums over tokens (chunks of router_math::kAuxChunk tokens in
// token order, then the chunk sums in lane order: router_math::LaneOrderSum), integer-valued float
// atomics for counts (exact). The CPU reference sums in the same chunks and orders.
#ifndef SWITCHYARD_KERNELS_MOE_AUX_LOSS_H_
#define SWITCHYARD_KERNELS_MOE_AUX_LOSS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/tensor.h"
#include "kernels/moe/router.h"

namespace switchyard::kernels {

struct AuxLossStats {
  Tensor prob_sums;   // f64 [B, E]   Psum
  Tensor counts;      // f32 [B, E]   c (integer values)
  Tensor lse_sq_sum;  // f64 [1]      Σ_t logsumexp(z_t)²
};

// Knobs a distributed caller sets; the defaults are the single-rank values.
struct AuxLossNorms {
  double aux_num_tokens = 0.0;     // N of aux_loss; <= 0: T. (TP×CP run: T·size(TP×CP).)
  double seq_num_tokens = 0.0;     // Ns of seq_aux_loss; <= 0: S.
  Tensor global_counts;            // f32 [E] c̄: required iff a global_aux_loss term exists.
  double global_num_tokens = 0.0;  // Ng > 0: required iff a global_aux_loss term exists.
  int dp_size = 1;                 // data-parallel size (gradient fix of global_aux_loss)
};

// B: T / seq_length when config has a seq_aux_loss term, else 1.
int64_t AuxLossNumSequences(const RouterConfig& config, int64_t num_tokens);

// Bytes of device workspace AuxLossStatsForward needs on CUDA (the CPU path needs none).
int64_t AuxLossWorkspaceBytes(const RouterConfig& config, int64_t num_tokens);

// True when the losses' plain top-k equals RouterForward's selection for every logits tensor:
// softmax score function, post-softmax (the router selects on the logits themselves), no group-
// limited routing (sinkhorn has no aux losses; expert bias needs sigmoid). Pre-softmax and sigmoid
// select on fp64 scores, which can tie where the fp32 logits do not (exp underflow, σ → 1).
bool AuxTopkIsRouterTopk(const RouterConfig& config);

// Step 1. logits [T, E] f32 (f64 on the CPU); with a seq_aux_loss term T % seq_length == 0.
// selected_idx: empty, or i32 [T, k] RouterForward's selected_idx for these logits; read only
// when AuxTopkIsRouterTopk(config) (the counts then come from it), ignored otherwise. The CPU path
// checks its ids are in [0, E); the CUDA path trusts them (the router wrote them).
absl::Status AuxLossStatsForward(const Stream& stream, const RouterConfig& config,
                                 const Tensor& logits, const AuxLossStats& stats,
                                 const Tensor& workspace, const Tensor& selected_idx = Tensor());

// Step 3. losses [n + 1] (n = config.aux_losses.size()): the values of the terms in config order
// (coefficient included), then the z-loss (0 when z_loss_coeff == 0). grad_weights [B, E]:
// ∂(Σ terms)/∂P[t, e] for tokens t of sequence b (z-loss excluded). Both have the logits' dtype.
absl::Status AuxLossForward(const Stream& stream, const RouterConfig& config, int64_t num_tokens,
                            const AuxLossStats& stats, const AuxLossNorms& norms,
                            const Tensor& losses, const Tensor& grad_weights);

// Step 4. dlogits [T, E] += aux_grad_scale · (∂(Σ terms)/∂logits + ∂z_loss/∂logits).
// logits, grad_weights and dlogits share one dtype (f32; f64 on the CPU).
absl::Status AuxLossBackward(const Stream& stream, const RouterConfig& config, const Tensor& logits,
                             const Tensor& grad_weights, double aux_grad_scale,
                             const Tensor& dlogits);

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_MOE_AUX_LOSS_H_
