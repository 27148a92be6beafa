// File: kernels/moe/router_internal.h
//
// Internal to kernels/moe router and aux-loss ops: the resolved routing plan, the CUDA workspace
// layouts, the per-slot probability math shared by host and device, and the CPU/CUDA entry
// points that router.cc and aux_loss.cc dispatch to after validating every tensor.
#ifndef SWITCHYARD_KERNELS_MOE_ROUTER_INTERNAL_H_
#define SWITCHYARD_KERNELS_MOE_ROUTER_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/tensor.h"
#include "kernels/moe/aux_loss.h"
#include "kernels/moe/router.h"
#include "kernels/moe/router_math.h"

namespace switchyard::kernels::internal {

// The router math that the implementation files (router_cpu.cc, aux_loss_cpu.cc, router.cu,
// router_balance.cu, aux_loss.cu) and the helpers below use unqualified. This header is internal
// to kernels/moe.
using router_math::Better;
using router_math::Exp;
using router_math::LaneOrderSum;
using router_math::Sigmoid;
using router_math::SoftmaxNorm;

// What a token's selection keys are.
enum class KeyKind : int {
  kLogit,     // z (post-softmax; sinkhorn in eval)
  kSoftmax,   // softmax_E(z) (pre-softmax)
  kSigmoid,   // σ(z) + bias
  kSinkhorn,  // d1[e]·exp(z)·d0[t]
};

// How the probabilities of the selected slots follow from the logits.
enum class ProbKind : int {
  kTopkSoftmax,        // softmax over the selected logits
  kFullSoftmax,        // softmax_E(z) at the selection (pre-softmax; sinkhorn k > 1)
  kSigmoid,            // σ(z) (sigmoid k = 1; sinkhorn k = 1)
  kSigmoidNormalized,  // σ(z) / (Σ_selected σ + 1e-20)
};

struct RoutingPlan {
  int64_t num_tokens = 0, num_experts = 0, topk = 0;
  KeyKind key = KeyKind::kLogit;
  ProbKind prob = ProbKind::kTopkSoftmax;
  double scale = 1.0;
  bool use_bias = false;
  int num_groups = 0, group_topk = 0;  // 0: not group-limited
  int64_t capacity = -1;               // -1: nothing dropped
  bool position_policy = false;
  int64_t seq_length = 0, num_sequences = 1;  // for the position key
  bool count_for_bias = false;                // add kept counts to local_tokens_per_expert
};
RoutingPlan MakeRoutingPlan(const RouterConfig& config, int64_t num_tokens);

struct AuxPlan {
  int64_t num_tokens = 0, num_experts = 0, topk = 0;
  bool sigmoid = false;
  int64_t num_sequences = 1, tokens_per_sequence = 0;  // B, T / B
  int64_t chunks_per_sequence = 0, num_chunks = 0;     // chunks of router_math::kAuxChunk tokens
};
AuxPlan MakeAuxPlan(const RouterConfig& config, int64_t num_tokens);

// Byte offsets into the CUDA workspace of RouterForward (every offset 256-aligned).
struct RouterWorkspaceLayout {
  int64_t counts = 0, offsets = 0, cursor = 0;  // i32 [E] each
  int64_t bucket = 0;      // i32 [T·k] slot ids grouped by expert (capacity only)
  int64_t bucket_key = 0;  // f32 [T·k] their probabilities (capacity only)
  int64_t d0 = 0, d1 = 0, d1_next = 0, diff = 0, partial = 0, flag = 0;  // sinkhorn only
  int64_t total = 0;
};
RouterWorkspaceLayout MakeRouterWorkspaceLayout(const RoutingPlan& plan);

// The normalisers of the slot-local kinds, over the selected logits zs[r] in selection order
// (sums run over slots in order), shared by SlotProbs and SlotGrads. kTopkSoftmax: max of zs and
// the sum of exp(zs[r] - max).
SY_HOST_DEVICE inline void SlotSoftmaxNorm(int k, const double* zs, double* mx, double* sum) {
  double m = zs[0];
  for (int r = 1; r < k; ++r) m = zs[r] > m ? zs[r] : m;
  double s = 0.0;
  for (int r = 0; r < k; ++r) s += Exp(zs[r] - m);
  *mx = m;
  *sum = s;
}
// kSigmoidNormalized: the sum of sigmoid(zs[r]) plus kSigmoidNormEps.
SY_HOST_DEVICE inline double SlotSigmoidDenominator(int k, const double* zs) {
  double sum = 0.0;
  for (int r = 0; r < k; ++r) sum += Sigmoid(zs[r]);
  return sum + router_math::kSigmoidNormEps;
}

// Probabilities of the k selected slots for the slot-local kinds (all but kFullSoftmax), from the
// selected logits zs[r] in selection order. Sums run over slots in order.
SY_HOST_DEVICE inline void SlotProbs(ProbKind kind, int k, const double* zs, double scale,
                                     double* p) {
  if (kind == ProbKind::kTopkSoftmax) {
    double mx, sum;
    SlotSoftmaxNorm(k, zs, &mx, &sum);
    for (int r = 0; r < k; ++r) p[r] = Exp(zs[r] - mx) / sum * scale;
  } else if (kind == ProbKind::kSigmoidNormalized) {
    const double d = SlotSigmoidDenominator(k, zs);
    for (int r = 0; r < k; ++r) p[r] = Sigmoid(zs[r]) / d * scale;
  } else {  // kSigmoid
    for (int r = 0; r < k; ++r) p[r] = Sigmoid(zs[r]) * scale;
  }
}

// Backward of SlotProbs: dz[r] = Σ_q g[q]·∂p[q]/∂zs[r] for the slot-local kinds.
SY_HOST_DEVICE inline void SlotGrads(ProbKind kind, int k, const double* zs, const double* g,
                                     double scale, double* dz) {
  if (kind == ProbKind::kTopkSoftmax) {
    double mx, sum;
    SlotSoftmaxNorm(k, zs, &mx, &sum);
    double dot = 0.0;
    for (int r = 0; r < k; ++r) dot += Exp(zs[r] - mx) / sum * (g[r] * scale);
    for (int r = 0; r < k; ++r) dz[r] = Exp(zs[r] - mx) / sum * (g[r] * scale - dot);
  } else if (kind == ProbKind::kSigmoidNormalized) {
    const double d = SlotSigmoidDenominator(k, zs);
    double dot = 0.0;
    for (int r = 0; r < k; ++r) dot += Sigmoid(zs[r]) / d * (g[r] * scale);
    for (int r = 0; r < k; ++r) {
      const double s = Sigmoid(zs[r]);
      dz[r] = (g[r] * scale - dot) / d * (s * (1.0 - s));
    }
  } else {  // kSigmoid
    for (int r = 0; r < k; ++r) {
      const double s = Sigmoid(zs[r]);
      dz[r] = g[r] * scale * (s * (1.0 - s));
    }
  }
}

// ---- CPU reference (router_cpu.cc, aux_loss_cpu.cc); tensors already validated. ----
absl::Status RouterForwardCpu(const RoutingPlan& plan, const Tensor& logits,
                              const Tensor& expert_bias, const Tensor& local_tokens_per_expert,
                              const RouterOutputs& out);
absl::Status RouterBackwardCpu(const RoutingPlan& plan, const Tensor& logits,
                               const Tensor& selected_idx, const Tensor& topk_idx,
                               const Tensor& dtopk_probs, const Tensor& dlogits);
absl::Status UpdateExpertBiasCpu(const Tensor& counts, const Tensor& bias, float rate);
absl::Status JitterScaleCpu(const Tensor& in, float eps, uint64_t seed, uint64_t offset,
                            const Tensor& out);
// `selected`: empty, or the router's selected_idx [T, k] (aux_loss.h: counts taken from it).
absl::Status AuxLossStatsCpu(const AuxPlan& plan, const Tensor& logits, const Tensor& selected,
                             const AuxLossStats& stats);
absl::Status AuxLossForwardCpu(const RouterConfig& config, const AuxPlan& plan,
                               const AuxLossStats& stats, const AuxLossNorms& norms,
                               const Tensor& losses, const Tensor& grad_weights);
absl::Status AuxLossBackwardCpu(const RouterConfig& config, const AuxPlan& plan,
                                const Tensor& logits, const Tensor& grad_weights,
                                double aux_grad_scale, const Tensor& dlogits);

// ---- CUDA (router.cu, router_balance.cu, aux_loss.cu); f32 tensors, already validated. ----
absl::Status RouterForwardCuda(const Stream& stream, const RoutingPlan& plan, const Tensor& logits,
                               const Tensor& expert_bias, const Tensor& local_tokens_per_expert,
                               const RouterOutputs& out, const Tensor& workspace);
absl::Status RouterBackwardCuda(const Stream& stream, const RoutingPlan& plan, const Tensor& logits,
                                const Tensor& selected_idx, const Tensor& topk_idx,
                                const Tensor& dtopk_probs, const Tensor& dlogits);
absl::Status UpdateExpertBiasCuda(const Stream& stream, const Tensor& counts, const Tensor& bias,
                                  float rate);
absl::Status JitterScaleCuda(const Stream& stream, const Tensor& in, float eps, uint64_t seed,
                             uint64_t offset, const Tensor& out);
absl::Status CastF32ToBf16Cuda(const Stream& stream, const Tensor& in, const Tensor& out);
// Sinkhorn scaling (d0 [T], d1 [E] f64 in the workspace) and capacity dropping, used by
// RouterForwardCuda (router_balance.cu).
absl::Status SinkhornCuda(const Stream& stream, const RoutingPlan& plan, const float* logits,
                          const RouterWorkspaceLayout& layout, char* workspace);
absl::Status DropOverCapacityCuda(const Stream& stream, const RoutingPlan& plan,
                                  const RouterOutputs& out, float* local_tokens_per_expert,
                                  const RouterWorkspaceLayout& layout, char* workspace);
absl::Status AuxLossStatsCuda(const Stream& stream, const AuxPlan& plan, const Tensor& logits,
                              const Tensor& selected, const AuxLossStats& stats,
                              const Tensor& workspace);
absl::Status AuxLossForwardCuda(const Stream& stream, const RouterConfig& config,
                                const AuxPlan& plan, const AuxLossStats& stats,
                                const AuxLossNorms& norms, const Tensor& losses,
                                const Tensor& grad_weights);
absl::Status AuxLossBackwardCuda(const Stream& stream, const RouterConfig& config,
                                 const AuxPlan& plan, const Tensor& logits,
                                 const Tensor& grad_weights, double aux_grad_scale,
                                 const Tensor& dlogits);

}  // namespace switchyard::kernels::internal

#endif  // SWITCHYARD_KERNELS_MOE_ROUTER_INTERNAL_H_
