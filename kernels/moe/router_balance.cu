// CUDA parts of the router that reduce over tokens: the Sinkhorn scaling (one cooperative kernel
// with grid-wide syncs, iterating on the device until convergence: no host synchronisation) and
// capacity dropping (per-expert buckets, then each slot's rank among its expert's slots by
// brute-force comparison: deterministic whatever order the buckets were filled in).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/moe/router_device.h"
#include "kernels/moe/router_internal.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

namespace cg = cooperative_groups;

constexpr int kSinkhornThreads = 256;
constexpr int kDropThreads = 256;

// Cross-block data is read with __ldcg (L2, not the non-coherent L1) after each grid sync.
__global__ void __launch_bounds__(kSinkhornThreads)
    SinkhornKernel(const float* z, int t_count, int e_count, double* d0, double* d1,
                   double* d1_next, double* diff, double* partial, int* flag) {
  cg::grid_group grid = cg::this_grid();
  const int lane = threadIdx.x & 31;
  const long long tid = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long threads = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long warp = tid >> 5, warps = threads >> 5;
  const int chunk = router_math::kSinkhornChunk;
  const long long chunks = (t_count + chunk - 1) / chunk;
  for (long long e = tid; e < e_count; e += threads) d1[e] = 1.0;
  grid.sync();
  for (int it = 0; it < router_math::kSinkhornMaxIters; ++it) {
    // d0[t] = (1/T) / (Σ_e exp(z[t,e])·d1[e] + eps), a warp per row.
    for (long long t = warp; t < t_count; t += warps) {
      const float* row = z + t * e_count;
      double s = 0.0;
      for (int e = lane; e < e_count; e += 32) s += Exp(row[e]) * __ldcg(d1 + e);
      s = WarpSum(s);
      if (lane == 0) d0[t] = (1.0 / t_count) / (s + router_math::kSinkhornEps);
    }
    grid.sync();
    // Column partial sums over chunks of tokens, each summed in token order.
    for (long long w = tid; w < chunks * e_count; w += threads) {
      const long long c = w / e_count;
      const int e = static_cast<int>(w % e_count);
      const long long end = min(static_cast<long long>(t_count), (c + 1) * chunk);
      double acc = 0.0;
      for (long long t = c * chunk; t < end; ++t) acc += Exp(z[t * e_count + e]) * __ldcg(d0 + t);
      partial[w] = acc;
    }
    grid.sync();
    if (blockIdx.x == 0) {
      for (int e = threadIdx.x; e < e_count; e += blockDim.x) {
        double col = 0.0;
        for (long long c = 0; c < chunks; ++c) col += __ldcg(partial + c * e_count + e);
        const double next = (1.0 / e_count) / (col + router_math::kSinkhornEps);
        diff[e] = fabs(next - __ldcg(d1 + e));
        d1_next[e] = next;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        double err = 0.0;
        for (int e = 0; e < e_count; ++e) err += diff[e];
        for (int e = 0; e < e_count; ++e) d1[e] = d1_next[e];
        *flag = !(err / e_count > router_math::kSinkhornTol);
      }
    }
    grid.sync();
    if (__ldcg(flag)) break;  // every thread reads the same value: uniform exit
  }
}

__global__ void ScanCountsKernel(const int* counts, int e_count, int* offsets, int* cursor) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int acc = 0;
  for (int e = 0; e < e_count; ++e) {
    offsets[e] = acc;
    cursor[e] = acc;
    acc += counts[e];
  }
}

__global__ void BucketKernel(const int* selected, const float* probs, long long n, int* cursor,
                             int* bucket, float* bucket_key) {
  const long long a = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (a >= n) return;
  const int pos = atomicAdd(&cursor[selected[a]], 1);
  bucket[pos] = static_cast<int>(a);
  bucket_key[pos] = probs[a];
}

struct DropArgs {
  const int* counts;
  const int* offsets;
  const int* bucket;
  const float* bucket_key;
  int capacity, topk, position_policy;
  long long seq_length, num_sequences;
  int* topk_idx;
  float* probs;
};

// Block (x, e): the slots [x·256, x·256 + 256) of expert e's bucket. A slot is kept iff fewer than
// `capacity` slots of e come before it (probs: larger prob, then lower slot id; position: earlier
// position key).
__global__ void __launch_bounds__(kDropThreads) DropKernel(DropArgs a) {
  __shared__ int s_slot[kDropThreads];
  __shared__ float s_prob[kDropThreads];
  __shared__ long long s_pos[kDropThreads];
  const int e = blockIdx.y;
  const int n = a.counts[e];
  const int base = blockIdx.x * kDropThreads;
  if (n <= a.capacity || base >= n) return;  // block-uniform
  const int off = a.offsets[e];
  const int i = base + threadIdx.x;
  const bool valid = i < n;
  int my_slot = 0;
  float my_prob = 0.0f;
  long long my_pos = 0;
  if (valid) {
    my_slot = a.bucket[off + i];
    my_prob = a.bucket_key[off + i];
    my_pos = router_math::PositionKey(my_slot / a.topk, a.seq_length, a.num_sequences);
  }
  int rank = 0;
  for (int tile = 0; tile < n; tile += kDropThreads) {
    const int j = tile + threadIdx.x;
    if (j < n) {
      s_slot[threadIdx.x] = a.bucket[off + j];
      s_prob[threadIdx.x] = a.bucket_key[off + j];
      s_pos[threadIdx.x] =
          router_math::PositionKey(s_slot[threadIdx.x] / a.topk, a.seq_length, a.num_sequences);
    }
    __syncthreads();
    if (valid) {
      const int m = min(kDropThreads, n - tile);
      for (int q = 0; q < m; ++q) {
        const bool before = a.position_policy ? s_pos[q] < my_pos
                                              : (s_prob[q] > my_prob ||
                                                 (s_prob[q] == my_prob && s_slot[q] < my_slot));
        rank += before;
      }
    }
    __syncthreads();
  }
  if (valid && rank >= a.capacity) {
    a.topk_idx[my_slot] = -1;
    a.probs[my_slot] = 0.0f;
  }
}

__global__ void FinalCountsKernel(const int* counts, int e_count, int capacity, int* tokens,
                                  float* local) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= e_count) return;
  const int c = capacity >= 0 ? min(counts[e], capacity) : counts[e];
  tokens[e] = c;
  if (local != nullptr) local[e] += static_cast<float>(c);
}

}  // namespace

absl::Status SinkhornCuda(const Stream& stream, const RoutingPlan& plan, const float* logits,
                          const RouterWorkspaceLayout& layout, char* workspace) {
  const int device = stream.device.index;
  int cooperative = 0, sms = 0, per_sm = 0;
  SY_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device));
  if (!cooperative) {
    return absl::FailedPreconditionError(
        "router sinkhorn (CUDA): the device does not support cooperative launches");
  }
  SY_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  SY_CUDA_RETURN_IF_ERROR(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, SinkhornKernel, kSinkhornThreads, 0));
  if (per_sm < 1) return absl::InternalError("router sinkhorn (CUDA): kernel cannot be resident");
  const long long t_count = plan.num_tokens;
  const long long chunks =
      (t_count + router_math::kSinkhornChunk - 1) / router_math::kSinkhornChunk;
  const long long wanted =
      std::max<long long>(BlocksFor(t_count * 32, kSinkhornThreads),
                          BlocksFor(chunks * plan.num_experts, kSinkhornThreads));
  const int blocks =
      static_cast<int>(std::max<long long>(1, std::min<long long>(wanted, 1LL * sms * per_sm)));
  const float* z = logits;
  int t = static_cast<int>(t_count), e = static_cast<int>(plan.num_experts);
  double* d0 = reinterpret_cast<double*>(workspace + layout.d0);
  double* d1 = reinterpret_cast<double*>(workspace + layout.d1);
  double* d1_next = reinterpret_cast<double*>(workspace + layout.d1_next);
  double* diff = reinterpret_cast<double*>(workspace + layout.diff);
  double* partial = reinterpret_cast<double*>(workspace + layout.partial);
  int* flag = reinterpret_cast<int*>(workspace + layout.flag);
  void* args[] = {&z, &t, &e, &d0, &d1, &d1_next, &diff, &partial, &flag};
  SY_CUDA_RETURN_IF_ERROR(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(SinkhornKernel),
                                                      dim3(blocks), dim3(kSinkhornThreads), args, 0,
                                                      stream.cuda_stream));
  return absl::OkStatus();
}

absl::Status DropOverCapacityCuda(const Stream& stream, const RoutingPlan& plan,
                                  const RouterOutputs& out, float* local_tokens_per_expert,
                                  const RouterWorkspaceLayout& layout, char* workspace) {
  cudaStream_t s = stream.cuda_stream;
  const int e_count = static_cast<int>(plan.num_experts);
  const int* counts = reinterpret_cast<const int*>(workspace + layout.counts);
  if (plan.capacity >= 0 && plan.num_tokens > 0) {
    int* offsets = reinterpret_cast<int*>(workspace + layout.offsets);
    int* cursor = reinterpret_cast<int*>(workspace + layout.cursor);
    int* bucket = reinterpret_cast<int*>(workspace + layout.bucket);
    float* bucket_key = reinterpret_cast<float*>(workspace + layout.bucket_key);
    ScanCountsKernel<<<1, 32, 0, s>>>(counts, e_count, offsets, cursor);
    SY_CUDA_RETURN_IF_LAUNCH_ERROR(ScanCountsKernel);
    const long long n = plan.num_tokens * plan.topk;
    BucketKernel<<<BlocksFor(n, 256), 256, 0, s>>>(
        out.selected_idx.as<int>(), out.topk_probs.as<float>(), n, cursor, bucket, bucket_key);
    SY_CUDA_RETURN_IF_LAUNCH_ERROR(BucketKernel);
    DropArgs args;
    args.counts = counts;
    args.offsets = offsets;
    args.bucket = bucket;
    args.bucket_key = bucket_key;
    args.capacity = static_cast<int>(plan.capacity);
    args.topk = static_cast<int>(plan.topk);
    args.position_policy = plan.position_policy;
    args.seq_length = plan.seq_length;
    args.num_sequences = plan.num_sequences;
    args.topk_idx = out.topk_idx.as<int>();
    args.probs = out.topk_probs.as<float>();
    // An expert holds at most T slots (top-k experts are distinct per token).
    const dim3 grid(BlocksFor(plan.num_tokens, kDropThreads), e_count);
    DropKernel<<<grid, kDropThreads, 0, s>>>(args);
    SY_CUDA_RETURN_IF_LAUNCH_ERROR(DropKernel);
  }
  FinalCountsKernel<<<BlocksFor(e_count, 256), 256, 0, s>>>(
      counts, e_count, static_cast<int>(plan.capacity), out.tokens_per_expert.as<int>(),
      local_tokens_per_expert);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(FinalCountsKernel);
  return absl::OkStatus();
}

}  // namespace switchyard::kernels::internal
