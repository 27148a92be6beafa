// CUDA helper of the allgather dispatcher (allgather_dispatcher.h): the local-expert filter of the
// gathered top-k ids, one thread per (token, slot), no host synchronisation.
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/tensor.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::model::internal {
namespace {

constexpr int kThreads = 256;

// local[i] = global[i] - first when global[i] is one of this rank's experts [first, first + L),
// else -1 (dropped for this rank).
__global__ void LocalExpertIdsKernel(const int32_t* __restrict__ global, int64_t n, int32_t first,
                                     int32_t num_local, int32_t* __restrict__ local) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t e = global[i];
  local[i] = e >= first && e < first + num_local ? e - first : -1;
}

}  // namespace

absl::Status LocalExpertIdsCuda(const Stream& stream, const Tensor& global_idx, int first,
                                int num_local, const Tensor& local_idx) {
  const int64_t n = global_idx.numel();
  if (n == 0) return absl::OkStatus();
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  LocalExpertIdsKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream.cuda_stream>>>(
      global_idx.as<int32_t>(), n, first, num_local, local_idx.as<int32_t>());
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(LocalExpertIdsKernel);
  return absl::OkStatus();
}

}  // namespace switchyard::model::internal
