// File: kernels/moe/swiglu.h
//
// Weighted SwiGLU of the MoE experts (megatron_moe.md §4). With h = [gate | lin] along the last
// dimension (gate = h[:, :F], lin = h[:, F:]) and p the router probability of the row:
//   a = silu(gate) * lin * p                    silu(g) = g * sigmoid(g)
// The probability is applied AFTER the activation (Megatron >= v0.13), so the combine is a plain
// sum. Backward is Megatron's weighted_swiglu_back:
//   dprobs[r] = sum_j da[r, j] * swiglu(h[r])_j
//   dgate     = da * p * lin * sigmoid(g) * (1 + g * (1 - sigmoid(g)))
//   dlin      = da * p * silu(g)
// The unweighted variant (the shared expert) passes an empty `probs` (p = 1).
//
// Shapes and dtypes: h [N, 2F], a / da [N, F], dh [N, 2F], all one activation dtype (bf16 or f32
// on CUDA; f32, f64 or bf16 on the CPU). probs, dprobs: [N] f32 (f64 also on the CPU), or empty.
// Math runs in fp32 on CUDA (fp64 on the CPU) and is rounded once to the output dtype; dprobs is
// reduced in a fixed order (deterministic).
//
// Valid rows: `row_counts` is an i32 tensor on the op's device (e.g. tokens_per_expert [E], or a
// one-element total) whose sum is the number of valid leading rows; it is read on the device, so
// no host synchronisation is needed. Only rows [0, min(sum, N)) are read or written: rows past it
// may hold garbage (even NaN) at no cost and their outputs are left untouched. An empty
// `row_counts` means all N rows. The CPU path rejects negative counts and sums above N; the CUDA
// path clamps them (counts below 0 count as 0, the sum is capped at N).
// CUDA: rows of 8 bf16 / 4 f32 (F a multiple of that, 16-byte aligned bases) use 16-byte vector
// loads and stores; any other F uses a scalar path. No allocation, no host synchronisation.
#ifndef SWITCHYARD_KERNELS_MOE_SWIGLU_H_
#define SWITCHYARD_KERNELS_MOE_SWIGLU_H_

#include "absl/status/status.h"
#include "common/tensor.h"

namespace switchyard::kernels {

// a = silu(h[:, :F]) * h[:, F:] * probs (probs empty: unweighted), on the valid rows.
absl::Status SwigluForward(const Stream& stream, const Tensor& h, const Tensor& probs,
                           const Tensor& row_counts, const Tensor& a);

// dh (and dprobs, when given) from da, h and probs, on the valid rows. dprobs must be empty when
// probs is; it may be empty when probs is given (no probability gradient wanted).
absl::Status SwigluBackward(const Stream& stream, const Tensor& da, const Tensor& h,
                            const Tensor& probs, const Tensor& row_counts, const Tensor& dh,
                            const Tensor& dprobs);

namespace internal {
absl::Status SwigluForwardCpu(const Tensor& h, const Tensor& probs, const Tensor& row_counts,
                              const Tensor& a);
absl::Status SwigluBackwardCpu(const Tensor& da, const Tensor& h, const Tensor& probs,
                               const Tensor& row_counts, const Tensor& dh, const Tensor& dprobs);
absl::Status SwigluForwardCuda(const Stream& stream, const Tensor& h, const Tensor& probs,
                               const Tensor& row_counts, const Tensor& a);
absl::Status SwigluBackwardCuda(const Stream& stream, const Tensor& da, const Tensor& h,
                                const Tensor& probs, const Tensor& row_counts, const Tensor& dh,
                                const Tensor& dprobs);
}  // namespace internal

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_MOE_SWIGLU_H_
