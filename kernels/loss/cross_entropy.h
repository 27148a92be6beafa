// File: kernels/loss/cross_entropy.h
//
// Fused LM-head cross-entropy: loss = sum_t [lse(z_t) - z_t[target_t]] with z = h · wᵀ, computed
// chunk by chunk over the tokens so that full-vocabulary logits are never stored for the whole
// batch: only one chunk of [chunk_tokens, V] logits lives in the plan's workspace at a time.
//
// Forward, per chunk: z_chunk = h_chunk · wᵀ (kernels::Gemm, f32 out), one row kernel computes the
// fp32 log-sum-exp and the target logit; the per-token loss terms are reduced once at the end in a
// fixed order (deterministic). Backward, per chunk: the logits are recomputed and turned in place
// into g = dloss * (softmax(z) - onehot(target)) (zero rows for ignored targets), then
// dh_chunk = g · w and dw += gᵀ · h_chunk (Gemm).
//
// Dtypes: CUDA: h, w bf16 or f32 (fp32 math inside); CPU: f32, f64 or bf16 (fp64 math). The CPU
// path is the reference: the same chunked algorithm with direct fp64 loops.
#ifndef SWITCHYARD_KERNELS_LOSS_CROSS_ENTROPY_H_
#define SWITCHYARD_KERNELS_LOSS_CROSS_ENTROPY_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "kernels/buffer.h"

namespace switchyard::kernels {

// Value of `targets` for a token that takes no part in the loss (padding, masked prompt).
inline constexpr int32_t kIgnoreTarget = -1;

// A plan for one (max_tokens, hidden, vocab) LM head on one device. Owns the workspace: one chunk
// of logits ([chunk_tokens, V] f32, plus a bf16 copy of the gradient chunk on CUDA) and a
// per-token scratch [max_tokens] for the deterministic loss reduction. Forward and Backward
// allocate nothing and never synchronise with the host (graph-capturable on CUDA). Neither copied
// nor moved; use from one thread, one stream at a time (the workspace is shared by both calls).
class FusedLinearCrossEntropy {
 public:
  // max_tokens, hidden, vocab, chunk_tokens > 0 (chunk_tokens is clamped to max_tokens).
  // Workspace: chunk_tokens * vocab * 6 bytes on CUDA (8 on the CPU) + max_tokens * 4 bytes.
  static absl::StatusOr<std::unique_ptr<FusedLinearCrossEntropy>> Create(
      Device device, int64_t max_tokens, int64_t hidden, int64_t vocab, int64_t chunk_tokens);

  FusedLinearCrossEntropy(const FusedLinearCrossEntropy&) = delete;
  FusedLinearCrossEntropy& operator=(const FusedLinearCrossEntropy&) = delete;

  // h [T, H] (T <= max_tokens), w [V, H] (the LM head or tied embedding; same dtype as h),
  // targets [T] i32 in [0, V) or kIgnoreTarget.
  // Outputs (overwritten): loss_sum [1] = sum over valid tokens of lse_t - z_t[target_t];
  // num_valid [1] i32 = number of tokens with target != kIgnoreTarget; lse [T] = log-sum-exp of
  // every token's logits (saved for Backward; ignored tokens get theirs too).
  // loss_sum and lse: f32 (f32 or f64 on the CPU).
  // Targets are validated on the CPU (InvalidArgument); the CUDA path does not read them on the
  // host, and a target outside [-1, V) makes loss_sum NaN there.
  absl::Status Forward(const Stream& stream, const Tensor& h, const Tensor& w,
                       const Tensor& targets, const Tensor& loss_sum, const Tensor& num_valid,
                       const Tensor& lse) const;

  // Gradient of dloss * loss_sum (dloss e.g. 1 / num_valid for a mean, read by the caller).
  // h, w, targets as in Forward; lse [T] as Forward saved it. dh [T, H] (dtype of h) is
  // overwritten; dw [V, H] (f32 or the dtype of w) is accumulated into (dw += ...), so a caller
  // with tied embeddings passes the embedding's gradient buffer.
  absl::Status Backward(const Stream& stream, const Tensor& h, const Tensor& w,
                        const Tensor& targets, const Tensor& lse, float dloss, const Tensor& dh,
                        const Tensor& dw) const;

  // Forward and Backward in one pass over the chunks, for a caller that knows dloss before the
  // forward (a training step: dloss = the micro-batch's loss scale): per chunk the logits are
  // computed once, their lse and loss terms taken, then turned into the gradient, which saves
  // Backward's recomputation of the logits (one [T, H] x [H, V] GEMM, a third of the LM head's
  // work). Same arguments and the same results as Forward then Backward (bitwise on CUDA and on
  // the CPU: the same kernels and GEMMs in the same order).
  absl::Status ForwardBackward(const Stream& stream, const Tensor& h, const Tensor& w,
                               const Tensor& targets, float dloss, const Tensor& loss_sum,
                               const Tensor& num_valid, const Tensor& lse, const Tensor& dh,
                               const Tensor& dw) const;

  int64_t chunk_tokens() const { return chunk_; }

 private:
  FusedLinearCrossEntropy(Device device, int64_t max_tokens, int64_t hidden, int64_t vocab,
                          int64_t chunk)
      : device_(device), max_tokens_(max_tokens), hidden_(hidden), vocab_(vocab), chunk_(chunk) {}

  absl::Status Check(const Stream& stream, const Tensor& h, const Tensor& w, const Tensor& targets,
                     const Tensor& lse, absl::string_view op) const;
  absl::Status CheckLossOutputs(const Stream& stream, const Tensor& loss_sum,
                                const Tensor& num_valid, const Tensor& lse,
                                absl::string_view op) const;
  absl::Status CheckGradOutputs(const Stream& stream, const Tensor& h, const Tensor& w,
                                const Tensor& dh, const Tensor& dw, absl::string_view op) const;
  // CUDA, one chunk of `rows` tokens from t0: logits, then (with_loss) lse and loss terms, then
  // (with_grad) g and its two GEMMs. Forward, Backward and ForwardBackward are loops over it.
  absl::Status ChunkCuda(const Stream& stream, const Tensor& h, const Tensor& w,
                         const Tensor& targets, const Tensor& lse, int64_t t0, int64_t rows,
                         bool with_loss, bool with_grad, float dloss, const Tensor& dh,
                         const Tensor& dw) const;
  absl::Status ForwardCpu(const Tensor& h, const Tensor& w, const Tensor& targets,
                          const Tensor& loss_sum, const Tensor& num_valid, const Tensor& lse) const;
  absl::Status BackwardCpu(const Tensor& h, const Tensor& w, const Tensor& targets,
                           const Tensor& lse, float dloss, const Tensor& dh,
                           const Tensor& dw) const;
  absl::Status RunCuda(const Stream& stream, const Tensor& h, const Tensor& w,
                       const Tensor& targets, const Tensor& lse, bool with_loss, bool with_grad,
                       float dloss, const Tensor& loss_sum, const Tensor& num_valid,
                       const Tensor& dh, const Tensor& dw) const;

  const Device device_;
  const int64_t max_tokens_, hidden_, vocab_, chunk_;
  Buffer logits_;     // [chunk, V] f32 on CUDA, f64 on the CPU
  Buffer grad_bf16_;  // [chunk, V] bf16, CUDA only: g for bf16 weights
  Buffer row_loss_;   // [max_tokens] f32, CUDA only: lse_t - z_t[target_t], 0 when ignored
};

namespace internal {
// CUDA row kernels (cross_entropy.cu). `logits` [rows, V] f32, `targets`/`lse` the chunk's rows.
absl::Status CrossEntropyRowsCuda(const Stream& stream, const float* logits, int64_t rows,
                                  int64_t vocab, const int32_t* targets, float* lse,
                                  float* row_loss);
// Writes g = dloss * (softmax - onehot) over `logits` in place (f32) or into `grad` (bf16).
absl::Status SoftmaxGradRowsCuda(const Stream& stream, float* logits, int64_t rows, int64_t vocab,
                                 const int32_t* targets, const float* lse, float dloss, void* grad,
                                 DType grad_dtype);
// loss_sum[0] = sum of row_loss[0..T) in a fixed order (fp64), num_valid[0] = #(targets != -1).
absl::Status ReduceLossCuda(const Stream& stream, const float* row_loss, const int32_t* targets,
                            int64_t tokens, float* loss_sum, int32_t* num_valid);
}  // namespace internal

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_LOSS_CROSS_ENTROPY_H_
