// File: kernels/embedding/embedding.h
//
// Token embedding lookup (Megatron's word embeddings, no position embeddings here) and its
// backward.
//
//   forward:  out[t, :] = table[ids[t], :]
//   backward: dtable[v, :] (+)= sum over t with ids[t] == v of dout[t, :], in ascending t
//
// Dtypes: ids i32. Float tensors are bf16 or f32 on CUDA, f32, f64 or bf16 on the CPU (the CPU
// path computes in fp64 and rounds once on store, so it serves as the reference for bf16 too).
//
// Invalid ids (outside [0, V)) differ by device, deliberately: the CPU path checks every id and
// returns INVALID_ARGUMENT naming the first bad position. The CUDA path cannot check without a
// host synchronisation, so it writes a zero row for an invalid id in the forward and drops that
// token's gradient in the backward (the caller validates ids when it loads data).
//
// Determinism: the CUDA backward uses no float atomics. It counting-sorts the token indices by
// id on the device (histogram, exclusive scan, scatter, then a per-token rank that restores
// ascending token order within each id), then one block per id sums its dout rows in that
// order in fp32, starting from dtable's old value when accumulating. Results are bit-identical
// from run to run and independent of the GPU model. No allocation, no host synchronisation;
// both ops are graph-capturable. Cost of the rank step: sum over ids of count(id)^2 L2-cached
// int reads, spread over T threads (8192 tokens of one id: 67M reads); fine for training
// batches, slow for a huge batch dominated by a single id.
#ifndef SWITCHYARD_KERNELS_EMBEDDING_EMBEDDING_H_
#define SWITCHYARD_KERNELS_EMBEDDING_EMBEDDING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/tensor.h"

namespace switchyard::kernels {

// out = table[ids].
//   ids [T] i32; table [V, H]; out [T, H] of table's dtype. T may be 0. out must not alias
//   table.
absl::Status EmbeddingForward(const Stream& stream, const Tensor& ids, const Tensor& table,
                              const Tensor& out);

// Bytes of CUDA workspace EmbeddingBackward needs for T tokens and vocabulary V:
// 4 * ((V + 1) + V + 2 * T) (offsets, cursors, unsorted and sorted token indices). The CPU path
// needs none.
int64_t EmbeddingBackwardWorkspaceBytes(int64_t num_tokens, int64_t vocab);

// Backward of EmbeddingForward.
//   ids [T] i32 as given to the forward; dout [T, H]; dtable [V, H] f32 or the table's dtype
//   (a gradient buffer). accumulate = true adds this call's contribution (rows of ids that do
//   not occur are left bit-for-bit unchanged); false overwrites dtable (those rows become 0).
//   workspace: any dtype, >= EmbeddingBackwardWorkspaceBytes(T, V) bytes, 4-byte aligned, on the
//   stream's CUDA device; ignored on the CPU (may be an empty Tensor).
absl::Status EmbeddingBackward(const Stream& stream, const Tensor& ids, const Tensor& dout,
                               const Tensor& dtable, bool accumulate, const Tensor& workspace);

namespace internal {
absl::Status EmbeddingForwardCuda(const Stream& stream, const Tensor& ids, const Tensor& table,
                                  const Tensor& out);
absl::Status EmbeddingBackwardCuda(const Stream& stream, const Tensor& ids, const Tensor& dout,
                                   const Tensor& dtable, bool accumulate, const Tensor& workspace);
}  // namespace internal

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_EMBEDDING_EMBEDDING_H_
