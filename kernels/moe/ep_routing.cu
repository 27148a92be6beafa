// CUDA path of the EP routing metadata ops (ep_routing.h): one thread per token (RouteToRanks:
// its k slots, its P rank flags and its 2k meta values) or per (row, slot) (LocalizeRouting).
// Integer tests and copies only, so the results equal the CPU reference bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/moe/ep_routing.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

__global__ void RouteToRanksKernel(const int32_t* __restrict__ idx, const float* __restrict__ probs,
                                   int64_t t, int k, int num_experts, int local, int ep,
                                   int32_t* __restrict__ rank_idx, float* __restrict__ meta) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < t;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int32_t* ranks = rank_idx + i * ep;
    for (int j = 0; j < ep; ++j) ranks[j] = -1;
    for (int s = 0; s < k; ++s) {
      int32_t e = idx[i * k + s];
      if (e < -1 || e >= num_experts) e = -1;  // invalid ids are dropped (as Permute does)
      if (e >= 0) ranks[e / local] = e / local;
      meta[i * 2 * k + s] = static_cast<float>(e);
      meta[i * 2 * k + k + s] = probs[i * k + s];
    }
  }
}

__global__ void LocalizeRoutingKernel(const float* __restrict__ meta, int64_t r, int k,
                                      int64_t first, int64_t local, int32_t* __restrict__ local_idx,
                                      float* __restrict__ local_probs) {
  for (int64_t f = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; f < r * k;
       f += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = f / k, s = f % k;
    const int64_t e = static_cast<int64_t>(meta[i * 2 * k + s]);
    local_idx[f] = e >= first && e < first + local ? static_cast<int32_t>(e - first) : -1;
    local_probs[f] = meta[i * 2 * k + k + s];
  }
}

unsigned Blocks(int64_t n) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min(kMaxBlocks, (n + kThreads - 1) / kThreads)));
}

}  // namespace

absl::Status RouteToRanksCuda(const Stream& stream, const Tensor& topk_idx,
                              const Tensor& topk_probs, int64_t num_experts, int64_t ep_size,
                              const Tensor& rank_idx, const Tensor& meta) {
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  const int64_t t = topk_idx.dim(0);
  const int k = static_cast<int>(topk_idx.dim(1));
  RouteToRanksKernel<<<Blocks(t), kThreads, 0, stream.cuda_stream>>>(
      topk_idx.as<int32_t>(), topk_probs.as<float>(), t, k, static_cast<int>(num_experts),
      static_cast<int>(num_experts / ep_size), static_cast<int>(ep_size), rank_idx.as<int32_t>(),
      meta.as<float>());
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(RouteToRanksKernel);
  return absl::OkStatus();
}

absl::Status LocalizeRoutingCuda(const Stream& stream, const Tensor& meta, int64_t first_expert,
                                 int64_t num_local, const Tensor& local_idx,
                                 const Tensor& local_probs) {
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  const int64_t r = meta.dim(0);
  const int k = static_cast<int>(meta.dim(1) / 2);
  LocalizeRoutingKernel<<<Blocks(r * k), kThreads, 0, stream.cuda_stream>>>(
      meta.as<float>(), r, k, first_expert, num_local, local_idx.as<int32_t>(),
      local_probs.as<float>());
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(LocalizeRoutingKernel);
  return absl::OkStatus();
}

}  // namespace switchyard::kernels::internal
