// File: kernels/moe/router_test_util.h
//
// Test-only helpers: run the router and aux-loss ops on the CPU over std::vector storage.
#ifndef SWITCHYARD_KERNELS_MOE_ROUTER_TEST_UTIL_H_
#define SWITCHYARD_KERNELS_MOE_ROUTER_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "common/tensor.h"
#include "kernels/moe/aux_loss.h"
#include "kernels/moe/router.h"

namespace switchyard::kernels::testutil {

template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return DType::kF32;
}
template <>
constexpr DType DTypeOf<double>() {
  return DType::kF64;
}
template <>
constexpr DType DTypeOf<int32_t>() {
  return DType::kI32;
}

template <typename T>
Tensor View(const std::vector<T>& v, std::vector<int64_t> shape) {
  return Tensor(DTypeOf<T>(), std::move(shape), Device::Cpu(), const_cast<T*>(v.data()));
}

inline std::vector<double> RandomNormal(int64_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}

template <typename Real>
struct Routed {
  std::vector<int32_t> idx, selected, tokens_per_expert;
  std::vector<Real> probs;
  absl::Status status;
};

// RouterForward on the CPU. `local` (f32 [E]) is updated when given.
template <typename Real>
Routed<Real> Route(const RouterConfig& c, const std::vector<Real>& logits,
                   const std::vector<float>& bias = {}, std::vector<float>* local = nullptr) {
  const int64_t e = c.num_experts, k = c.topk, t = static_cast<int64_t>(logits.size()) / e;
  Routed<Real> r;
  r.idx.assign(t * k, -7);
  r.selected.assign(t * k, -7);
  r.tokens_per_expert.assign(e, -7);
  r.probs.assign(t * k, Real(-7));
  RouterOutputs out{View(r.idx, {t, k}), View(r.probs, {t, k}), View(r.selected, {t, k}),
                    View(r.tokens_per_expert, {e})};
  std::vector<float> scratch(e, 0.0f);
  const Tensor bias_t = bias.empty() ? Tensor() : View(bias, {e});
  const Tensor local_t = View(local ? *local : scratch, {e});
  r.status = RouterForward(Stream::Cpu(), c, View(logits, {t, e}), bias_t, local_t, out, Tensor());
  return r;
}

template <typename Real>
std::vector<Real> RouteBackward(const RouterConfig& c, const std::vector<Real>& logits,
                                const Routed<Real>& r, const std::vector<Real>& dprobs) {
  const int64_t e = c.num_experts, k = c.topk, t = static_cast<int64_t>(logits.size()) / e;
  std::vector<Real> dz(t * e, Real(-7));
  const absl::Status s =
      RouterBackward(Stream::Cpu(), c, View(logits, {t, e}), View(r.selected, {t, k}),
                     View(r.idx, {t, k}), View(dprobs, {t, k}), View(dz, {t, e}));
  if (!s.ok()) return {};
  return dz;
}

template <typename Real>
struct AuxRun {
  std::vector<double> prob_sums, lse_sq_sum;
  std::vector<float> counts;
  std::vector<Real> losses, grad_weights;
  absl::Status status;
};

// Stats + loss forward on the CPU; `global_counts` used by a global_aux_loss term; `selected`
// (the router's selected_idx [T, k]) passed to AuxLossStatsForward when given.
template <typename Real>
AuxRun<Real> Aux(const RouterConfig& c, const std::vector<Real>& logits, AuxLossNorms norms = {},
                 const std::vector<float>& global_counts = {},
                 const std::vector<int32_t>* selected = nullptr) {
  const int64_t e = c.num_experts, t = static_cast<int64_t>(logits.size()) / e;
  const int64_t b = AuxLossNumSequences(c, t);
  AuxRun<Real> r;
  r.prob_sums.assign(b * e, -7);
  r.counts.assign(b * e, -7);
  r.lse_sq_sum.assign(1, -7);
  r.losses.assign(c.aux_losses.size() + 1, Real(-7));
  r.grad_weights.assign(b * e, Real(-7));
  AuxLossStats stats{View(r.prob_sums, {b, e}), View(r.counts, {b, e}), View(r.lse_sq_sum, {1})};
  const Tensor sel = selected ? View(*selected, {static_cast<int64_t>(selected->size()) / c.topk,
                                                 static_cast<int64_t>(c.topk)})
                              : Tensor();
  r.status = AuxLossStatsForward(Stream::Cpu(), c, View(logits, {t, e}), stats, Tensor(), sel);
  if (!r.status.ok()) return r;
  if (!global_counts.empty()) norms.global_counts = View(global_counts, {e});
  r.status = AuxLossForward(Stream::Cpu(), c, t, stats, norms,
                            View(r.losses, {static_cast<int64_t>(r.losses.size())}),
                            View(r.grad_weights, {b, e}));
  return r;
}

// dlogits = base + scale·∂(aux + z)/∂logits.
template <typename Real>
std::vector<Real> AuxBackward(const RouterConfig& c, const std::vector<Real>& logits,
                              const AuxRun<Real>& run, double scale, std::vector<Real> base) {
  const int64_t e = c.num_experts, t = static_cast<int64_t>(logits.size()) / e;
  const int64_t b = static_cast<int64_t>(run.grad_weights.size()) / e;
  const absl::Status s = AuxLossBackward(Stream::Cpu(), c, View(logits, {t, e}),
                                         View(run.grad_weights, {b, e}), scale, View(base, {t, e}));
  if (!s.ok()) return {};
  return base;
}

}  // namespace switchyard::kernels::testutil

#endif  // SWITCHYARD_KERNELS_MOE_ROUTER_TEST_UTIL_H_
