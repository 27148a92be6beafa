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
//
// Vocabulary-parallel mode (tensor parallelism, megatron_parallel.md §1.8, Megatron's
// _VocabParallelCrossEntropy): w is this TP rank's slice of the LM head, global vocabulary rows
// [start, start + vocab) of the whole V, and every TP rank passes the SAME tokens h (the SP
// all-gather of the final norm). Per chunk, with z the LOCAL logits [rows, vocab]:
//   m    = all_reduce_MAX_tp( max_j z_j )
//   (Σ, p) = all_reduce_SUM_tp( Σ_j exp(z_j − m),  z[target − start] if this rank owns the target
//            else 0 )                               (one collective for both: Megatron's fused
//            path)
//   lse  = m + log Σ,  loss_t = lse − p
//   g    = dloss · (exp(z − lse) − onehot_local(target − start))   (backward local: no collective)
// so full-vocabulary logits are never gathered; dh is this rank's PARTIAL sum over its vocabulary
// rows (the caller reduce-scatters / all-reduces it over TP) and dw the gradient of its own rows.
// The collectives are the caller's (kernels do not depend on a communicator): VocabShard's
// all_reduce, stream-ordered, called twice per chunk in the same order on every TP rank. Every
// rank gets the same loss_sum, num_valid and lse (up to the rounding of the all-reduce order).
#ifndef SWITCHYARD_KERNELS_LOSS_CROSS_ENTROPY_H_
#define SWITCHYARD_KERNELS_LOSS_CROSS_ENTROPY_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "kernels/runtime/buffer.h"

namespace switchyard::kernels {

// Value of `targets` for a token that takes no part in the loss (padding, masked prompt).
inline constexpr int32_t kIgnoreTarget = -1;

// This TP rank's slice of the vocabulary for the vocabulary-parallel mode (see the file comment).
struct VocabShard {
  int64_t start = 0;       // first global vocabulary row held by this rank (w's row 0)
  int64_t vocab_size = 0;  // the whole vocabulary V: targets are in [0, V) or kIgnoreTarget
  // All-reduces `t` IN PLACE over the TP group: the maximum when `max`, else the sum. `t` is a
  // contiguous [n] tensor of the plan's statistics dtype (f32 on CUDA, f64 on the CPU) on the
  // plan's device; on CUDA the reduction must be ordered on the stream passed to the op.
  std::function<absl::Status(const Tensor& t, bool max)> all_reduce;
};

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

  // Vocabulary-parallel Forward and ForwardBackward (see the file comment): w [vocab, H] is the
  // rows [shard.start, shard.start + vocab) of the whole [shard.vocab_size, H] LM head; targets
  // index the WHOLE vocabulary. Outputs as in Forward / ForwardBackward, except that dh is this
  // rank's partial sum (its vocabulary rows only) and dw the gradient of its own rows. The CPU
  // path is the fp64 reference of the CUDA one (same signature, same algorithm). INVALID_ARGUMENT
  // when the slice does not fit in [0, vocab_size) or all_reduce is empty.
  absl::Status VocabParallelForward(const Stream& stream, const Tensor& h, const Tensor& w,
                                    const Tensor& targets, const VocabShard& shard,
                                    const Tensor& loss_sum, const Tensor& num_valid,
                                    const Tensor& lse) const;
  absl::Status VocabParallelForwardBackward(const Stream& stream, const Tensor& h, const Tensor& w,
                                            const Tensor& targets, const VocabShard& shard,
                                            float dloss, const Tensor& loss_sum,
                                            const Tensor& num_valid, const Tensor& lse,
                                            const Tensor& dh, const Tensor& dw) const;

  int64_t chunk_tokens() const { return chunk_; }

 private:
  FusedLinearCrossEntropy(Device device, int64_t max_tokens, int64_t hidden, int64_t vocab,
                          int64_t chunk)
      : device_(device), max_tokens_(max_tokens), hidden_(hidden), vocab_(vocab), chunk_(chunk) {}

  absl::Status Check(const Stream& stream, const Tensor& h, const Tensor& w, const Tensor& targets,
                     const Tensor& lse, absl::string_view op,
                     int64_t target_vocab = -1) const;  // -1: the plan's vocab
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

  absl::Status CheckShard(const VocabShard& shard, absl::string_view op) const;
  // Both vocabulary-parallel ops: the chunk loop on either device.
  absl::Status RunVocabParallel(const Stream& stream, const Tensor& h, const Tensor& w,
                                const Tensor& targets, const VocabShard& shard, bool with_grad,
                                float dloss, const Tensor& loss_sum, const Tensor& num_valid,
                                const Tensor& lse, const Tensor& dh, const Tensor& dw) const;

  const Device device_;
  const int64_t max_tokens_, hidden_, vocab_, chunk_;
  Buffer logits_;            // [chunk, V] f32 on CUDA, f64 on the CPU
  Buffer grad_bf16_;         // [chunk, V] bf16, CUDA only: g for bf16 weights
  bool fused_rows_ = false;  // CUDA: ForwardBackward's row kernel in one pass (GradRowsFits)
  Buffer row_loss_;          // [max_tokens] f32, CUDA only: lse_t - z_t[target_t], 0 when ignored
  // Vocabulary-parallel statistics of one chunk: [chunk] maxima, then [chunk, 2] (sum-exp,
  // target logit); f32 on CUDA, f64 on the CPU (the all-reduced tensors).
  Buffer vp_stats_;
};

namespace internal {
// CUDA row kernels (cross_entropy.cu). `logits` [rows, V] f32, `targets`/`lse` the chunk's rows.
absl::Status CrossEntropyRowsCuda(const Stream& stream, const float* logits, int64_t rows,
                                  int64_t vocab, const int32_t* targets, float* lse,
                                  float* row_loss);
// Writes g = dloss * (softmax - onehot) over `logits` in place (f32) or into `grad` (bf16).
// vocab_start: the global index of column 0 (vocabulary-parallel: the one-hot is at
// target - vocab_start when this rank owns the target; 0 otherwise).
absl::Status SoftmaxGradRowsCuda(const Stream& stream, float* logits, int64_t rows, int64_t vocab,
                                 const int32_t* targets, const float* lse, float dloss, void* grad,
                                 DType grad_dtype, int64_t vocab_start = 0);
// CrossEntropyRowsCuda then SoftmaxGradRowsCuda in one pass (bitwise the same lse, row_loss and
// gradient), the row staged in shared memory: only where CrossEntropyGradRowsFits (the row's
// vocab × 4 bytes within the device's opt-in shared memory per block: vocab <= ~57k on Hopper).
bool CrossEntropyGradRowsFits(int device_index, int64_t vocab);
absl::Status CrossEntropyGradRowsCuda(const Stream& stream, float* logits, int64_t rows,
                                      int64_t vocab, const int32_t* targets, float dloss,
                                      void* grad, DType grad_dtype, float* lse, float* row_loss);
// Vocabulary-parallel row statistics over local logits [rows, vocab] f32 (one block per row,
// fixed reduction tree: deterministic):
//   VpRowMax:   row_max[r] = max_j z[r, j]
//   VpRowSum:   stats[2r] = sum_j exp(z[r, j] - row_max[r]) (row_max: the all-reduced maximum),
//               stats[2r + 1] = z[r, targets[r] - vocab_start] if that column is this rank's,
//               else 0
//   VpFinish:   lse[r] = row_max[r] + log(stats[2r]); row_loss[r] = lse[r] - stats[2r + 1]
//               (0 for kIgnoreTarget, NaN for a target outside [0, vocab_size))
absl::Status VpRowMaxCuda(const Stream& stream, const float* logits, int64_t rows, int64_t vocab,
                          float* row_max);
absl::Status VpRowSumCuda(const Stream& stream, const float* logits, int64_t rows, int64_t vocab,
                          const int32_t* targets, int64_t vocab_start, const float* row_max,
                          float* stats);
absl::Status VpFinishCuda(const Stream& stream, int64_t rows, const int32_t* targets,
                          int64_t vocab_size, const float* row_max, const float* stats, float* lse,
                          float* row_loss);
// loss_sum[0] = sum of row_loss[0..T) in a fixed order (fp64), num_valid[0] = #(targets != -1).
absl::Status ReduceLossCuda(const Stream& stream, const float* row_loss, const int32_t* targets,
                            int64_t tokens, float* loss_sum, int32_t* num_valid);
}  // namespace internal

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_LOSS_CROSS_ENTROPY_H_
