// File: kernels/moe/rng.h
//
// A counter-based random number generator that gives the same numbers on the host and on the
// device: every value is a pure function of (seed, counter), so a CUDA kernel and the CPU
// reference agree element by element without sharing any state, and a backward pass can
// regenerate the forward's numbers instead of saving them.
//
// The hash is SplitMix64's finaliser applied twice (Steele, Lea, Flood, "Fast splittable
// pseudorandom number generators", OOPSLA 2014); it passes BigCrush on sequential counters.
// Floating-point results use only exactly-rounded operations (an explicit fused multiply-add), so
// host and device produce identical bits whatever the compilers' contraction settings.
#ifndef SWITCHYARD_KERNELS_MOE_RNG_H_
#define SWITCHYARD_KERNELS_MOE_RNG_H_

#include <cmath>
#include <cstdint>

#ifndef SY_HOST_DEVICE
#if defined(__CUDACC__)
#define SY_HOST_DEVICE __host__ __device__
#else
#define SY_HOST_DEVICE
#endif
#endif

namespace switchyard::kernels {

// SplitMix64 finaliser: a bijective 64-bit mixer.
SY_HOST_DEVICE inline uint64_t Mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// 64 random bits for element `counter` of the stream named `seed`.
SY_HOST_DEVICE inline uint64_t CounterHash(uint64_t seed, uint64_t counter) {
  return Mix64(counter ^ Mix64(seed));
}

// A float uniform in [0, 1) with 24 random bits (every value is a multiple of 2^-24).
SY_HOST_DEVICE inline float UniformFloat(uint64_t seed, uint64_t counter) {
  return static_cast<float>(CounterHash(seed, counter) >> 40) * 5.9604644775390625e-8f;
}

// Input-jitter multiplier u ~ U(1 - eps, 1 + eps) for element `counter`, computed as one
// correctly rounded fma(2*eps, U, 1 - eps) in fp32 (identical on host and device).
SY_HOST_DEVICE inline float JitterMultiplier(float eps, uint64_t seed, uint64_t counter) {
  const float u01 = UniformFloat(seed, counter);
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(2.0f * eps, u01, 1.0f - eps);
#else
  return std::fma(2.0f * eps, u01, 1.0f - eps);
#endif
}

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_MOE_RNG_H_
