// File: bench/bench_util.h
//
// Shared timing helper of the benchmark binaries.
#ifndef SWITCHYARD_BENCH_BENCH_UTIL_H_
#define SWITCHYARD_BENCH_BENCH_UTIL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cuda_status.h"
#include "common/status.h"

namespace switchyard::bench {

// Median milliseconds of `iters` calls of `fn` (returns absl::Status; enqueues work on the legacy
// default stream), timed with CUDA events after `warmup` untimed calls.
template <typename Fn>
absl::StatusOr<double> MedianMs(Fn fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) SY_RETURN_IF_ERROR(fn());
  SY_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  std::vector<double> ms;
  cudaEvent_t a, b;
  SY_CUDA_RETURN_IF_ERROR(cudaEventCreate(&a));
  SY_CUDA_RETURN_IF_ERROR(cudaEventCreate(&b));
  for (int i = 0; i < iters; ++i) {
    SY_CUDA_RETURN_IF_ERROR(cudaEventRecord(a));
    SY_RETURN_IF_ERROR(fn());
    SY_CUDA_RETURN_IF_ERROR(cudaEventRecord(b));
    SY_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(b));
    float t = 0;
    SY_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace switchyard::bench

#endif  // SWITCHYARD_BENCH_BENCH_UTIL_H_
