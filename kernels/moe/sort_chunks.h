// File: kernels/moe/sort_chunks.h
//
// Local chunk permutation of the alltoall token dispatcher (megatron_moe.md §3.2,
// `sort_chunks_by_idxs`). After the EP all-to-all (and the ETP all-gather), the received rows are
// grouped by source rank, then by local expert: chunk r*L + e holds the rows that source r sent
// to local expert e. SortChunks reorders the chunks so the rows are grouped by local expert, then
// source (chunk r*L + e goes to position e*S + r); the combine path applies the inverse.
//
// Representation:
//   input, output [N, H]  rows, bf16/f32 (f64 too; the op is a byte copy). Same dtype and shape.
//   probs, probs_out [N]  optional per-row router probabilities (f32; f64 on the CPU), permuted
//                         with the rows (Megatron passes probs to sort_chunks_by_idxs in the
//                         alltoall path). Pass empty Tensors for none.
//   split_sizes [C]       i32 ON THE OP'S DEVICE: split_sizes[j] = rows of input chunk j, chunks
//                         contiguous from row 0 in index order (Megatron's
//                         num_global_tokens_per_local_expert.ravel(), never synchronised to the
//                         host). Contract: every size >= 0 and the sum <= N.
//   sorted_order [C]      HOST span of int32, a permutation of [0, C). It is a constant of the
//                         parallel layout (LocalExpertChunkOrder), so it is validated on the host
//                         (a device tensor could not be checked without a host sync) and reaches
//                         the kernels by value, as a kernel parameter: no H2D copy, so the CUDA
//                         path stays graph-capturable with no pinned staging buffer.
//
// SortChunks:   output = concat(input chunk sorted_order[0], input chunk sorted_order[1], ...),
//               exactly torch.cat([torch.split(input, split_sizes)[i] for i in sorted_order]).
// UnsortChunks: the inverse, with the SAME split_sizes and sorted_order as the forward call:
//               UnsortChunks(SortChunks(x)) == x on the first sum(split_sizes) rows. Megatron's
//               combine path instead calls sort_chunks_by_idxs(y, split_sizes transposed to the
//               sorted order, restore order); SortChunks with those arguments gives the same
//               result, but UnsortChunks needs no transposed split sizes on the device.
// Rows at or past sum(split_sizes) of output / probs_out are left untouched.
//
// CUDA path: two kernels, no host synchronisation, no allocation, graph-capturable:
//   1. one block computes the chunk offsets (exclusive scans of split_sizes in the input and the
//      sorted order) into the caller's workspace of SortChunksWorkspaceBytes(C) bytes;
//   2. one warp per output row finds its chunk (binary search over the offsets, kept in shared
//      memory) and copies the row, in 16-byte vectors when the row size and both base addresses
//      allow it, else in the largest unit that does. Probs move in the same kernel.
// On CUDA the contract is enforced by clamping, not reported (no host sync): negative sizes count
// as 0, and rows whose source or destination would be >= N are skipped. The CPU path reports both
// violations as INVALID_ARGUMENT. Limits (both paths): 1 <= C <= kMaxSortChunks, N < 2^31.
// input and output (probs and probs_out) must not overlap.
#ifndef SWITCHYARD_KERNELS_MOE_SORT_CHUNKS_H_
#define SWITCHYARD_KERNELS_MOE_SORT_CHUNKS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tensor.h"

namespace switchyard::kernels {

// Most chunks a sort may have (ETP * EP * num_local_experts = ETP * num_experts); bounded so the
// order fits in a 4 KB kernel parameter block (uint16 entries).
inline constexpr int64_t kMaxSortChunks = 1024;

// Megatron's constant chunk orders for S = ETP * EP sources and L local experts
// (token_dispatcher.py constructor; idx = arange(S * L)):
//   sort    = idx.reshape(-1, L).T.ravel():  sort[e*S + r] = r*L + e      (src, e) -> (e, src)
//   restore = idx.reshape(L, -1).T.ravel():  restore[r*L + e] = e*S + r   (e, src) -> (src, e)
// restore is the inverse permutation of sort. Example S=4, L=2: sort = [0,2,4,6,1,3,5,7],
// restore = [0,4,1,5,2,6,3,7].
struct ChunkOrder {
  std::vector<int32_t> sort;
  std::vector<int32_t> restore;
};
// INVALID_ARGUMENT unless num_sources >= 1, num_local_experts >= 1 and their product fits int32.
absl::StatusOr<ChunkOrder> LocalExpertChunkOrder(int64_t num_sources, int64_t num_local_experts);

// Bytes of CUDA workspace SortChunks / UnsortChunks need for `num_chunks` chunks:
// (2 * num_chunks + 1) int64 offsets. The CPU path needs none.
int64_t SortChunksWorkspaceBytes(int64_t num_chunks);

// See the file comment. workspace: any dtype, >= SortChunksWorkspaceBytes(C) bytes, 8-byte
// aligned, on the stream's CUDA device; ignored on the CPU (may be an empty Tensor). probs and
// probs_out: both empty Tensors, or both [N] of one dtype.
absl::Status SortChunks(const Stream& stream, const Tensor& input, const Tensor& split_sizes,
                        absl::Span<const int32_t> sorted_order, const Tensor& output,
                        const Tensor& probs, const Tensor& probs_out, const Tensor& workspace);

// Inverse of SortChunks for the same split_sizes and sorted_order (see the file comment).
absl::Status UnsortChunks(const Stream& stream, const Tensor& input, const Tensor& split_sizes,
                          absl::Span<const int32_t> sorted_order, const Tensor& output,
                          const Tensor& probs, const Tensor& probs_out, const Tensor& workspace);

namespace internal {

// Validated arguments; `inverse` selects UnsortChunks. probs/probs_out may be empty Tensors.
absl::Status SortChunksCpu(const Tensor& input, const Tensor& split_sizes,
                           absl::Span<const int32_t> sorted_order, bool inverse,
                           const Tensor& output, const Tensor& probs, const Tensor& probs_out);
absl::Status SortChunksCuda(const Stream& stream, const Tensor& input, const Tensor& split_sizes,
                            absl::Span<const int32_t> sorted_order, bool inverse,
                            const Tensor& output, const Tensor& probs, const Tensor& probs_out,
                            const Tensor& workspace);

}  // namespace internal

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_MOE_SORT_CHUNKS_H_
