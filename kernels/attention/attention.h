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
// Bottom-right causal mode (the overloads with kv_seq_len; context parallelism's all-gather
// attention, megatron_parallel.md §2.6): each sequence has S query rows and Skv >= S key rows,
// k, v, dk, dv are [B * Skv, Hkv, D], lse and delta stay [B, Hq, S], and query row i sees keys
// j <= i + (Skv - S): the diagonal is aligned to the bottom-right corner, so the queries are the
// LAST S positions of a Skv-long prefix (a CP chunk attending to the K/V prefix that ends at its
// own end). Skv == S is the square causal mask above. Every path runs it: the CPU reference,
// cuDNN (its bottom-right causal mask; bf16, backend auto or cudnn) and both native CUDA kernel
// families (tensor-core and SIMT: the key tiles of a query tile end at its last row + Skv - S,
// the query tiles of a key tile start at row key - (Skv - S)). The CUDA paths of this mode are
// compiled but have not yet run on a GPU; attention_gpu_test checks them against the CPU.
//
// Dtypes: activations (q, k, v, o, dO, dq, dk, dv) share one dtype: bf16 or f32 (f64 too on the
// CPU); lse and delta are f32 (f64 allowed on the CPU). CUDA needs D in {64, 128}.
// All tensors of one call live on the stream's device. No allocation, no host synchronisation.
// Native kernels: dk and dv are summed over the query heads of a group in a fixed order, no
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
// Two CUDA backends for bf16 (AttentionBackend below):
//   cuDNN: cuDNN 9's fused flash attention through the frontend graph API of the pinned
//          nvidia-cudnn-frontend package (attention_cudnn.h). libcudnn is loaded at run time, so
//          a host without cuDNN still runs (on the native kernels). Measured on an H200 at the
//          benchmark model's shape: ~500 TFLOP/s forward, ~430 backward (bench/README.md).
//   native: our own FlashAttention-2-style mma.sync kernels (attention_tc.cu), ~180-200 TFLOP/s
//          forward, ~125-150 backward; they need nothing beyond the CUDA runtime.
// Why cuDNN first: on Hopper its kernels use wgmma/TMA and run 2.5-3.4x faster than ours, and
// attention is the largest item of a training step at sequence 4096 (bench/README.md). Why the
// native kernels stay: hosts without cuDNN, f32, and a reference that is ours.
// Both write the same lse (natural-log logsumexp of the scaled logits), so a forward on one
// backend and a backward on the other agree. `delta` is scratch: the native backward writes
// rowsum(dO * O) there, the cuDNN backward leaves it untouched (its contents are unspecified).
// Determinism: the native backward is always bitwise deterministic; the cuDNN backward is when
// AttentionSettings::deterministic is set (cuDNN's deterministic dQ algorithm), else it
// accumulates dQ with atomics.
#ifndef SWITCHYARD_KERNELS_ATTENTION_ATTENTION_H_
#define SWITCHYARD_KERNELS_ATTENTION_ATTENTION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace switchyard::kernels {

// Which implementation runs bf16 attention on CUDA (the CPU always runs the fp64 reference):
//   kAuto:   cuDNN when libcudnn loads and supports the shape, else the native kernels;
//   kCudnn:  cuDNN only; FAILED_PRECONDITION (naming the reason) when it cannot run;
//   kNative: the native kernels.
enum class AttentionBackend { kAuto, kCudnn, kNative };

struct AttentionSettings {
  AttentionBackend backend = AttentionBackend::kAuto;
  // cuDNN backward: deterministic dQ algorithm (the native backward always is deterministic).
  // Off by default, as in Megatron-Core / TransformerEngine (NVTE_ALLOW_NONDETERMINISTIC_ALGO=1):
  // the deterministic algorithm costs ~10 % of the attention backward on an H200
  // (bench/README.md); set it for bitwise-reproducible GPU runs.
  bool deterministic = false;
};

// Process-wide settings. Initially read from the environment: SWITCHYARD_ATTENTION_BACKEND
// (auto | cudnn | native; default auto) and SWITCHYARD_ATTENTION_DETERMINISTIC (1 | 0; default
// 0). An invalid value makes every CUDA attention call fail with INVALID_ARGUMENT naming the
// variable and the allowed values. SetAttentionSettings overrides both (tests, benchmarks).
absl::StatusOr<AttentionSettings> GetAttentionSettings();
// Reads the two variables now (GetAttentionSettings reads them once, at its first call).
absl::StatusOr<AttentionSettings> AttentionSettingsFromEnvironment();
void SetAttentionSettings(const AttentionSettings& settings);
// A job's settings: `from_spec` (model.attention_backend, training.deterministic_mode), except
// that each of the two variables above that is set (non-empty) overrides its field. One line per
// variable that overrides the spec is appended to `overrides` (for the log), e.g.
// "SWITCHYARD_ATTENTION_BACKEND=native overrides model.attention_backend \"auto\"".
// INVALID_ARGUMENT naming the variable for a malformed value. Does not change the process-wide
// settings (the caller passes the result to SetAttentionSettings).
absl::StatusOr<AttentionSettings> ResolveAttentionSettings(const AttentionSettings& from_spec,
                                                           std::vector<std::string>* overrides);
absl::StatusOr<AttentionBackend> ParseAttentionBackend(absl::string_view name);
const char* AttentionBackendName(AttentionBackend backend);

// One line for logs: the settings and whether cuDNN loaded, e.g.
// "auto, deterministic (cuDNN 91900 from libcudnn.so.9)" or "auto (native: cuDNN is not
// available: dlopen(libcudnn.so.9) failed: ...)". Needs no GPU.
std::string DescribeAttentionBackend();

// o = softmax(scale * q k^T + causal mask) v per (sequence, query head); also writes lse.
absl::Status AttentionForward(const Stream& stream, const Tensor& q, const Tensor& k,
                              const Tensor& v, int64_t seq_len, float scale, const Tensor& o,
                              const Tensor& lse);
// Bottom-right causal mode (see the file comment): kv_seq_len >= seq_len keys per sequence.
absl::Status AttentionForward(const Stream& stream, const Tensor& q, const Tensor& k,
                              const Tensor& v, int64_t seq_len, int64_t kv_seq_len, float scale,
                              const Tensor& o, const Tensor& lse);

// Gradients of AttentionForward given d_o = dLoss/do. `o` and `lse` are the forward's outputs;
// `delta` [B, Hq, S] (f32) is scratch (the CPU and native paths leave rowsum(d_o * o) there; the
// cuDNN path does not touch it). dq, dk, dv are
// overwritten (not accumulated); dk and dv hold the sum over the query heads of each group.
absl::Status AttentionBackward(const Stream& stream, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& o, const Tensor& lse,
                               const Tensor& d_o, int64_t seq_len, float scale, const Tensor& delta,
                               const Tensor& dq, const Tensor& dk, const Tensor& dv);
// Bottom-right causal mode: dk, dv [B * kv_seq_len, Hkv, D] (keys no query sees get 0).
absl::Status AttentionBackward(const Stream& stream, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& o, const Tensor& lse,
                               const Tensor& d_o, int64_t seq_len, int64_t kv_seq_len, float scale,
                               const Tensor& delta, const Tensor& dq, const Tensor& dk,
                               const Tensor& dv);

namespace internal {
// The native kernels (validated arguments); kv_seq_len == seq_len is the square causal mask.
absl::Status AttentionForwardCuda(const Stream& stream, const Tensor& q, const Tensor& k,
                                  const Tensor& v, int64_t seq_len, int64_t kv_seq_len, float scale,
                                  const Tensor& o, const Tensor& lse);
absl::Status AttentionBackwardCuda(const Stream& stream, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const Tensor& o, const Tensor& lse,
                                   const Tensor& d_o, int64_t seq_len, int64_t kv_seq_len,
                                   float scale, const Tensor& delta, const Tensor& dq,
                                   const Tensor& dk, const Tensor& dv);
}  // namespace internal

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_ATTENTION_ATTENTION_H_
