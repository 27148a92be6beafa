// Device-side ordered reductions shared by the .cu files.
#ifndef SWITCHYARD_KERNELS_DEVICE_REDUCE_CUH_
#define SWITCHYARD_KERNELS_DEVICE_REDUCE_CUH_

namespace switchyard::kernels {

// Sums `count` values at p[0], p[stride], ... strictly in index order, from 0 (bitwise what a
// sequential CPU loop gives when the file is compiled with -fmad=false or the adds are plain adds:
// they are never reordered), but with kBatch independent loads in flight. The callers read
// partials that a previous kernel just wrote (in L2): a plain loop waits ~0.15 us of load latency
// per few elements, e.g. ~10 us for 256 partials, once per call of a small kernel.
template <typename T, int kBatch = 16>
__device__ __forceinline__ T OrderedSum(const T* p, long long count, long long stride) {
  T acc = T(0);
  long long c = 0;
  for (; c + kBatch <= count; c += kBatch) {
    T v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) v[u] = p[(c + u) * stride];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) acc += v[u];
  }
  for (; c < count; ++c) acc += p[c * stride];
  return acc;
}

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_DEVICE_REDUCE_CUH_
