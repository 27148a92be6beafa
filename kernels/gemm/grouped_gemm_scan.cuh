// File: kernels/gemm/grouped_gemm_scan.cuh
//
// Device helpers shared by the grouped GEMM setup kernels: a block-wide exclusive scan and the
// clamping of device-side group counts to a row capacity (see grouped_gemm.h).
#ifndef SWITCHYARD_KERNELS_GEMM_GROUPED_GEMM_SCAN_CUH_
#define SWITCHYARD_KERNELS_GEMM_GROUPED_GEMM_SCAN_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace switchyard::kernels::internal {

// Threads of the one-block setup kernels.
inline constexpr int kSetupThreads = 1024;

// Exclusive scan of value(0..n-1) (non-negative int64) over one 1-D block whose size is a multiple
// of 32 (at most 1024). Every thread of the block must call it. emit(i, exclusive_prefix, value)
// runs once for each i < n, on the thread that loaded value(i). Returns the total on all threads.
template <class ValueFn, class EmitFn>
__device__ int64_t BlockExclusiveScan(int n, ValueFn value, EmitFn emit) {
  __shared__ int64_t warp_totals[32];
  __shared__ int64_t carry;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int base = 0; base < n; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const int64_t v = i < n ? value(i) : 0;
    int64_t x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    if (lane == 31) warp_totals[warp] = x;
    __syncthreads();
    if (warp == 0) {
      int64_t t = lane < num_warps ? warp_totals[lane] : 0;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int64_t y = __shfl_up_sync(0xffffffffu, t, o);
        if (lane >= o) t += y;
      }
      if (lane < num_warps) warp_totals[lane] = t;  // inclusive over warps
    }
    __syncthreads();
    const int64_t inclusive = carry + x + (warp > 0 ? warp_totals[warp - 1] : 0);
    if (i < n) emit(i, inclusive - v, v);
    __syncthreads();  // all threads have read carry and warp_totals
    if (threadIdx.x == blockDim.x - 1) carry = inclusive;
    __syncthreads();
  }
  return carry;
}

// Group rows after clamping to the capacity: a negative count is 0, and rows at or past
// `capacity` are dropped. `raw_offset` is the exclusive prefix sum of the (non-negative) counts.
struct GroupRows {
  int64_t offset;  // first row, <= capacity
  int32_t rows;    // rows of the group after clamping
};

__device__ inline GroupRows ClampGroup(int64_t raw_offset, int64_t count, int64_t capacity) {
  GroupRows r;
  r.offset = raw_offset < capacity ? raw_offset : capacity;
  const int64_t room = capacity - raw_offset;
  r.rows = static_cast<int32_t>(room <= 0 ? 0 : (count < room ? count : room));
  return r;
}

__device__ inline int64_t NonNegativeCount(const int32_t* counts, int g) {
  const int32_t c = counts[g];
  return c > 0 ? c : 0;
}

}  // namespace switchyard::kernels::internal

#endif  // SWITCHYARD_KERNELS_GEMM_GROUPED_GEMM_SCAN_CUH_
