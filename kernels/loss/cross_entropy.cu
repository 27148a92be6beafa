// CUDA row kernels of the fused LM-head cross-entropy: one block per token row computes an online
// (max, sum-exp) pair per thread, combined in a fixed tree (deterministic); the gradient kernel
// rewrites a row of logits as dloss * (softmax - onehot); CrossEntropyGradRowsKernel does both in
// one read of the row (ForwardBackward); the loss reduction is one block summing per-token terms
// in fp64 in a fixed order.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/loss/cross_entropy.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

constexpr int kRowThreads = 512;
constexpr int kGradThreads = 256;
constexpr int kReduceThreads = 1024;

cudaStream_t S(const Stream& s) { return s.cuda_stream; }

struct MaxSum {
  float m;  // running max
  float s;  // sum of exp(x - m)
};

__device__ __forceinline__ MaxSum Combine(MaxSum a, MaxSum b) {
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}

// One logit into a thread's running (max, sum-exp) pair.
__device__ __forceinline__ void OnlineAdd(MaxSum& acc, float x) {
  if (x > acc.m) {
    acc.s = acc.s * __expf(acc.m - x) + 1.0f;
    acc.m = x;
  } else {
    acc.s += __expf(x - acc.m);  // NaN logits propagate into s
  }
}

// The row's log-sum-exp from the threads' pairs in a fixed tree (shuffles down within each warp,
// then thread 0 combines the warps in order); valid on thread 0 only.
__device__ __forceinline__ float BlockLse(MaxSum acc, MaxSum* warp_part) {
  for (int offset = 16; offset > 0; offset /= 2) {
    MaxSum other{__shfl_down_sync(0xffffffffu, acc.m, offset),
                 __shfl_down_sync(0xffffffffu, acc.s, offset)};
    acc = Combine(acc, other);
  }
  if (threadIdx.x % 32 == 0) warp_part[threadIdx.x / 32] = acc;
  __syncthreads();
  MaxSum total = warp_part[0];
  for (int i = 1; threadIdx.x == 0 && i < kRowThreads / 32; ++i) {
    total = Combine(total, warp_part[i]);
  }
  return total.m + logf(total.s);
}

// A token's loss term lse − z[t] (0 for an ignored target, NaN for an invalid one).
__device__ __forceinline__ float LossTerm(float row_lse, int32_t t, int64_t vocab, const float* z) {
  if (t == kIgnoreTarget) return 0.0f;
  if (t >= 0 && t < vocab) return row_lse - z[t];
  return NAN;  // invalid target: make the loss visibly wrong
}

// g = dloss · (softmax − onehot) of one logit; 0 for an ignored target's row.
__device__ __forceinline__ float SoftmaxGrad(float z, float row_lse, float dloss, int32_t t,
                                             bool is_target) {
  return t == kIgnoreTarget ? 0.0f : dloss * (__expf(z - row_lse) - (is_target ? 1.0f : 0.0f));
}

__global__ void CrossEntropyRowsKernel(const float* logits, int64_t vocab, const int32_t* targets,
                                       float* lse, float* row_loss) {
  __shared__ MaxSum warp_part[kRowThreads / 32];
  const int64_t row = blockIdx.x;
  const float* z = logits + row * vocab;
  MaxSum acc{-INFINITY, 0.0f};
  for (int64_t v = threadIdx.x; v < vocab; v += kRowThreads) OnlineAdd(acc, z[v]);
  const float row_lse = BlockLse(acc, warp_part);
  if (threadIdx.x == 0) {
    lse[row] = row_lse;
    row_loss[row] = LossTerm(row_lse, targets[row], vocab, z);
  }
}

__global__ void SoftmaxGradRowsKernel(float* logits, int64_t vocab, const int32_t* targets,
                                      const float* lse, float dloss, void* grad, bool bf16,
                                      int64_t vocab_start) {
  const int64_t row = blockIdx.x;
  const int32_t t = targets[row];
  // The target's local column (vocabulary-parallel: may lie outside this rank's [0, vocab), then
  // no column matches; an ignored target never matches either, it is tested first).
  const int64_t t_local = static_cast<int64_t>(t) - vocab_start;
  const float row_lse = lse[row];
  float* z = logits + row * vocab;
  const int64_t step = static_cast<int64_t>(gridDim.y) * kGradThreads;
  for (int64_t v = blockIdx.y * int64_t(kGradThreads) + threadIdx.x; v < vocab; v += step) {
    const float g = SoftmaxGrad(z[v], row_lse, dloss, t, v == t_local);
    if (bf16) {
      static_cast<__nv_bfloat16*>(grad)[row * vocab + v] = __float2bfloat16_rn(g);
    } else {
      static_cast<float*>(grad)[row * vocab + v] = g;
    }
  }
}

// CrossEntropyRowsKernel and SoftmaxGradRowsKernel in one pass over the logits (ForwardBackward):
// the block stages its row in shared memory while it accumulates the (max, sum-exp) pairs in
// CrossEntropyRowsKernel's order (thread i takes v = i, i + 512, ...; the same shuffle tree and
// warp order), so lse, the loss term and the gradient are bitwise those of the two kernels; the
// gradient then comes from shared memory. Reads the row once instead of twice: 2048 rows × 32768
// fp32 logits were 105.6 + 182.7 µs in the two kernels on an H100. kFusedLoads loads in flight per
// thread (one 512-thread block per SM when the row takes 128 KB). A persistent variant whose rows
// came by bulk copies (cp.async.bulk, an mbarrier per 1/8 of the row, the next row's chunks
// requested while this row's gradient was written) passed the same bitwise tests but was slower:
// 285.6 vs 269.0 us per 2048-row chunk (ncu, one H100, 2026-12-07, session 19); not kept.
constexpr int kFusedLoads = 16;

__global__ void __launch_bounds__(kRowThreads)
    CrossEntropyGradRowsKernel(const float* logits, int64_t vocab, const int32_t* targets,
                               float dloss, void* grad, bool bf16, float* lse, float* row_loss) {
  extern __shared__ float row[];  // [vocab]
  __shared__ MaxSum warp_part[kRowThreads / 32];
  __shared__ float row_lse_shared;
  const int64_t r = blockIdx.x;
  const float* z = logits + r * vocab;
  MaxSum acc{-INFINITY, 0.0f};
  for (int64_t base = threadIdx.x; base < vocab; base += int64_t{kFusedLoads} * kRowThreads) {
    float x[kFusedLoads];
#pragma unroll
    for (int i = 0; i < kFusedLoads; ++i) {
      const int64_t v = base + int64_t{i} * kRowThreads;
      x[i] = v < vocab ? z[v] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kFusedLoads; ++i) {
      const int64_t v = base + int64_t{i} * kRowThreads;
      if (v >= vocab) break;
      row[v] = x[i];
      OnlineAdd(acc, x[i]);  // CrossEntropyRowsKernel's order
    }
  }
  const float lse_0 = BlockLse(acc, warp_part);  // thread 0's
  const int32_t t = targets[r];
  if (threadIdx.x == 0) {
    lse[r] = lse_0;
    row_lse_shared = lse_0;
    row_loss[r] = LossTerm(lse_0, t, vocab, row);
  }
  __syncthreads();
  const float row_lse = row_lse_shared;
  if (bf16 && vocab % 2 == 0) {  // pairs: 4-byte stores
    auto* g2 = reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(grad) + r * vocab);
    for (int64_t p = threadIdx.x; p < vocab / 2; p += kRowThreads) {
      float g[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int64_t v = 2 * p + j;
        g[j] = SoftmaxGrad(row[v], row_lse, dloss, t, v == t);
      }
      g2[p] = __floats2bfloat162_rn(g[0], g[1]);
    }
    return;
  }
  for (int64_t v = threadIdx.x; v < vocab; v += kRowThreads) {
    const float g = SoftmaxGrad(row[v], row_lse, dloss, t, v == t);
    if (bf16) {
      static_cast<__nv_bfloat16*>(grad)[r * vocab + v] = __float2bfloat16_rn(g);
    } else {
      static_cast<float*>(grad)[r * vocab + v] = g;  // may be the logits row: staged already
    }
  }
}

__global__ void ReduceLossKernel(const float* row_loss, const int32_t* targets, int64_t tokens,
                                 float* loss_sum, int32_t* num_valid) {
  __shared__ double part[kReduceThreads];
  __shared__ int count[kReduceThreads];
  double s = 0.0;
  int c = 0;
  for (int64_t i = threadIdx.x; i < tokens; i += kReduceThreads) {
    s += row_loss[i];
    c += targets[i] != kIgnoreTarget;
  }
  part[threadIdx.x] = s;
  count[threadIdx.x] = c;
  __syncthreads();
  for (int stride = kReduceThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      part[threadIdx.x] += part[threadIdx.x + stride];
      count[threadIdx.x] += count[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    loss_sum[0] = static_cast<float>(part[0]);
    num_valid[0] = count[0];
  }
}

// Vocabulary-parallel statistics (see cross_entropy.h). Block reductions in a fixed tree: the
// per-thread partials in ascending v, then the warp shuffles, then warp 0 in order.
__global__ void VpRowMaxKernel(const float* logits, int64_t vocab, float* row_max) {
  __shared__ float warp_part[kRowThreads / 32];
  const int64_t row = blockIdx.x;
  const float* z = logits + row * vocab;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < vocab; v += kRowThreads) m = fmaxf(m, z[v]);
  for (int offset = 16; offset > 0; offset /= 2) {
    m = fmaxf(m, __shfl_down_sync(0xffffffffu, m, offset));
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_part[warp] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = warp_part[0];
    for (int i = 1; i < kRowThreads / 32; ++i) total = fmaxf(total, warp_part[i]);
    row_max[row] = total;
  }
}

__global__ void VpRowSumKernel(const float* logits, int64_t vocab, const int32_t* targets,
                               int64_t vocab_start, const float* row_max, float* stats) {
  __shared__ float warp_part[kRowThreads / 32];
  const int64_t row = blockIdx.x;
  const float* z = logits + row * vocab;
  const float m = row_max[row];
  float s = 0.0f;
  for (int64_t v = threadIdx.x; v < vocab; v += kRowThreads) s += __expf(z[v] - m);
  for (int offset = 16; offset > 0; offset /= 2) s += __shfl_down_sync(0xffffffffu, s, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_part[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = warp_part[0];
    for (int i = 1; i < kRowThreads / 32; ++i) total += warp_part[i];
    stats[2 * row] = total;
    const int32_t t = targets[row];
    const int64_t local = static_cast<int64_t>(t) - vocab_start;
    stats[2 * row + 1] = (t != kIgnoreTarget && local >= 0 && local < vocab) ? z[local] : 0.0f;
  }
}

__global__ void VpFinishKernel(int64_t rows, const int32_t* targets, int64_t vocab_size,
                               const float* row_max, const float* stats, float* lse,
                               float* row_loss) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (row >= rows) return;
  const float row_lse = row_max[row] + logf(stats[2 * row]);
  lse[row] = row_lse;
  const int32_t t = targets[row];
  float term;
  if (t == kIgnoreTarget) {
    term = 0.0f;
  } else if (t >= 0 && t < vocab_size) {
    term = row_lse - stats[2 * row + 1];
  } else {
    term = NAN;  // invalid target: make the loss visibly wrong
  }
  row_loss[row] = term;
}

}  // namespace

absl::Status VpRowMaxCuda(const Stream& stream, const float* logits, int64_t rows, int64_t vocab,
                          float* row_max) {
  if (rows == 0) return absl::OkStatus();
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  VpRowMaxKernel<<<static_cast<unsigned>(rows), kRowThreads, 0, S(stream)>>>(logits, vocab,
                                                                             row_max);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(VpRowMaxKernel);
  return absl::OkStatus();
}

absl::Status VpRowSumCuda(const Stream& stream, const float* logits, int64_t rows, int64_t vocab,
                          const int32_t* targets, int64_t vocab_start, const float* row_max,
                          float* stats) {
  if (rows == 0) return absl::OkStatus();
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  VpRowSumKernel<<<static_cast<unsigned>(rows), kRowThreads, 0, S(stream)>>>(
      logits, vocab, targets, vocab_start, row_max, stats);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(VpRowSumKernel);
  return absl::OkStatus();
}

absl::Status VpFinishCuda(const Stream& stream, int64_t rows, const int32_t* targets,
                          int64_t vocab_size, const float* row_max, const float* stats, float* lse,
                          float* row_loss) {
  if (rows == 0) return absl::OkStatus();
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  constexpr int kThreads = 256;
  VpFinishKernel<<<static_cast<unsigned>((rows + kThreads - 1) / kThreads), kThreads, 0,
                   S(stream)>>>(rows, targets, vocab_size, row_max, stats, lse, row_loss);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(VpFinishKernel);
  return absl::OkStatus();
}

absl::Status CrossEntropyRowsCuda(const Stream& stream, const float* logits, int64_t rows,
                                  int64_t vocab, const int32_t* targets, float* lse,
                                  float* row_loss) {
  if (rows == 0) return absl::OkStatus();
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  CrossEntropyRowsKernel<<<static_cast<unsigned>(rows), kRowThreads, 0, S(stream)>>>(
      logits, vocab, targets, lse, row_loss);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(CrossEntropyRowsKernel);
  return absl::OkStatus();
}

absl::Status SoftmaxGradRowsCuda(const Stream& stream, float* logits, int64_t rows, int64_t vocab,
                                 const int32_t* targets, const float* lse, float dloss, void* grad,
                                 DType grad_dtype, int64_t vocab_start) {
  if (rows == 0) return absl::OkStatus();
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  if (grad_dtype != DType::kBF16 && grad_dtype != DType::kF32) {
    return absl::InvalidArgumentError("SoftmaxGradRowsCuda: grad must be bf16 or f32");
  }
  // Split each row over up to 64 blocks (8 elements per thread at least) for large vocabularies.
  int64_t per_row = (vocab + kGradThreads * 8 - 1) / (kGradThreads * 8);
  per_row = per_row < 1 ? 1 : (per_row > 64 ? 64 : per_row);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(per_row));
  SoftmaxGradRowsKernel<<<grid, kGradThreads, 0, S(stream)>>>(
      logits, vocab, targets, lse, dloss, grad, grad_dtype == DType::kBF16, vocab_start);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(SoftmaxGradRowsKernel);
  return absl::OkStatus();
}

bool CrossEntropyGradRowsFits(int device_index, int64_t vocab) {
  int optin = 0;
  if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_index) !=
      cudaSuccess) {
    return false;
  }
  constexpr int64_t kStatic = sizeof(MaxSum) * (kRowThreads / 32) + 64;
  return vocab * static_cast<int64_t>(sizeof(float)) + kStatic <= optin;
}

absl::Status CrossEntropyGradRowsCuda(const Stream& stream, float* logits, int64_t rows,
                                      int64_t vocab, const int32_t* targets, float dloss,
                                      void* grad, DType grad_dtype, float* lse, float* row_loss) {
  if (rows == 0) return absl::OkStatus();
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  if (grad_dtype != DType::kBF16 && grad_dtype != DType::kF32) {
    return absl::InvalidArgumentError("CrossEntropyGradRowsCuda: grad must be bf16 or f32");
  }
  const size_t smem = static_cast<size_t>(vocab) * sizeof(float);
  // The default 48 KB covers dynamic + static shared memory (warp_part, row_lse_shared): 144
  // bytes (ptxas -v, sm_90a: the 132 of the two arrays, aligned), bounded by 256. The bound was
  // the unaligned 132, so a row of 49,009-49,020 bytes (vocab 12253-12255) failed to launch.
  constexpr size_t kStaticSmem = 256;
  if (smem + kStaticSmem > 48 * 1024) {  // only past the default: not a driver call per launch
    SY_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(CrossEntropyGradRowsKernel,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(smem)));
  }
  CrossEntropyGradRowsKernel<<<static_cast<unsigned>(rows), kRowThreads, smem, S(stream)>>>(
      logits, vocab, targets, dloss, grad, grad_dtype == DType::kBF16, lse, row_loss);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(CrossEntropyGradRowsKernel);
  return absl::OkStatus();
}

absl::Status ReduceLossCuda(const Stream& stream, const float* row_loss, const int32_t* targets,
                            int64_t tokens, float* loss_sum, int32_t* num_valid) {
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  ReduceLossKernel<<<1, kReduceThreads, 0, S(stream)>>>(row_loss, targets, tokens, loss_sum,
                                                        num_valid);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(ReduceLossKernel);
  return absl::OkStatus();
}

}  // namespace switchyard::kernels::internal
