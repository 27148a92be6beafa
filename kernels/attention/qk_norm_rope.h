// File: kernels/attention/qk_norm_rope.h
//
// QK-norm followed by RoPE for q and k in one op (Qwen3 / OLMo-style `qk_layernorm`, Megatron's
// q_layernorm / k_layernorm before the rotary embedding): for each side s in {q, k}
//
//   out_s = RoPE(RMSNorm(pre_s) * w_s)          per head row of D, rstd_s saved per row
//
// and the backward that turns the gradient of out_s into the gradient of pre_s and adds dw_s.
// The semantics are exactly those of the two ops in sequence (kernels/norm/rmsnorm.h, then
// rope.h, the intermediate rounded to the activation dtype), which is what the CPU path runs.
// On CUDA one kernel does both sides and both steps per token: it reads pre once and writes out
// once (the composition reads and writes every row twice, in four launches) and computes each
// token's cos/sin once for all of its q and k heads; the backward likewise, with the dw partial
// sums of both sides. Each row is held by D / V lanes (V = 16 bytes of elements) and the row's
// sums run as an xor butterfly over them, which gives the bits of the warp-per-row norm kernels;
// the rotation and the norm arithmetic are the shared device helpers (rope_device.cuh,
// rmsnorm_device.cuh). So out, rstd and the gradient of pre are bit-identical to the composed
// CUDA path; dw sums the same products in another order (deterministic: the grid depends on T
// only). Shapes the fused kernels do not take (D / V not a power of two in [2, 32], unaligned
// pointers) run the composed path on CUDA too.
//
// Dtypes and limits: those of RmsNormForward/Backward and RopeForward/Backward; q and k share the
// activation dtype and D; rstd f32 (f64 also on the CPU); T·heads < 2^31 on CUDA.
#ifndef SWITCHYARD_KERNELS_ATTENTION_QK_NORM_ROPE_H_
#define SWITCHYARD_KERNELS_ATTENTION_QK_NORM_ROPE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/tensor.h"
#include "kernels/attention/rope.h"

namespace switchyard::kernels {

// One side (q or k) of the forward.
struct QkNormRopeSide {
  Tensor pre;   // [T, heads, D]: the projection's output, the norm's input (kept for the backward)
  Tensor w;     // [D]: the q_norm / k_norm weight, dtype of pre
  Tensor out;   // [T, heads, D]: RoPE(RMSNorm(pre) * w); may alias pre
  Tensor rstd;  // [T * heads]: 1 / rms of each head row
};

// Both sides' out and rstd. eps > 0; seq_len, rotary_base and cp as in RopeForward.
absl::Status QkNormRopeForward(const Stream& stream, const QkNormRopeSide& q,
                               const QkNormRopeSide& k, float eps, int64_t seq_len,
                               float rotary_base, RopeCp cp = {});

// One side of the backward.
struct QkNormRopeGradSide {
  Tensor pre;  // [T, heads, D], w [D], rstd [T * heads]: as given to / saved by the forward
  Tensor w;
  Tensor rstd;
  Tensor grad;  // [T, heads, D]: in, the gradient of out; overwritten with the gradient of pre
  Tensor dw;    // [D] f32 or the dtype of w: dw += this call's contribution; q's and k's distinct
};

// Bytes of CUDA workspace QkNormRopeBackward needs for T tokens of hq q heads and hkv k heads of
// dim D (the CPU needs none).
int64_t QkNormRopeBackwardWorkspaceBytes(int64_t num_tokens, int64_t q_heads, int64_t kv_heads,
                                         int64_t head_dim);

absl::Status QkNormRopeBackward(const Stream& stream, const QkNormRopeGradSide& q,
                                const QkNormRopeGradSide& k, int64_t seq_len, float rotary_base,
                                const Tensor& workspace, RopeCp cp = {});

namespace internal {

// Blocks of the fused CUDA backward (a function of T only): min(T, 1024), at least 1. Its
// workspace holds 2 · blocks · D f32 partial sums.
int64_t QkNormRopeBackwardBlocks(int64_t num_tokens);

// Whether the fused CUDA kernels take these tensors (otherwise the composed path runs).
bool QkNormRopeFusable(const Tensor& q, const Tensor& k,
                       std::initializer_list<const void*> pointers);

absl::Status QkNormRopeForwardCuda(const Stream& stream, const QkNormRopeSide& q,
                                   const QkNormRopeSide& k, float eps, int64_t seq_len,
                                   float rotary_base, RopeCp cp);
absl::Status QkNormRopeBackwardCuda(const Stream& stream, const QkNormRopeGradSide& q,
                                    const QkNormRopeGradSide& k, int64_t seq_len, float rotary_base,
                                    const Tensor& workspace, RopeCp cp);

}  // namespace internal

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_ATTENTION_QK_NORM_ROPE_H_
