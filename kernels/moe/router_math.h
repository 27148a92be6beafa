// File: kernels/moe/router_math.h
//
// Internal to the router and aux-loss ops: the scalar math that the CPU reference and the CUDA
// kernels share, written once so that both evaluate the same expressions in the same order.
//
// Why: top-k selection is discontinuous, so the GPU must pick exactly the experts the CPU
// reference picks. All score math runs in fp64 from fp32 logits, with
//   * our own Exp (range reduction + degree-13 Taylor polynomial in explicit fma), because the
//     CUDA and glibc exp() differ in the last bit;
//   * sums over experts in "lane order" (32 strided partial sums, then an xor butterfly), which
//     is what a warp computes and what LaneOrderSum emulates on the host;
//   * no contraction of a*b+c into fma (router.cu is compiled with -fmad=false, the CPU files
//     with -ffp-contract=off).
// Scores that decide selection are therefore bit-identical on both sides. Only log() (z-loss)
// and the final loss reductions are left to the platform libraries.
#ifndef SWITCHYARD_KERNELS_MOE_ROUTER_MATH_H_
#define SWITCHYARD_KERNELS_MOE_ROUTER_MATH_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/moe/rng.h"  // SY_HOST_DEVICE

namespace switchyard::kernels::router_math {

inline constexpr double kSigmoidNormEps = 1e-20;  // sigmoid renormalisation (moe_utils.py)
inline constexpr double kSinkhornEps = 1e-8;
inline constexpr double kSinkhornTol = 1e-4;
// Megatron loops until convergence; we stop after this many iterations so that a pathological
// input cannot hang the device (documented in router.h).
inline constexpr int kSinkhornMaxIters = 2000;
// Token chunking of the deterministic column sums (sinkhorn, aux-loss statistics). Part of the
// numerical contract: the CPU reference sums in the same chunks.
inline constexpr int kSinkhornChunk = 64;
inline constexpr int kAuxChunk = 16;

// The double whose IEEE-754 bits are `bits`.
SY_HOST_DEVICE inline double BitsToDouble(uint64_t bits) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(bits));
#else
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
#endif
}

// 2^m for m in [-1022, 1023], built from its bits (exact).
SY_HOST_DEVICE inline double Pow2(int m) {
  return BitsToDouble(static_cast<uint64_t>(m + 1023) << 52);
}

SY_HOST_DEVICE inline double Infinity() { return BitsToDouble(0x7ff0000000000000ull); }

SY_HOST_DEVICE inline double RoundToEven(double x) {
#if defined(__CUDA_ARCH__)
  return rint(x);
#else
  return std::rint(x);  // default rounding mode: to nearest, ties to even
#endif
}

SY_HOST_DEVICE inline double Fma(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// exp(x) in fp64, within ~2 ulp, identical on host and device. NaN propagates.
SY_HOST_DEVICE inline double Exp(double x) {
  if (x != x) return x;
  if (x > 709.782712893384) return Infinity();
  if (x < -745.1332191019412) return 0.0;
  const double n = RoundToEven(x * 1.4426950408889634);  // round(x / ln 2), ties to even
  // r = x - n ln2 with ln2 split in two (Cody-Waite; the high part has 32 trailing zero bits).
  double r = Fma(-n, 6.93147180369123816490e-01, x);
  r = Fma(-n, 1.90821492927058770002e-10, r);
  // exp(r), |r| <= 0.347: Taylor to degree 13 (truncation < 1e-17 relative), Horner in fma.
  double p = 1.0 / 6227020800.0;
  p = Fma(p, r, 1.0 / 479001600.0);
  p = Fma(p, r, 1.0 / 39916800.0);
  p = Fma(p, r, 1.0 / 3628800.0);
  p = Fma(p, r, 1.0 / 362880.0);
  p = Fma(p, r, 1.0 / 40320.0);
  p = Fma(p, r, 1.0 / 5040.0);
  p = Fma(p, r, 1.0 / 720.0);
  p = Fma(p, r, 1.0 / 120.0);
  p = Fma(p, r, 1.0 / 24.0);
  p = Fma(p, r, 1.0 / 6.0);
  p = Fma(p, r, 0.5);
  p = Fma(p, r, 1.0);
  p = Fma(p, r, 1.0);
  int m = static_cast<int>(n);  // in [-1075, 1024]
  if (m > 1023) {
    p *= 2.0;
    m -= 1;
  } else if (m < -1022) {
    p *= Pow2(m + 54);  // exact (normal range); the final scaling rounds once
    m = -54;
  }
  return p * Pow2(m);
}

SY_HOST_DEVICE inline double Sigmoid(double z) { return 1.0 / (1.0 + Exp(-z)); }

// Selection order of top-k: larger key first; equal keys: lower index first. `best_i < 0` means
// "no candidate yet".
SY_HOST_DEVICE inline bool Better(double v, int i, double best_v, int best_i) {
  return best_i < 0 || v > best_v || (v == best_v && i < best_i);
}

// Order of tokens for the "position" drop policy: sequence position first, then sequence index
// (Megatron's seq-major row order), from our batch-major row t = b*S + s. S <= 0: the row index.
SY_HOST_DEVICE inline int64_t PositionKey(int64_t t, int64_t seq_length, int64_t num_sequences) {
  if (seq_length <= 0) return t;
  return (t % seq_length) * num_sequences + t / seq_length;
}

// Host emulation of a warp's sum of value(e) for e in [0, n): lane l sums e = l, l+32, ... in
// order, then five xor-butterfly steps. Bit-identical to the CUDA WarpSum in router.cu.
template <typename F>
double LaneOrderSum(int64_t n, const F& value) {
  double lane[32] = {0};
  for (int64_t e = 0; e < n; ++e) lane[e & 31] += value(e);
  for (int o = 16; o >= 1; o >>= 1) {
    double next[32];
    for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ o];
    for (int l = 0; l < 32; ++l) lane[l] = next[l];
  }
  return lane[0];
}

// Max of z [e] and the lane-order sum of exp(z - max): the softmax normaliser of one row, as
// RowSoftmaxNorm (router_device.h) computes it on the device. For the CPU references of the
// router and the aux losses.
template <typename Real>
void SoftmaxNorm(const Real* z, int64_t e, double* mx, double* sum) {
  double m = z[0];
  for (int64_t i = 1; i < e; ++i) m = static_cast<double>(z[i]) > m ? z[i] : m;
  *mx = m;
  *sum = LaneOrderSum(e, [&](int64_t i) { return Exp(static_cast<double>(z[i]) - m); });
}

}  // namespace switchyard::kernels::router_math

#endif  // SWITCHYARD_KERNELS_MOE_ROUTER_MATH_H_
