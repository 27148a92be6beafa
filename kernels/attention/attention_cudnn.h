// File: kernels/attention/attention_cudnn.h
//
// Internal: causal GQA attention through cuDNN's fused flash attention (the cuDNN frontend's
// graph API, `Graph::sdpa` / `Graph::sdpa_backward`), for bf16 CUDA tensors in attention.h's
// layout. Same contract as AttentionForward / AttentionBackward (shapes already validated by the
// caller), with these differences:
//   - `delta` is not used (cuDNN computes rowsum(dO * O) in its own workspace);
//   - the backward pass is bitwise deterministic only with `deterministic` (cuDNN's
//     deterministic dQ algorithm); otherwise dQ is accumulated with floating-point atomics;
//   - the first call for a shape (B, S, Hq, Hkv, D, scale) on a thread builds and caches the
//     cuDNN execution plan (about a second: cuDNN compiles the kernel) and allocates its
//     workspace once with cudaMalloc; later calls allocate nothing and never synchronise.
// lse is the natural-log logsumexp of the scaled logits, as on the other paths (cuDNN's "Stats"
// output), so a cuDNN forward and a native backward (or the reverse) combine.
//
// libcudnn is not linked: the frontend is compiled in its dynamic-loading mode and the library
// is dlopen'ed on first use from $SWITCHYARD_CUDNN_LIBRARY when set, else "libcudnn.so.9" from
// the loader's search path (a cuDNN 9 install, or the nvidia-cudnn-cu13 wheel's lib folder on
// LD_LIBRARY_PATH). When it cannot be loaded, or cuDNN does not support a shape, these calls
// return FAILED_PRECONDITION without touching any output, and attention.cc falls back to the
// native kernels (attention_tc.cu) unless the cuDNN backend was requested explicitly.
#ifndef SWITCHYARD_KERNELS_ATTENTION_ATTENTION_CUDNN_H_
#define SWITCHYARD_KERNELS_ATTENTION_ATTENTION_CUDNN_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tensor.h"

namespace switchyard::kernels::internal {

// Loads libcudnn once per process; returns a description ("cuDNN 91900 from libcudnn.so.9") or
// FAILED_PRECONDITION saying what was tried and why it failed. Needs no GPU.
absl::StatusOr<std::string> LoadCudnn();

// kv_seq_len >= seq_len: keys per sequence; kv_seq_len > seq_len runs cuDNN's bottom-right
// causal mask (context parallelism; attention.h "Bottom-right causal mode").
absl::Status AttentionForwardCudnn(const Stream& stream, const Tensor& q, const Tensor& k,
                                   const Tensor& v, int64_t seq_len, int64_t kv_seq_len,
                                   float scale, const Tensor& o, const Tensor& lse);

absl::Status AttentionBackwardCudnn(const Stream& stream, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& o, const Tensor& lse,
                                    const Tensor& d_o, int64_t seq_len, int64_t kv_seq_len,
                                    float scale, bool deterministic, const Tensor& dq,
                                    const Tensor& dk, const Tensor& dv);

}  // namespace switchyard::kernels::internal

#endif  // SWITCHYARD_KERNELS_ATTENTION_ATTENTION_CUDNN_H_
