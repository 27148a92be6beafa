// File: kernels/attention/attention.h
//
// Causal self-attention with grouped-query attention (GQA), forward and backward, computed with
// the flash-attention algorithm: the S x S score matrix is never materialised on CUDA. Forward
// runs an online softmax over key tiles and saves only the per-row logsumexp; backward recomputes
// the probabilities tile by tile from it, with delta = rowsum(dO * O) precomputed.
//
// Layout (rows are tokens, batch-major: sequence b owns rows [b * S, (b + 1) * S)):
//   q, o, dO, dq   [T, Hq, D]     T = B * S
//   k, v, dk, dv   [T, Hkv, D]    Hq % Hkv == 0; query head h reads kv head h / (Hq / Hkv)
//   lse, delta     [B, Hq, S]     lse[b, h, i] = log sum_{j <= i} exp(scale * q_i . k_j)
// Attention of row i of a sequence covers keys j <= i of the same sequence (causal), with
// logits scale * q_i . k_j (scale is usually 1 / sqrt(D)).
//
// Dtypes: activations (q, k, v, o, dO, dq, dk, dv) share one dtype: bf16 or f32 (f64 too on the
// CPU); lse and delta are f32 (f64 allowed on the CPU). CUDA needs D in {64, 128}.
// All tensors of one call live on the stream's device. No allocation, no host synchronisation.
// Deterministic: dk and dv are summed over the query heads of a group in a fixed order, no
// floating-point atomics. Outputs must not alias inputs.
//
// CPU path: a straightforward fp64 reference (it materialises one score row at a time); its
// backward recomputes the softmax from q and k and ignores the values of o and lse.
// CUDA path: bf16 runs FlashAttention-2 style kernels on tensor cores (mma.sync m16n8k16 with
// fp32 accumulation, ldmatrix, cp.async double buffering; attention_tc.cu): forward with an
// online softmax in registers, backward as a dk/dv kernel per key tile (looping over the group's
// query heads) and a dq kernel per query tile, both recomputing P from lse. P and dS are rounded
// to bf16 before their products, as in FlashAttention. f32 (and bf16 tensors that are not 16-byte
// aligned) runs simple tiled kernels with fp32 math on CUDA cores: correct but slow.
//
// Why our own kernels and not cuDNN's fused attention (the alternative): cuDNN's runtime
// (libcudnn plus its engine libraries, hundreds of MB) cannot travel in the 64 MiB GPU bundle and
// the GPU hosts have no system cuDNN (only PyTorch's private copy); our kernels also keep the
// deterministic, atomic-free backward this header promises and exactly the CPU reference's
// semantics. Measured (bench/README.md): ~180-200 TFLOP/s forward, ~125-150 backward on an H200.
#ifndef SWITCHYARD_KERNELS_ATTENTION_ATTENTION_H_
#define SWITCHYARD_KERNELS_ATTENTION_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/tensor.h"

namespace switchyard::kernels {

// o = softmax(scale * q k^T + causal mask) v per (sequence, query head); also writes lse.
absl::Status AttentionForward(const Stream& stream, const Tensor& q, const Tensor& k,
                              const Tensor& v, int64_t seq_len, float scale, const Tensor& o,
                              const Tensor& lse);

// Gradients of AttentionForward given d_o = dLoss/do. `o` and `lse` are the forward's outputs;
// `delta` [B, Hq, S] (f32) is scratch the call overwrites with rowsum(d_o * o). dq, dk, dv are
// overwritten (not accumulated); dk and dv hold the sum over the query heads of each group.
absl::Status AttentionBackward(const Stream& stream, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& o, const Tensor& lse,
                               const Tensor& d_o, int64_t seq_len, float scale, const Tensor& delta,
                               const Tensor& dq, const Tensor& dk, const Tensor& dv);

namespace internal {
absl::Status AttentionForwardCuda(const Stream& stream, const Tensor& q, const Tensor& k,
                                  const Tensor& v, int64_t seq_len, float scale, const Tensor& o,
                                  const Tensor& lse);
absl::Status AttentionBackwardCuda(const Stream& stream, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const Tensor& o, const Tensor& lse,
                                   const Tensor& d_o, int64_t seq_len, float scale,
                                   const Tensor& delta, const Tensor& dq, const Tensor& dk,
                                   const Tensor& dv);
}  // namespace internal

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_ATTENTION_ATTENTION_H_
