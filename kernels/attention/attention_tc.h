// File: kernels/attention/attention_tc.h
//
// Internal: the bf16 tensor-core (mma.sync m16n8k16) CUDA kernels of causal GQA attention, called
// by attention.cu for bf16 tensors. Same contract as AttentionForward / AttentionBackward in
// attention.h (shapes and dtypes already validated there); additionally requires every data
// pointer to be 16-byte aligned and kv_seq_len < 2^30 (AttentionTcApplies says whether they are).
// kv_seq_len >= seq_len keys per sequence with the bottom-right causal mask (attention.h);
// kv_seq_len == seq_len is the square causal mask.
#ifndef SWITCHYARD_KERNELS_ATTENTION_ATTENTION_TC_H_
#define SWITCHYARD_KERNELS_ATTENTION_ATTENTION_TC_H_

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "common/tensor.h"

namespace switchyard::kernels::internal {

// True when the tensor-core kernels can run these activation tensors (q, k, v, o, ...): all bf16
// with 16-byte aligned data pointers, and seq_len <= kv_seq_len < 2^30. D in {64, 128} is checked
// by the caller.
bool AttentionTcApplies(int64_t seq_len, int64_t kv_seq_len,
                        std::initializer_list<const Tensor*> tensors);

absl::Status AttentionForwardTc(const Stream& stream, const Tensor& q, const Tensor& k,
                                const Tensor& v, int64_t seq_len, int64_t kv_seq_len, float scale,
                                const Tensor& o, const Tensor& lse);

absl::Status AttentionBackwardTc(const Stream& stream, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& o, const Tensor& lse,
                                 const Tensor& d_o, int64_t seq_len, int64_t kv_seq_len,
                                 float scale, const Tensor& delta, const Tensor& dq,
                                 const Tensor& dk, const Tensor& dv);

}  // namespace switchyard::kernels::internal

#endif  // SWITCHYARD_KERNELS_ATTENTION_ATTENTION_TC_H_
