// File: kernels/attention/rope.h
//
// Rotary position embedding (RoPE) as in Llama / Mixtral / Qwen3, HF "rotate_half" convention:
// for head dim D and i < D/2, the pair (x[i], x[i + D/2]) of every head of row t is rotated by
// the angle theta(t, i) = pos(t) * base^(-2i/D), pos(t) = t % seq_len (batch-major rows), or
// under context parallelism the token's position in the whole sequence (RopeCp below):
//
//   out[i]       = x[i] * cos(theta) - x[i + D/2] * sin(theta)
//   out[i + D/2] = x[i + D/2] * cos(theta) + x[i] * sin(theta)
//
// The backward is the transpose: the rotation by -theta.
//
// Angles, computed identically on the CPU and the GPU (the formula both paths use, see
// RopeInvFreq / RopeAngle below):
//   inv_freq[i] = float(1.0 / pow(double(base), double(2 * i) / double(D)))   (on the host, fp64)
//   theta       = float(pos) * inv_freq[i]                                     (one fp32 multiply)
//   c, s        = cos(double(theta)), sin(double(theta))       (fp64, rounded to fp32 except on
//                                                               the CPU's f64 path)
// HF computes inv_freq and theta in fp32 the same way (up to the fp32 pow) but then rounds cos/sin
// to the activation dtype and rotates in it; we rotate in fp32 and round once (deliberate).
// Like HF, theta is an fp32 number: for large positions it carries fp32 rounding (ulp(4096) ~ 5e-4
// rad); CPU and GPU share it, so they agree.
//
// Dtypes: x and out share one dtype: bf16 or f32 on CUDA; f32, f64 or bf16 on the CPU. Layout
// [T, heads, D] dense row-major (q or k, not a fused QKV slice). out may alias x (in place).
// Limits: D even, 2 <= D <= kMaxRopeHeadDim; 1 <= seq_len·cp.size <= 2^24 (positions exact in
// fp32); base > 0; with cp.size > 1: seq_len even and 0 <= cp.rank < cp.size. CUDA: no allocation,
// no host synchronisation; 16-byte vectors when D/2 is a multiple of 16 bytes' worth of elements
// and the pointers are 16-byte aligned.
#ifndef SWITCHYARD_KERNELS_ATTENTION_ROPE_H_
#define SWITCHYARD_KERNELS_ATTENTION_ROPE_H_

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace switchyard::kernels {

inline constexpr int64_t kMaxRopeHeadDim = 512;
inline constexpr int64_t kMaxRopeSeqLen = int64_t{1} << 24;

// Context parallelism (megatron_parallel.md §2.1-2.2): each sequence of S = seq_len · size tokens
// is cut into 2·size chunks of c = seq_len / 2 tokens and CP rank r holds chunks r and
// 2·size − 1 − r, in that order, as its local sequence of seq_len tokens. RoPE must rotate a
// local token by its position in the WHOLE sequence (as Megatron's get_pos_emb_on_this_cp_rank
// slices the global table), so that q·k of two tokens on different ranks sees their true
// distance. size 1 (the default) is plain RoPE. seq_len must be even when size > 1.
struct RopeCp {
  int64_t size = 1;
  int64_t rank = 0;
};

// The global chunk (of 2·cp_size) that CP rank cp_rank holds as its local chunk j (0 or 1).
// One definition shared by the kernels, the model's K/V gather and the MoE jitter offsets.
#if defined(__CUDACC__)
__host__ __device__
#endif
    inline int64_t
    CpChunkId(int64_t j, int64_t cp_size, int64_t cp_rank) {
  return j == 0 ? cp_rank : 2 * cp_size - 1 - cp_rank;
}

// Global position of local token i (0 <= i < local_len) of a CP rank's sequence (see RopeCp).
// One definition shared by the kernels, the model and the trainer's batch slicing.
#if defined(__CUDACC__)
__host__ __device__
#endif
    inline int64_t
    CpGlobalPosition(int64_t i, int64_t local_len, int64_t cp_size, int64_t cp_rank) {
  if (cp_size <= 1) return i;
  const int64_t c = local_len / 2;
  return CpChunkId(i < c ? 0 : 1, cp_size, cp_rank) * c + (i < c ? i : i - c);
}

// out = RoPE(x): rotates every (i, i + D/2) pair by +theta. x, out [T, heads, D]. seq_len is
// the LOCAL sequence length (rows per sequence in x); `cp` places them in the whole sequence.
absl::Status RopeForward(const Stream& stream, const Tensor& x, int64_t seq_len, float rotary_base,
                         const Tensor& out, RopeCp cp = {});

// dx = RoPE^T(dout): rotates every pair by -theta. dout, dx [T, heads, D]; dx may alias dout.
absl::Status RopeBackward(const Stream& stream, const Tensor& dout, int64_t seq_len,
                          float rotary_base, const Tensor& dx, RopeCp cp = {});

namespace internal {

// inv_freq[i] for i < D/2 (host, fp64 then rounded to fp32). inv_freq has D/2 entries.
inline void RopeInvFreq(int64_t head_dim, float rotary_base, float* inv_freq) {
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    inv_freq[i] = static_cast<float>(
        1.0 / std::pow(static_cast<double>(rotary_base),
                       static_cast<double>(2 * i) / static_cast<double>(head_dim)));
  }
}

// theta for row t's position (one fp32 multiply; shared by host and device code).
#if defined(__CUDACC__)
__host__ __device__
#endif
    inline float
    RopeAngle(int64_t t, int64_t seq_len, RopeCp cp, float inv_freq) {
  const float pos = static_cast<float>(CpGlobalPosition(t % seq_len, seq_len, cp.size, cp.rank));
#if defined(__CUDA_ARCH__)
  return __fmul_rn(pos, inv_freq);
#else
  return pos * inv_freq;
#endif
}

// The checks of RoPE's scalar parameters (head dim, seq_len, CP placement, base), shared with the
// fused QK-norm + RoPE (qk_norm_rope.h); `op` names the caller in the message.
absl::Status CheckRopeParams(absl::string_view op, int64_t head_dim, int64_t seq_len,
                             float rotary_base, RopeCp cp);

// Runs the rotation on CUDA; sign = +1 (forward) or -1 (backward).
absl::Status RopeCuda(const Stream& stream, const Tensor& x, int64_t seq_len, float rotary_base,
                      float sign, const Tensor& out, RopeCp cp);

}  // namespace internal

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_ATTENTION_ROPE_H_
