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
//
// Vocabulary-parallel lookup (tensor parallelism, megatron_parallel.md §1.7, Megatron's
// VocabParallelEmbedding): the table is this TP rank's rows [vocab_start, vocab_start + V_l) of a
// vocabulary of vocab_size; a token whose id another rank owns gets a zero row in the forward
// and contributes no gradient in the backward (the caller sums the ranks' rows: all-reduce or
// reduce-scatter over TP). Both ops first map ids to local rows (id − vocab_start, −1 when not
// owned) in a caller-given scratch, then run the plain lookup / backward, whose CUDA paths
// already treat −1 as "zero row / no gradient"; the CPU path masks explicitly and still rejects
// ids outside the WHOLE vocabulary [0, vocab_size).
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

// out[t] = table[ids[t] − vocab_start] for ids in [vocab_start, vocab_start + V_l), else 0.
//   ids [T] i32 (whole-vocabulary ids); table [V_l, H] (this rank's rows); out [T, H];
//   local_ids [T] i32 scratch (overwritten with the local row or −1). The slice must lie inside
//   [0, vocab_size).
absl::Status VocabShardEmbeddingForward(const Stream& stream, const Tensor& ids,
                                        const Tensor& table, int64_t vocab_start,
                                        int64_t vocab_size, const Tensor& local_ids,
                                        const Tensor& out);
// Backward of VocabShardEmbeddingForward: dtable [V_l, H] gets the rows of the ids this rank
// owns, summed in ascending token order (as EmbeddingBackward); the other tokens are skipped.
// workspace as EmbeddingBackward's for (T, V_l).
absl::Status VocabShardEmbeddingBackward(const Stream& stream, const Tensor& ids,
                                         const Tensor& dout, const Tensor& dtable,
                                         int64_t vocab_start, int64_t vocab_size,
                                         const Tensor& local_ids, bool accumulate,
                                         const Tensor& workspace);

namespace internal {
// local[t] = ids[t] − vocab_start if in [0, local_vocab), else −1.
absl::Status LocalVocabIdsCuda(const Stream& stream, const Tensor& ids, int64_t vocab_start,
                               int64_t local_vocab, const Tensor& local_ids);
absl::Status EmbeddingForwardCuda(const Stream& stream, const Tensor& ids, const Tensor& table,
                                  const Tensor& out);
absl::Status EmbeddingBackwardCuda(const Stream& stream, const Tensor& ids, const Tensor& dout,
                                   const Tensor& dtable, bool accumulate, const Tensor& workspace);
}  // namespace internal

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_EMBEDDING_EMBEDDING_H_
