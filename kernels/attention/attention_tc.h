// File: kernels/attention/attention_tc.h
//
// Internal: the bf16 tensor-core (mma.sync m16n8k16) CUDA kernels of causal GQA attention, called
// by attention.cu for bf16 tensors. Same contract as AttentionForward / AttentionBackward in
// attention.h (shapes and dtypes already validated there); additionally requires every data
// pointer to be 16-byte aligned and seq_len < 2^30 (AttentionTcApplies says whether they are).
#ifndef SWITCHYARD_KERNELS_ATTENTION_ATTENTION_TC_H_
#define SWITCHYARD_KERNELS_ATTENTION_ATTENTION_TC_H_

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "common/tensor.h"

namespace switchyard::kernels::internal {

// True when the tensor-core kernels can run these activation tensors (q, k, v, o, ...): all bf16
// with 16-byte aligned data pointers, and seq_len < 2^30. D in {64, 128} is checked by the caller.
bool AttentionTcApplies(int64_t seq_len, std::initializer_list<const Tensor*> tensors);

absl::Status AttentionForwardTc(const Stream& stream, const Tensor& q, const Tensor& k,
                                const Tensor& v, int64_t seq_len, float scale, const Tensor& o,
                                const Tensor& lse);

absl::Status AttentionBackwardTc(const Stream& stream, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& o, const Tensor& lse,
                                 const Tensor& d_o, int64_t seq_len, float scale,
                                 const Tensor& delta, const Tensor& dq, const Tensor& dk,
                                 const Tensor& dv);

// Which bf16 backward AttentionBackwardTc runs (all share the delta kernel, are deterministic
// with a fixed summation order and no atomics; measured bit-identical on an H200):
//   1 (v1): dK/dV blocks of 128 keys, each warp 16 keys x the whole head dimension, 32 queries
//           per step at D = 128; dQ blocks of 128 query rows. One block per SM.
//   2 (v2): dK/dV blocks of 64 keys, 64 queries per step, P^T and dS^T exchanged through shared
//           memory so each warp accumulates half of the head dimension (two blocks per SM); v1 dQ.
// Chosen by the environment variable SWITCHYARD_ATTN_BWD ("v2" -> 2, anything else or unset -> 1),
// read once per process, unless SetAttentionBackwardVariantForTest forced one.
int AttentionBackwardVariant();

// Test and benchmark hook: 1 or 2 forces that variant for every later call in the process; 0
// (or any other value) returns to the environment variable. An atomic store, not synchronised
// with calls already in flight on other threads.
void SetAttentionBackwardVariantForTest(int variant);

}  // namespace switchyard::kernels::internal

#endif  // SWITCHYARD_KERNELS_ATTENTION_ATTENTION_TC_H_
