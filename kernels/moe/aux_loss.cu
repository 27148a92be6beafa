// CUDA aux and z losses (aux_loss.h). Statistics: one block per chunk of router_math::kAuxChunk
// tokens of one sequence (a warp per token), sums in token order, then chunks in lane order (no
// floating-point atomics; counts are integer-valued float atomics, exact). Loss values: one block.
// Backward: one warp per token. Compiled with -fmad=false like router.cu.
#include <cuda_runtime.h>

#include "kernels/device_reduce.cuh"
#include "kernels/moe/router_device.h"
#include "kernels/moe/router_internal.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kLossThreads = 512;

struct StatsArgs {
  const float* logits;
  const int* selected;  // null, or the router's selection [T, k]: the counts come from it
  int num_experts, topk, sigmoid;
  long long tokens_per_sequence, chunks_per_sequence, num_chunks;
  double* partial;    // [num_chunks, E]
  double* partial_z;  // [num_chunks]
  float* counts;      // [B, E], zeroed
};

// One block per chunk of router_math::kAuxChunk tokens, one warp per token: each warp puts its
// token's P row and lse in shared memory and counts its plain top-k (or the router's selection,
// a.selected, where that is the same: AuxTopkIsRouterTopk); then thread e sums the
// chunk's rows for expert e in token order from 0.0, and the last thread the lse² (the CPU
// reference's order, so the same bits). Was one warp per chunk walking its 16 tokens in turn:
// 512 warps for 8192 tokens, about one block per SM, latency-bound (~110 us per call on an H100,
// 10.8 ms of the benchmark model's step).
template <int NJ>
__global__ void __launch_bounds__(router_math::kAuxChunk * 32) AuxStatsKernel(StatsArgs a) {
  extern __shared__ double rows[];  // [kAuxChunk, E] P rows, then [kAuxChunk] lse
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const long long chunk = blockIdx.x;
  const int e_count = a.num_experts;
  const long long b = chunk / a.chunks_per_sequence;
  const long long begin = (chunk % a.chunks_per_sequence) * router_math::kAuxChunk;
  const int n = static_cast<int>(
      min(static_cast<long long>(router_math::kAuxChunk), a.tokens_per_sequence - begin));
  double* lse_rows = rows + router_math::kAuxChunk * e_count;
  if (w < n) {  // warp-uniform
    const float* z = a.logits + (b * a.tokens_per_sequence + begin + w) * e_count;
    double mx, sum;
    RowSoftmaxNorm<NJ>(z, e_count, &mx, &sum);
    double sig_sum = 0.0;
    if (a.sigmoid) {
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        if (lane + 32 * j < e_count) sig_sum += Sigmoid(z[lane + 32 * j]);
      }
      sig_sum = WarpSum(sig_sum);
    }
    unsigned avail = 0;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const int e = lane + 32 * j;
      if (e >= e_count) continue;
      rows[w * e_count + e] =
          a.sigmoid ? Sigmoid(z[e]) / sig_sum : Exp(static_cast<double>(z[e]) - mx) / sum;
      avail |= 1u << j;
    }
    if (lane == 0) lse_rows[w] = mx + log(sum);
    if (a.selected != nullptr) {  // the router's selection is this top-k (AuxTopkIsRouterTopk)
      const long long t = b * a.tokens_per_sequence + begin + w;
      if (lane < a.topk) atomicAdd(&a.counts[b * e_count + a.selected[t * a.topk + lane]], 1.0f);
    }
    // The aux loss's own plain top-k of z otherwise (a.selected is uniform: no divergence).
    for (int r = 0; a.selected == nullptr && r < a.topk; ++r) {
      double bv = 0.0;
      int bi = -1;
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        if (((avail >> j) & 1u) && Better(z[lane + 32 * j], lane + 32 * j, bv, bi)) {
          bv = z[lane + 32 * j];
          bi = lane + 32 * j;
        }
      }
      bi = WarpBestFloatKey(static_cast<float>(bv), bi);  // zr are fp32 logits
      if ((bi & 31) == lane) {
        avail &= ~(1u << (bi >> 5));
        atomicAdd(&a.counts[b * e_count + bi], 1.0f);
      }
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < e_count; e += blockDim.x) {
    double acc = 0.0;
    for (int q = 0; q < n; ++q) acc += rows[q * e_count + e];
    a.partial[chunk * e_count + e] = acc;
  }
  if (threadIdx.x == blockDim.x - 1) {
    double z_acc = 0.0;
    for (int q = 0; q < n; ++q) {
      const double lse = lse_rows[q];
      z_acc += lse * lse;
    }
    a.partial_z[chunk] = z_acc;
  }
}

// Warps [0, B*E) each sum one (sequence, expert) column over its chunks, warp B*E the z-loss
// partials of all chunks, in lane order (router_math::LaneOrderSum, which the CPU reference uses):
// lane l adds chunks l, l + 32, ... in ascending order, then WarpSum's butterfly. Was one thread
// per column adding its 256 chunks in turn: 21 us per call, latency-bound.
__global__ void AuxStatsFinalizeKernel(const double* partial, const double* partial_z,
                                       long long num_sequences, long long chunks_per_sequence,
                                       int e_count, double* prob_sums, double* lse_sq_sum) {
  const long long col = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const long long n = num_sequences * e_count;
  if (col > n) return;  // warp-uniform
  const bool z = col == n;
  const long long count = z ? num_sequences * chunks_per_sequence : chunks_per_sequence;
  const long long stride = z ? 1 : e_count;
  const double* base =
      z ? partial_z : partial + (col / e_count) * chunks_per_sequence * e_count + col % e_count;
  const long long mine = count > lane ? (count - lane + 31) / 32 : 0;
  const double s = WarpSum(kernels::OrderedSum(base + lane * stride, mine, 32 * stride));
  if (lane == 0) (z ? *lse_sq_sum : prob_sums[col]) = s;
}

struct LossArgs {
  const double* prob_sums;
  const float* counts;
  const float* global_counts;
  const double* lse_sq_sum;
  long long num_sequences;
  int num_experts, num_terms;
  AuxLossType types[3];
  double coef[3];  // α·E/(k·N²) of each term
  double dp_size, z_loss_coeff, num_tokens;
  float* losses;
  float* grad_weights;
};

__global__ void __launch_bounds__(kLossThreads) AuxLossValueKernel(LossArgs a) {
  __shared__ double p_total[kRouterMaxExperts], c_total[kRouterMaxExperts], part[kLossThreads];
  const int tid = threadIdx.x, e_count = a.num_experts;
  const long long b_count = a.num_sequences;
  for (int e = tid; e < e_count; e += blockDim.x) {
    double p = 0.0, c = 0.0;
    for (long long b = 0; b < b_count; ++b) {
      p += a.prob_sums[b * e_count + e];
      c += a.counts[b * e_count + e];
    }
    p_total[e] = p;
    c_total[e] = c;
  }
  __syncthreads();
  for (int i = 0; i < a.num_terms; ++i) {
    if (a.types[i] == AuxLossType::kSeqAuxLoss) {
      double mine = 0.0;
      for (long long b = tid; b < b_count; b += blockDim.x) {
        double dot = 0.0;
        for (int e = 0; e < e_count; ++e) {
          dot += a.prob_sums[b * e_count + e] * a.counts[b * e_count + e];
        }
        mine += dot * a.coef[i];
      }
      part[tid] = mine;
      __syncthreads();
      if (tid == 0) {
        double total = 0.0;
        for (int q = 0; q < blockDim.x; ++q) total += part[q];
        a.losses[i] = static_cast<float>(total / b_count);
      }
      __syncthreads();
    } else if (tid == 0) {
      const bool global = a.types[i] == AuxLossType::kGlobalAuxLoss;
      double dot = 0.0;
      for (int e = 0; e < e_count; ++e) {
        dot += p_total[e] * (global ? static_cast<double>(a.global_counts[e]) : c_total[e]);
      }
      a.losses[i] = static_cast<float>(dot * a.coef[i]);
    }
  }
  if (tid == 0) {
    a.losses[a.num_terms] = static_cast<float>(a.z_loss_coeff * *a.lse_sq_sum / a.num_tokens);
  }
  for (long long i = tid; i < b_count * e_count; i += blockDim.x) {
    const int e = static_cast<int>(i % e_count);
    double w = 0.0;
    for (int q = 0; q < a.num_terms; ++q) {
      if (a.types[q] == AuxLossType::kAuxLoss) {
        w += a.coef[q] * c_total[e];
      } else if (a.types[q] == AuxLossType::kSeqAuxLoss) {
        w += a.coef[q] / b_count * a.counts[i];
      } else {
        w += a.dp_size * a.coef[q] * a.global_counts[e];
      }
    }
    a.grad_weights[i] = static_cast<float>(w);
  }
}

struct AuxBackwardArgs {
  const float* logits;
  const float* grad_weights;
  float* dlogits;
  long long num_tokens, tokens_per_sequence;
  int num_experts, sigmoid;
  double z_coef, scale;  // z_coef = 2·c_z / T
};

template <int NJ>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) AuxBackwardKernel(AuxBackwardArgs a) {
  const int lane = threadIdx.x & 31;
  const long long t = static_cast<long long>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (t >= a.num_tokens) return;
  const int e_count = a.num_experts;
  const float* z = a.logits + t * e_count;
  const float* w = a.grad_weights + (t / a.tokens_per_sequence) * e_count;
  float* out = a.dlogits + t * e_count;
  double mx, sum;
  RowSoftmaxNorm<NJ>(z, e_count, &mx, &sum);
  double sig_sum = 0.0, p[NJ], dot = 0.0;
  if (a.sigmoid) {
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      if (lane + 32 * j < e_count) sig_sum += Sigmoid(z[lane + 32 * j]);
    }
    sig_sum = WarpSum(sig_sum);
  }
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    const int e = lane + 32 * j;
    p[j] = 0.0;
    if (e >= e_count) continue;
    p[j] = a.sigmoid ? Sigmoid(z[e]) / sig_sum : Exp(static_cast<double>(z[e]) - mx) / sum;
    dot += p[j] * w[e];
  }
  dot = WarpSum(dot);
  const double zc = a.z_coef * (mx + log(sum));
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    const int e = lane + 32 * j;
    if (e >= e_count) continue;
    double d;
    if (a.sigmoid) {
      const double s = Sigmoid(z[e]);
      d = (w[e] - dot) / sig_sum * (s * (1.0 - s));
    } else {
      d = p[j] * (w[e] - dot);
    }
    d += zc * (Exp(static_cast<double>(z[e]) - mx) / sum);
    out[e] = static_cast<float>(static_cast<double>(out[e]) + a.scale * d);
  }
}

}  // namespace

absl::Status AuxLossStatsCuda(const Stream& stream, const AuxPlan& plan, const Tensor& logits,
                              const Tensor& selected, const AuxLossStats& stats,
                              const Tensor& workspace) {
  cudaStream_t s = stream.cuda_stream;
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  SY_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(stats.counts.data, 0, stats.counts.bytes(), s));
  StatsArgs args;
  args.logits = logits.as<float>();
  args.selected = selected.data != nullptr ? selected.as<int32_t>() : nullptr;
  args.num_experts = static_cast<int>(plan.num_experts);
  args.topk = static_cast<int>(plan.topk);
  args.sigmoid = plan.sigmoid;
  args.tokens_per_sequence = plan.tokens_per_sequence;
  args.chunks_per_sequence = plan.chunks_per_sequence;
  args.num_chunks = plan.num_chunks;
  args.partial = static_cast<double*>(workspace.data);
  args.partial_z =
      reinterpret_cast<double*>(static_cast<char*>(workspace.data) +
                                (8 * plan.num_chunks * plan.num_experts + 255) / 256 * 256);
  args.counts = stats.counts.as<float>();
  if (plan.num_chunks > 0) {
    // 16 P rows of E doubles: 65.6 KB at E = 512, past the default 48 KB.
    const size_t smem = sizeof(double) * router_math::kAuxChunk * (args.num_experts + 1);
    cudaError_t attr = cudaSuccess;
    DispatchLaneWidth(args.num_experts, [&](auto nj) {
      auto* kernel = &AuxStatsKernel<decltype(nj)::value>;
      if (smem > 48 * 1024) {  // only past the default; not a per-call driver call otherwise
        attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem));
      }
      if (attr == cudaSuccess) {
        kernel<<<static_cast<unsigned>(plan.num_chunks), router_math::kAuxChunk * 32, smem, s>>>(
            args);
      }
    });
    SY_CUDA_RETURN_IF_ERROR(attr);
    SY_CUDA_RETURN_IF_LAUNCH_ERROR(AuxStatsKernel);
  }
  const long long n = plan.num_sequences * plan.num_experts;
  AuxStatsFinalizeKernel<<<BlocksFor((n + 1) * 32, 256), 256, 0, s>>>(
      args.partial, args.partial_z, plan.num_sequences, plan.chunks_per_sequence, args.num_experts,
      stats.prob_sums.as<double>(), stats.lse_sq_sum.as<double>());
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(AuxStatsFinalizeKernel);
  return absl::OkStatus();
}

absl::Status AuxLossForwardCuda(const Stream& stream, const RouterConfig& config,
                                const AuxPlan& plan, const AuxLossStats& stats,
                                const AuxLossNorms& norms, const Tensor& losses,
                                const Tensor& grad_weights) {
  cudaStream_t s = stream.cuda_stream;
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  LossArgs args;
  args.prob_sums = stats.prob_sums.as<double>();
  args.counts = stats.counts.as<float>();
  args.global_counts = norms.global_counts.data ? norms.global_counts.as<float>() : nullptr;
  args.lse_sq_sum = stats.lse_sq_sum.as<double>();
  args.num_sequences = plan.num_sequences;
  args.num_experts = static_cast<int>(plan.num_experts);
  args.num_terms = static_cast<int>(config.aux_losses.size());
  const double k = static_cast<double>(plan.topk), e = static_cast<double>(plan.num_experts);
  for (int i = 0; i < args.num_terms; ++i) {
    const AuxLossTerm& term = config.aux_losses[i];
    double n = norms.global_num_tokens;
    if (term.type == AuxLossType::kAuxLoss) {
      n = norms.aux_num_tokens > 0 ? norms.aux_num_tokens : plan.num_tokens;
    } else if (term.type == AuxLossType::kSeqAuxLoss) {
      n = norms.seq_num_tokens > 0 ? norms.seq_num_tokens : plan.tokens_per_sequence;
    }
    args.types[i] = term.type;
    args.coef[i] = e * term.coeff / (k * n * n);
  }
  args.dp_size = norms.dp_size;
  args.z_loss_coeff = config.z_loss_coeff;
  args.num_tokens = static_cast<double>(plan.num_tokens);
  args.losses = losses.as<float>();
  args.grad_weights = grad_weights.as<float>();
  AuxLossValueKernel<<<1, kLossThreads, 0, s>>>(args);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(AuxLossValueKernel);
  return absl::OkStatus();
}

absl::Status AuxLossBackwardCuda(const Stream& stream, const RouterConfig& config,
                                 const AuxPlan& plan, const Tensor& logits,
                                 const Tensor& grad_weights, double aux_grad_scale,
                                 const Tensor& dlogits) {
  if (plan.num_tokens == 0) return absl::OkStatus();
  cudaStream_t s = stream.cuda_stream;
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  AuxBackwardArgs args;
  args.logits = logits.as<float>();
  args.grad_weights = grad_weights.as<float>();
  args.dlogits = dlogits.as<float>();
  args.num_tokens = plan.num_tokens;
  args.tokens_per_sequence = plan.tokens_per_sequence;
  args.num_experts = static_cast<int>(plan.num_experts);
  args.sigmoid = plan.sigmoid;
  args.z_coef = 2.0 * config.z_loss_coeff / static_cast<double>(plan.num_tokens);
  args.scale = aux_grad_scale;
  DispatchLaneWidth(args.num_experts, [&](auto nj) {
    AuxBackwardKernel<decltype(nj)::value>
        <<<BlocksFor(plan.num_tokens, kWarpsPerBlock), kWarpsPerBlock * 32, 0, s>>>(args);
  });
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(AuxBackwardKernel);
  return absl::OkStatus();
}

}  // namespace switchyard::kernels::internal
