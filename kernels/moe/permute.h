// File: kernels/moe/permute.h
//
// Token permutation for the MoE layer (megatron_moe.md §3.1): gather the k routed copies of each
// token into expert-major order, and the inverse (sum the k copies back), forward and backward.
//
// Representation (shared with the router and the grouped GEMM):
//   x            [T, H]   activations, rows batch-major. f32/f64/bf16 on the CPU; bf16/f32 on CUDA.
//   topk_idx     [T, k]   i32, expert id of each (token, slot); -1 = dropped slot.
//   topk_probs   [T, k]   f32 (f64 allowed on the CPU), router probability of each slot.
//   permuted_x   [max_rows, H], permuted_probs [max_rows]: the rows of expert e start at the
//                exclusive prefix sum of the counts; inside an expert, rows are in ascending
//                token order (Megatron's stable argsort order). `max_rows` is a STATIC capacity:
//                >= T*k (dropless / capacity-dropping) or >= E*C (pad to capacity C).
//   tokens_per_expert [E] i32, on the op's device: the per-expert row counts that drive the
//                grouped GEMM. Nothing is synchronised to the host.
//   row_map      [T, k]   i32, destination row of each (token, slot); -1 for dropped slots.
// Rows at or past the total are unspecified and never read by the ops here, EXCEPT in
// pad-to-capacity mode, where every expert owns rows [e*C, (e+1)*C) and tokens_per_expert[e] == C;
// its padding rows are zero with probability 0. Deliberate difference from Megatron: its padding
// rows are copies of unrouted tokens with probability 0; ours are zero rows (same numerics).
//
// Probabilities are NOT applied here: the experts apply them after the activation (swiglu.h), so
// Unpermute is a plain sum of the k copies.
//
// Determinism: every op here gives bit-identical results run to run (no floating-point atomics;
// slot sums are taken in slot order, in fp32 on CUDA and fp64 on the CPU, then rounded once).
//
// CUDA path: no host synchronisation and no allocation; Permute takes a device workspace of
// PermuteWorkspaceBytes(T, E) bytes. Limits: num_experts <= kMaxExpertsCuda. Any H works: rows
// whose byte size and addresses are multiples of 16 move with 16-byte vectors (8 bf16), others
// with a scalar path. On CUDA, invalid expert ids (< -1 or >= E) are treated as dropped, and in
// pad mode tokens past an expert's capacity are dropped (row_map -1), so nothing writes out of
// bounds; the CPU path reports both as INVALID_ARGUMENT instead (the router never produces them).
#ifndef SWITCHYARD_KERNELS_MOE_PERMUTE_H_
#define SWITCHYARD_KERNELS_MOE_PERMUTE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/tensor.h"

namespace switchyard::kernels {

inline constexpr int64_t kMaxExpertsCuda = 1024;

// Bytes of device workspace Permute needs on CUDA for `num_tokens` tokens and `num_experts`
// experts (0 on the CPU is fine: the CPU path needs none).
int64_t PermuteWorkspaceBytes(int64_t num_tokens, int64_t num_experts);

// counts[e] = number of slots of topk_idx routed to expert e (slots with -1 are not counted).
//   topk_idx [T, k] i32, counts [E] i32, same device.
absl::Status TokensPerExpert(const Stream& stream, const Tensor& topk_idx, int64_t num_experts,
                             const Tensor& counts);

// Gathers the routed copies of x into expert-major order (see the file comment).
//   pad_to_capacity: 0 = off; C > 0 = every expert gets exactly C rows [e*C, (e+1)*C).
//   permuted_x [max_rows, H] (dtype of x), permuted_probs [max_rows] (dtype of topk_probs),
//   row_map [T, k] i32, tokens_per_expert [E] i32.
//   workspace: any dtype, >= PermuteWorkspaceBytes(T, E) bytes on the stream's CUDA device;
//   ignored on the CPU (may be an empty Tensor).
//   max_routed_rows (dropless only): 0 = permuted_x needs T*k rows; > 0 = the caller's bound on
//   the kept (non -1) slots, and permuted_x needs only that many rows (a sparse routing, e.g.
//   ep_routing.h's, keeps far fewer than T*k). A routing that keeps more slots than permuted_x
//   has rows is INVALID_ARGUMENT on the CPU; on CUDA the slots past the last row are dropped
//   (row_map -1), so nothing writes out of bounds.
absl::Status Permute(const Stream& stream, const Tensor& x, const Tensor& topk_idx,
                     const Tensor& topk_probs, int64_t num_experts, int64_t pad_to_capacity,
                     const Tensor& permuted_x, const Tensor& permuted_probs, const Tensor& row_map,
                     const Tensor& tokens_per_expert, const Tensor& workspace,
                     int64_t max_routed_rows = 0);

// Permute without moving x (dropless only), for experts that read x through a row index (the
// gathered grouped GEMM, kernels/gemm/grouped_gemm.h FpropGathered): the same row_map,
// permuted_probs and tokens_per_expert as Permute, plus source_rows [max_rows] i32, the token of
// each permuted row (row_map's inverse): permuted_x[p] would be x[source_rows[p]]. Rows at or past
// the total are not written (the grouped GEMMs never read them). max_rows = source_rows.dim(0) and
// max_routed_rows as in Permute.
absl::Status PermuteIndex(const Stream& stream, const Tensor& topk_idx, const Tensor& topk_probs,
                          int64_t num_experts, const Tensor& permuted_probs, const Tensor& row_map,
                          const Tensor& source_rows, const Tensor& tokens_per_expert,
                          const Tensor& workspace, int64_t max_routed_rows = 0);

// out[t] = sum over the non-dropped slots s of y[row_map[t, s]], in slot order (zeros when every
// slot is dropped). y [max_rows, H], row_map [T, k] i32, out [T, H], y and out of one dtype.
absl::Status Unpermute(const Stream& stream, const Tensor& y, const Tensor& row_map,
                       const Tensor& out);

// Adjoint of Permute: dx[t] = sum of d_permuted_x[row_map[t, s]] over non-dropped slots;
// d_topk_probs[t, s] = d_permuted_probs[row_map[t, s]], 0 for dropped slots.
//   d_permuted_x [max_rows, H], d_permuted_probs [max_rows], row_map [T, k], dx [T, H],
//   d_topk_probs [T, k] (dtype of d_permuted_probs).
absl::Status PermuteBackward(const Stream& stream, const Tensor& d_permuted_x,
                             const Tensor& d_permuted_probs, const Tensor& row_map,
                             const Tensor& dx, const Tensor& d_topk_probs);

// Adjoint of Unpermute: dy[row_map[t, s]] = dout[t] for every non-dropped slot. Rows not in
// row_map are left untouched, unless zero_unmapped_rows, which zeroes them (pass it in
// pad-to-capacity mode, where the experts read the padding rows; it costs one extra memset of dy).
//   dout [T, H], row_map [T, k] i32, dy [max_rows, H] of dout's dtype.
absl::Status UnpermuteBackward(const Stream& stream, const Tensor& dout, const Tensor& row_map,
                               const Tensor& dy, bool zero_unmapped_rows);

namespace internal {

// Tokens per block of the CUDA rank computation; PermuteWorkspaceBytes depends on it.
inline constexpr int64_t kPermuteChunkTokens = 128;

absl::Status TokensPerExpertCpu(const Tensor& topk_idx, int64_t num_experts, const Tensor& counts);
// Permute and PermuteIndex: x and permuted_x with null data (PermuteIndex) move no rows;
// source_rows with null data (Permute) is not written. max_rows: the permuted rows' capacity.
absl::Status PermuteCpu(const Tensor& x, const Tensor& topk_idx, const Tensor& topk_probs,
                        int64_t num_experts, int64_t pad_to_capacity, int64_t max_rows,
                        const Tensor& permuted_x, const Tensor& permuted_probs,
                        const Tensor& row_map, const Tensor& source_rows,
                        const Tensor& tokens_per_expert);
// Shared by Unpermute and PermuteBackward (d_probs/d_topk_probs may be empty Tensors).
absl::Status GatherSumCpu(const Tensor& y, const Tensor& probs, const Tensor& row_map,
                          const Tensor& out, const Tensor& out_probs);
absl::Status ScatterRowsCpu(const Tensor& dout, const Tensor& row_map, const Tensor& dy,
                            bool zero_unmapped_rows);

absl::Status TokensPerExpertCuda(const Stream& stream, const Tensor& topk_idx, int64_t num_experts,
                                 const Tensor& counts);
absl::Status PermuteCuda(const Stream& stream, const Tensor& x, const Tensor& topk_idx,
                         const Tensor& topk_probs, int64_t num_experts, int64_t pad_to_capacity,
                         int64_t max_rows, const Tensor& permuted_x, const Tensor& permuted_probs,
                         const Tensor& row_map, const Tensor& source_rows,
                         const Tensor& tokens_per_expert, const Tensor& workspace);
absl::Status GatherSumCuda(const Stream& stream, const Tensor& y, const Tensor& probs,
                           const Tensor& row_map, const Tensor& out, const Tensor& out_probs);
absl::Status ScatterRowsCuda(const Stream& stream, const Tensor& dout, const Tensor& row_map,
                             const Tensor& dy, bool zero_unmapped_rows);

}  // namespace internal

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_MOE_PERMUTE_H_
