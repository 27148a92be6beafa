// File: kernels/moe/router_device.h
//
// Internal device helpers of the router and aux-loss kernels: warp reductions whose order the CPU
// reference reproduces (router_math.h), and the dispatch of the per-lane register width.
#ifndef SWITCHYARD_KERNELS_MOE_ROUTER_DEVICE_H_
#define SWITCHYARD_KERNELS_MOE_ROUTER_DEVICE_H_

#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/moe/router_math.h"

namespace switchyard::kernels::internal {

inline constexpr unsigned kFullMask = 0xffffffffu;

// Sum over the warp: five xor-butterfly steps (= router_math::LaneOrderSum on the host). Every
// lane gets the same bits, since a + b == b + a.
__device__ inline double WarpSum(double v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v = v + __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ inline double WarpMax(double v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) {
    const double other = __shfl_xor_sync(kFullMask, v, o);
    v = other > v ? other : v;
  }
  return v;
}

// Warp-wide best (value, index) under router_math::Better; index -1 = no candidate. Better is a
// strict total order on distinct indices, so the result equals the CPU's sequential scan.
__device__ inline void WarpBest(double* v, int* i) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) {
    const double ov = __shfl_xor_sync(kFullMask, *v, o);
    const int oi = __shfl_xor_sync(kFullMask, *i, o);
    if (oi >= 0 && router_math::Better(ov, oi, *v, *i)) *v = ov, *i = oi;
  }
}

// WarpBest for keys that are fp32 numbers (the logits: KeyKind::kLogit, the aux loss's plain
// top-k): `v`, `i` are this lane's best candidate (i < 0: none). Returns the warp's best index
// (-1 if no lane has one) under router_math::Better — the larger key, and of equal keys (-0 ==
// +0) the lower index — with two warp reductions (redux.sync, sm_80+) on an order-preserving
// 32-bit image of the key instead of WarpBest's five rounds of three shuffles. Same winner as
// WarpBest for every non-NaN key (Better is no order on NaN: there the two may differ).
__device__ inline int WarpBestFloatKey(float v, int i) {
  const unsigned bits = __float_as_uint(v == 0.0f ? 0.0f : v);
  unsigned key = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  if (i < 0) key = 0;
  const unsigned top = __reduce_max_sync(kFullMask, key);
  const unsigned cand = (i >= 0 && key == top) ? static_cast<unsigned>(i) : 0xffffffffu;
  const unsigned best = __reduce_min_sync(kFullMask, cand);
  return best == 0xffffffffu ? -1 : static_cast<int>(best);
}

// Softmax normaliser of row z (max, then lane-order sum of exp(z - max)).
template <int NJ>
__device__ inline void RowSoftmaxNorm(const float* z, int e_count, double* mx, double* sum) {
  const int lane = threadIdx.x & 31;
  double m = -router_math::Infinity();
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    const int e = lane + 32 * j;
    if (e < e_count) m = static_cast<double>(z[e]) > m ? static_cast<double>(z[e]) : m;
  }
  m = WarpMax(m);
  double s = 0.0;
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    const int e = lane + 32 * j;
    if (e < e_count) s += router_math::Exp(static_cast<double>(z[e]) - m);
  }
  *mx = m;
  *sum = WarpSum(s);
}

// Calls f(std::integral_constant<int, NJ>{}) with NJ >= ceil(num_experts / 32), NJ in
// {1, 2, 4, 8, 16}: each lane owns experts lane + 32·j, j < NJ, in registers.
template <typename F>
auto DispatchLaneWidth(int num_experts, const F& f) {
  const int nj = (num_experts + 31) / 32;
  if (nj <= 1) return f(std::integral_constant<int, 1>{});
  if (nj <= 2) return f(std::integral_constant<int, 2>{});
  if (nj <= 4) return f(std::integral_constant<int, 4>{});
  if (nj <= 8) return f(std::integral_constant<int, 8>{});
  return f(std::integral_constant<int, 16>{});
}

inline unsigned BlocksFor(long long n, int per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

}  // namespace switchyard::kernels::internal

#endif  // SWITCHYARD_KERNELS_MOE_ROUTER_DEVICE_H_
