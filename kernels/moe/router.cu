// CUDA router (router.h): per-token routing and its backward (one warp per token, each lane owning
// experts lane + 32·j in registers), the expert-bias update, input jitter and the bf16 cast of the
// gating backward. Compiled with -fmad=false: see router_math.h for why the CPU reference and
// these kernels produce the same bits.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/moe/rng.h"
#include "kernels/moe/router_device.h"
#include "kernels/moe/router_internal.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

constexpr int kWarpsPerBlock = 4;

struct TopkArgs {
  const float* logits;
  const float* bias;
  const double* d0;
  const double* d1;
  int num_tokens, num_experts, topk;
  KeyKind key;
  ProbKind prob;
  double scale;
  int use_bias, num_groups, group_topk;
  int* topk_idx;
  int* selected;
  float* probs;
  int* counts;
};

// Clears `avail` bits of experts outside the group_topk best groups (§1.4); `skey` and `gscore`
// are this warp's shared-memory rows [E] and [G].
template <int NJ>
__device__ void GroupMask(const TopkArgs& a, const double* key, double* skey, double* gscore,
                          unsigned* avail) {
  const int lane = threadIdx.x & 31, e_count = a.num_experts, g_count = a.num_groups;
  const int gs = e_count / g_count, per = a.topk / a.group_topk;
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    if (lane + 32 * j < e_count) skey[lane + 32 * j] = key[j];
  }
  __syncwarp();
  for (int grp = lane; grp < g_count; grp += 32) {
    int chosen[kRouterMaxTopk];
    double s = 0.0;
    for (int r = 0; r < per; ++r) {
      int best = -1;
      double bv = 0.0;
      for (int i = 0; i < gs; ++i) {
        const int e = grp * gs + i;
        bool taken = false;
        for (int q = 0; q < r; ++q) taken |= chosen[q] == e;
        if (!taken && Better(skey[e], e, bv, best)) bv = skey[e], best = e;
      }
      chosen[r] = best;
      s += bv;
    }
    gscore[grp] = s;
  }
  __syncwarp();
  int groups[kRouterMaxTopk];
  for (int r = 0; r < a.group_topk; ++r) {
    double bv = 0.0;
    int bi = -1;
    for (int grp = lane; grp < g_count; grp += 32) {
      bool taken = false;
      for (int q = 0; q < r; ++q) taken |= groups[q] == grp;
      if (!taken && Better(gscore[grp], grp, bv, bi)) bv = gscore[grp], bi = grp;
    }
    WarpBest(&bv, &bi);
    groups[r] = bi;
  }
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    const int grp = (lane + 32 * j) / gs;
    bool in = false;
    for (int r = 0; r < a.group_topk; ++r) in |= groups[r] == grp;
    if (!in) *avail &= ~(1u << j);
  }
}

// Sum over slots r = 0 .. k-1 of lane r's v, in slot order from 0.0 (the CPU's sequential sums
// over slots), in every lane.
__device__ inline double SlotOrderSum(int k, double v) {
  double s = 0.0;
  for (int r = 0; r < k; ++r) s += __shfl_sync(kFullMask, v, r);
  return s;
}

// SlotProbs (router_internal.h) with slot r's logit zs in lane r: lane r < k returns p[r]. One
// exp / sigmoid per lane instead of the k (2k for the top-k softmax) that every lane computed;
// the sums over slots gather the lanes' terms in slot order, so the same bits. kFullSoftmax takes
// the row's (max, sum).
__device__ inline double LaneSlotProb(ProbKind kind, int k, double zs, double full_mx,
                                      double full_sum, double scale) {
  const bool mine = (threadIdx.x & 31) < k;
  if (kind == ProbKind::kFullSoftmax) return mine ? Exp(zs - full_mx) / full_sum * scale : 0.0;
  if (kind == ProbKind::kTopkSoftmax) {
    double m = __shfl_sync(kFullMask, zs, 0);  // SlotSoftmaxNorm's max, in its order
    for (int r = 1; r < k; ++r) {
      const double o = __shfl_sync(kFullMask, zs, r);
      m = o > m ? o : m;
    }
    const double e = mine ? Exp(zs - m) : 0.0;
    const double sum = SlotOrderSum(k, e);
    return mine ? e / sum * scale : 0.0;
  }
  if (kind == ProbKind::kSigmoidNormalized) {
    const double sg = mine ? Sigmoid(zs) : 0.0;
    const double d = SlotOrderSum(k, sg) + router_math::kSigmoidNormEps;
    return mine ? sg / d * scale : 0.0;
  }
  return mine ? Sigmoid(zs) * scale : 0.0;  // kSigmoid
}

// SlotGrads (router_internal.h) for the slot-local kinds with slot r's logit and incoming
// gradient in lane r: lane r < k returns dz[r]; sums over slots in slot order (same bits).
__device__ inline double LaneSlotGrad(ProbKind kind, int k, double zs, double g, double scale) {
  const bool mine = (threadIdx.x & 31) < k;
  if (kind == ProbKind::kTopkSoftmax) {
    double m = __shfl_sync(kFullMask, zs, 0);
    for (int r = 1; r < k; ++r) {
      const double o = __shfl_sync(kFullMask, zs, r);
      m = o > m ? o : m;
    }
    const double e = mine ? Exp(zs - m) : 0.0;
    const double sum = SlotOrderSum(k, e);
    const double pr = mine ? e / sum : 0.0;
    const double dot = SlotOrderSum(k, mine ? pr * (g * scale) : 0.0);
    return mine ? pr * (g * scale - dot) : 0.0;
  }
  if (kind == ProbKind::kSigmoidNormalized) {
    const double sg = mine ? Sigmoid(zs) : 0.0;
    const double d = SlotOrderSum(k, sg) + router_math::kSigmoidNormEps;
    const double dot = SlotOrderSum(k, mine ? sg / d * (g * scale) : 0.0);
    return mine ? (g * scale - dot) / d * (sg * (1.0 - sg)) : 0.0;
  }
  if (!mine) return 0.0;  // kSigmoid
  const double sg = Sigmoid(zs);
  return g * scale * (sg * (1.0 - sg));
}

template <int NJ>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) RouterTopkKernel(TopkArgs a) {
  extern __shared__ double smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long t = static_cast<long long>(blockIdx.x) * kWarpsPerBlock + warp;
  if (t >= a.num_tokens) return;  // warp-uniform
  const int e_count = a.num_experts, k = a.topk;
  const float* z = a.logits + t * e_count;
  double mx = 0.0, sum = 1.0;
  if (a.key == KeyKind::kSoftmax || a.prob == ProbKind::kFullSoftmax) {
    RowSoftmaxNorm<NJ>(z, e_count, &mx, &sum);
  }
  double key[NJ];
  unsigned avail = 0;
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    const int e = lane + 32 * j;
    key[j] = 0.0;
    if (e < e_count) {
      const double ze = z[e];
      switch (a.key) {
        case KeyKind::kLogit:
          key[j] = ze;
          break;
        case KeyKind::kSoftmax:
          key[j] = Exp(ze - mx) / sum;
          break;
        case KeyKind::kSigmoid:
          key[j] = Sigmoid(ze) + static_cast<double>(a.use_bias ? a.bias[e] : 0.0f);
          break;
        case KeyKind::kSinkhorn:
          key[j] = a.d1[e] * Exp(ze) * a.d0[t];
          break;
      }
      avail |= 1u << j;
    }
  }
  if (a.num_groups > 0) {
    double* skey = smem + warp * (e_count + a.num_groups);
    GroupMask<NJ>(a, key, skey, skey + e_count, &avail);
  }
  // Slot r's expert and logit end up in lane r (k <= kRouterMaxTopk <= 32).
  int my_sel = -1;
  double my_z = 0.0;
  for (int r = 0; r < k; ++r) {
    double bv = 0.0;
    int bi = -1;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      if (((avail >> j) & 1u) && Better(key[j], lane + 32 * j, bv, bi)) {
        bv = key[j];
        bi = lane + 32 * j;
      }
    }
    if (a.key == KeyKind::kLogit) {  // keys are the fp32 logits
      bi = WarpBestFloatKey(static_cast<float>(bv), bi);
    } else {
      WarpBest(&bv, &bi);
    }
    if ((bi & 31) == lane) avail &= ~(1u << (bi >> 5));
    const double zr = z[bi];
    if (lane == r) {
      my_sel = bi;
      my_z = zr;
    }
  }
  const double p = LaneSlotProb(a.prob, k, my_z, mx, sum, a.scale);
  if (lane < k) {
    a.topk_idx[t * k + lane] = my_sel;
    a.selected[t * k + lane] = my_sel;
    a.probs[t * k + lane] = static_cast<float>(p);
    atomicAdd(&a.counts[my_sel], 1);  // integer: order-independent
  }
}

struct BackwardArgs {
  const float* logits;
  const int* selected;
  const int* topk_idx;
  const float* dprobs;
  float* dlogits;
  int num_tokens, num_experts, topk;
  ProbKind prob;
  double scale;
};

template <int NJ>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) RouterBackwardKernel(BackwardArgs a) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long t = static_cast<long long>(blockIdx.x) * kWarpsPerBlock + warp;
  if (t >= a.num_tokens) return;
  const int e_count = a.num_experts, k = a.topk;
  const float* z = a.logits + t * e_count;
  float* out = a.dlogits + t * e_count;
  // Slot r in lane r (k <= 32).
  int my_sel = -1;
  double my_z = 0.0, my_g = 0.0;
  if (lane < k) {
    my_sel = a.selected[t * k + lane];
    my_z = z[my_sel];
    my_g = a.topk_idx[t * k + lane] < 0 ? 0.0 : static_cast<double>(a.dprobs[t * k + lane]);
  }
  // v[j]: the slot value of expert lane + 32·j (the last slot that selected it, as the CPU scan).
  double v[NJ];
#pragma unroll
  for (int j = 0; j < NJ; ++j) v[j] = 0.0;
  if (a.prob == ProbKind::kFullSoftmax) {
    double mx, sum;
    RowSoftmaxNorm<NJ>(z, e_count, &mx, &sum);
    const double term = lane < k ? Exp(my_z - mx) / sum * (my_g * a.scale) : 0.0;
    const double dot = SlotOrderSum(k, term);
    for (int r = 0; r < k; ++r) {
      const int sr = __shfl_sync(kFullMask, my_sel, r);
      const double gr = __shfl_sync(kFullMask, my_g, r);
#pragma unroll
      for (int j = 0; j < NJ; ++j) v[j] = sr == lane + 32 * j ? gr * a.scale : v[j];
    }
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const int e = lane + 32 * j;
      if (e >= e_count) continue;
      out[e] = static_cast<float>(Exp(static_cast<double>(z[e]) - mx) / sum * (v[j] - dot));
    }
  } else {
    const double dz = LaneSlotGrad(a.prob, k, my_z, my_g, a.scale);
    for (int r = 0; r < k; ++r) {
      const int sr = __shfl_sync(kFullMask, my_sel, r);
      const double dr = __shfl_sync(kFullMask, dz, r);
#pragma unroll
      for (int j = 0; j < NJ; ++j) v[j] = sr == lane + 32 * j ? dr : v[j];
    }
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const int e = lane + 32 * j;
      if (e < e_count) out[e] = static_cast<float>(v[j]);
    }
  }
}

__global__ void UpdateExpertBiasKernel(float* counts, float* bias, int e_count, float rate) {
  __shared__ double mean;
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int e = 0; e < e_count; ++e) total += counts[e];
    mean = total / e_count;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < e_count; e += blockDim.x) {
    const double d = mean - counts[e];
    bias[e] = bias[e] + (d > 0 ? rate : d < 0 ? -rate : 0.0f);
    counts[e] = 0.0f;
  }
}

__device__ inline float ToFloat(float v) { return v; }
__device__ inline float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline void Store(float* p, float v) { *p = v; }
__device__ inline void Store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <typename T>
__global__ void JitterScaleKernel(const T* in, T* out, long long n, float eps, uint64_t seed,
                                  uint64_t offset) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    Store(out + i, ToFloat(in[i]) * JitterMultiplier(eps, seed, offset + i));
  }
}

__global__ void CastF32ToBf16Kernel(const float* in, __nv_bfloat16* out, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(in[i]);
  }
}

unsigned ElementwiseBlocks(long long n) {
  const long long b = (n + 255) / 256;
  return static_cast<unsigned>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

}  // namespace

absl::Status RouterForwardCuda(const Stream& stream, const RoutingPlan& plan, const Tensor& logits,
                               const Tensor& expert_bias, const Tensor& local_tokens_per_expert,
                               const RouterOutputs& out, const Tensor& workspace) {
  cudaStream_t s = stream.cuda_stream;
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  const RouterWorkspaceLayout layout = MakeRouterWorkspaceLayout(plan);
  char* ws = static_cast<char*>(workspace.data);
  const int e_count = static_cast<int>(plan.num_experts);
  int* counts = reinterpret_cast<int*>(ws + layout.counts);
  SY_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(counts, 0, sizeof(int) * e_count, s));
  if (plan.num_tokens > 0) {
    if (plan.key == KeyKind::kSinkhorn) {
      SY_RETURN_IF_ERROR(SinkhornCuda(stream, plan, logits.as<float>(), layout, ws));
    }
    TopkArgs args;
    args.logits = logits.as<float>();
    args.bias = plan.use_bias ? expert_bias.as<float>() : nullptr;
    args.d0 = reinterpret_cast<const double*>(ws + layout.d0);
    args.d1 = reinterpret_cast<const double*>(ws + layout.d1);
    args.num_tokens = static_cast<int>(plan.num_tokens);
    args.num_experts = e_count;
    args.topk = static_cast<int>(plan.topk);
    args.key = plan.key;
    args.prob = plan.prob;
    args.scale = plan.scale;
    args.use_bias = plan.use_bias;
    args.num_groups = plan.num_groups;
    args.group_topk = plan.group_topk;
    args.topk_idx = out.topk_idx.as<int>();
    args.selected = out.selected_idx.as<int>();
    args.probs = out.topk_probs.as<float>();
    args.counts = counts;
    const size_t smem =
        plan.num_groups > 0 ? sizeof(double) * kWarpsPerBlock * (e_count + plan.num_groups) : 0;
    const unsigned blocks = BlocksFor(plan.num_tokens, kWarpsPerBlock);
    DispatchLaneWidth(e_count, [&](auto nj) {
      RouterTopkKernel<decltype(nj)::value><<<blocks, kWarpsPerBlock * 32, smem, s>>>(args);
    });
    SY_CUDA_RETURN_IF_LAUNCH_ERROR(RouterTopkKernel);
  }
  float* local = plan.count_for_bias ? local_tokens_per_expert.as<float>() : nullptr;
  return DropOverCapacityCuda(stream, plan, out, local, layout, ws);
}

absl::Status RouterBackwardCuda(const Stream& stream, const RoutingPlan& plan, const Tensor& logits,
                                const Tensor& selected_idx, const Tensor& topk_idx,
                                const Tensor& dtopk_probs, const Tensor& dlogits) {
  if (plan.num_tokens == 0) return absl::OkStatus();
  cudaStream_t s = stream.cuda_stream;
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  BackwardArgs args;
  args.logits = logits.as<float>();
  args.selected = selected_idx.as<int>();
  args.topk_idx = topk_idx.as<int>();
  args.dprobs = dtopk_probs.as<float>();
  args.dlogits = dlogits.as<float>();
  args.num_tokens = static_cast<int>(plan.num_tokens);
  args.num_experts = static_cast<int>(plan.num_experts);
  args.topk = static_cast<int>(plan.topk);
  args.prob = plan.prob;
  args.scale = plan.scale;
  const unsigned blocks = BlocksFor(plan.num_tokens, kWarpsPerBlock);
  DispatchLaneWidth(args.num_experts, [&](auto nj) {
    RouterBackwardKernel<decltype(nj)::value><<<blocks, kWarpsPerBlock * 32, 0, s>>>(args);
  });
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(RouterBackwardKernel);
  return absl::OkStatus();
}

absl::Status UpdateExpertBiasCuda(const Stream& stream, const Tensor& counts, const Tensor& bias,
                                  float rate) {
  cudaStream_t s = stream.cuda_stream;
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  UpdateExpertBiasKernel<<<1, 512, 0, s>>>(counts.as<float>(), bias.as<float>(),
                                           static_cast<int>(bias.numel()), rate);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(UpdateExpertBiasKernel);
  return absl::OkStatus();
}

absl::Status JitterScaleCuda(const Stream& stream, const Tensor& in, float eps, uint64_t seed,
                             uint64_t offset, const Tensor& out) {
  const long long n = in.numel();
  if (n == 0) return absl::OkStatus();
  cudaStream_t s = stream.cuda_stream;
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  if (in.dtype == DType::kF32) {
    JitterScaleKernel<<<ElementwiseBlocks(n), 256, 0, s>>>(in.as<float>(), out.as<float>(), n, eps,
                                                           seed, offset);
  } else {
    JitterScaleKernel<<<ElementwiseBlocks(n), 256, 0, s>>>(
        in.as<__nv_bfloat16>(), out.as<__nv_bfloat16>(), n, eps, seed, offset);
  }
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(JitterScaleKernel);
  return absl::OkStatus();
}

absl::Status CastF32ToBf16Cuda(const Stream& stream, const Tensor& in, const Tensor& out) {
  const long long n = in.numel();
  if (n == 0) return absl::OkStatus();
  cudaStream_t s = stream.cuda_stream;
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  CastF32ToBf16Kernel<<<ElementwiseBlocks(n), 256, 0, s>>>(in.as<float>(), out.as<__nv_bfloat16>(),
                                                           n);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(CastF32ToBf16Kernel);
  return absl::OkStatus();
}

}  // namespace switchyard::kernels::internal
