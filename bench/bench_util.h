// File: bench/bench_util.h
//
// Shared timing helper of the benchmark binaries.
#ifndef SWITCHYARD_BENCH_BENCH_UTIL_H_
#define SWITCHYARD_BENCH_BENCH_UTIL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "absl/status/statusor.h"
#include "common/status.h"
#include "kernels/runtime/cuda_status.h"
#include "kernels/runtime/stream.h"

namespace switchyard::bench {

// Median milliseconds of `iters` calls of `fn` (returns absl::Status; enqueues work on the legacy
// default stream), timed with CUDA events after `warmup` untimed calls.
template <typename Fn>
absl::StatusOr<double> MedianMs(Fn fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) SY_RETURN_IF_ERROR(fn());
  SY_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  std::vector<double> ms;
  int device = 0;
  SY_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  using kernels::Event;
  SY_ASSIGN_OR_RETURN(Event a, Event::Create(Device::Cuda(device), Event::Timing::kOn));
  SY_ASSIGN_OR_RETURN(Event b, Event::Create(Device::Cuda(device), Event::Timing::kOn));
  const Stream legacy{Device::Cuda(device), nullptr};
  for (int i = 0; i < iters; ++i) {
    SY_RETURN_IF_ERROR(a.Record(legacy));
    SY_RETURN_IF_ERROR(fn());
    SY_RETURN_IF_ERROR(b.Record(legacy));
    SY_RETURN_IF_ERROR(b.Synchronize());
    SY_ASSIGN_OR_RETURN(const float t, b.ElapsedMsSince(a));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace switchyard::bench

#endif  // SWITCHYARD_BENCH_BENCH_UTIL_H_
