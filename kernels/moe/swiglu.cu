// CUDA path of the weighted SwiGLU (swiglu.h). One block per row (grid-stride over the valid
// rows), each thread moving V elements (8 bf16 / 4 f32 = 16 bytes) of gate, lin and output per
// step; fp32 math; dprobs is a fixed-order block reduction. Every block reads the valid-row count
// (sum of row_counts) on the device, so nothing synchronises with the host and rows past the
// count are never touched.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/device_convert.cuh"
#include "kernels/moe/swiglu.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

constexpr int kMaxThreads = 256;
constexpr int kMaxBlocks = 4096;

// Sum over the block in a fixed order (warp shuffles, then warp 0 over the warp partials).
// Every thread must call it; the result is valid in every thread.
template <typename A>
__device__ A BlockSum(A v) {
  __shared__ A partial[kMaxThreads / 32];
  __shared__ A result;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    A s = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) s += partial[w];
    result = s;
  }
  __syncthreads();
  const A out = result;
  __syncthreads();  // `partial`/`result` may be reused by the next call
  return out;
}

// min(sum of max(counts, 0), n); n when counts is null.
__device__ int64_t ValidRows(const int32_t* __restrict__ counts, int num_counts, int64_t n) {
  if (counts == nullptr) return n;
  long long s = 0;
  for (int i = threadIdx.x; i < num_counts; i += blockDim.x) s += max(counts[i], 0);
  return min(static_cast<int64_t>(BlockSum<long long>(s)), n);
}

__device__ __forceinline__ float Sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

template <typename T, int V>
__global__ void __launch_bounds__(kMaxThreads)
    SwigluForwardKernel(const T* __restrict__ h, const float* __restrict__ probs,
                        const int32_t* __restrict__ counts, int num_counts, int64_t n, int64_t f,
                        T* __restrict__ a) {
  using P = Pack<T, V>;
  const int64_t rows = ValidRows(counts, num_counts, n);
  const int64_t units = f / V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float p = probs != nullptr ? probs[r] : 1.0f;
    const P* gate = reinterpret_cast<const P*>(h + r * 2 * f);
    const P* lin = reinterpret_cast<const P*>(h + r * 2 * f + f);
    P* out = reinterpret_cast<P*>(a + r * f);
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
      const P g = gate[u], l = lin[u];
      P o;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float gv = ToFloat(g.v[i]);
        o.v[i] = FromFloat<T>(gv * Sigmoid(gv) * ToFloat(l.v[i]) * p);
      }
      out[u] = o;
    }
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kMaxThreads)
    SwigluBackwardKernel(const T* __restrict__ da, const T* __restrict__ h,
                         const float* __restrict__ probs, const int32_t* __restrict__ counts,
                         int num_counts, int64_t n, int64_t f, T* __restrict__ dh,
                         float* __restrict__ dprobs) {
  using P = Pack<T, V>;
  const int64_t rows = ValidRows(counts, num_counts, n);
  const int64_t units = f / V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {  // block-uniform: BlockSum is safe
    const float p = probs != nullptr ? probs[r] : 1.0f;
    const P* gate = reinterpret_cast<const P*>(h + r * 2 * f);
    const P* lin = reinterpret_cast<const P*>(h + r * 2 * f + f);
    const P* grad = reinterpret_cast<const P*>(da + r * f);
    P* dgate = reinterpret_cast<P*>(dh + r * 2 * f);
    P* dlin = reinterpret_cast<P*>(dh + r * 2 * f + f);
    float dot = 0.0f;
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
      const P g = gate[u], l = lin[u], d = grad[u];
      P og, ol;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float gv = ToFloat(g.v[i]), lv = ToFloat(l.v[i]), dv = ToFloat(d.v[i]);
        const float sig = Sigmoid(gv), silu = gv * sig;
        dot += dv * silu * lv;
        const float dp = dv * p;
        og.v[i] = FromFloat<T>(dp * lv * sig * (1.0f + gv * (1.0f - sig)));
        ol.v[i] = FromFloat<T>(dp * silu);
      }
      dgate[u] = og;
      dlin[u] = ol;
    }
    if (dprobs != nullptr) {
      const float total = BlockSum<float>(dot);
      if (threadIdx.x == 0) dprobs[r] = total;
    }
  }
}

bool Aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

struct Launch {
  dim3 grid, block;
};

Launch LaunchFor(int64_t n, int64_t units) {
  const int threads =
      static_cast<int>(std::clamp<int64_t>((units + 31) / 32 * 32, 32, kMaxThreads));
  return {dim3(static_cast<unsigned>(std::min<int64_t>(n, kMaxBlocks))), dim3(threads)};
}

template <typename T, int V>
absl::Status ForwardAs(cudaStream_t cs, const Tensor& h, const Tensor& probs,
                       const Tensor& row_counts, const Tensor& a) {
  const int64_t n = h.dim(0), f = a.dim(1);
  const Launch l = LaunchFor(n, f / V);
  SwigluForwardKernel<T, V><<<l.grid, l.block, 0, cs>>>(
      static_cast<const T*>(h.data), probs.as<float>(), row_counts.as<int32_t>(),
      static_cast<int>(row_counts.data ? row_counts.numel() : 0), n, f, static_cast<T*>(a.data));
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(SwigluForwardKernel);
  return absl::OkStatus();
}

template <typename T, int V>
absl::Status BackwardAs(cudaStream_t cs, const Tensor& da, const Tensor& h, const Tensor& probs,
                        const Tensor& row_counts, const Tensor& dh, const Tensor& dprobs) {
  const int64_t n = h.dim(0), f = da.dim(1);
  const Launch l = LaunchFor(n, f / V);
  SwigluBackwardKernel<T, V><<<l.grid, l.block, 0, cs>>>(
      static_cast<const T*>(da.data), static_cast<const T*>(h.data), probs.as<float>(),
      row_counts.as<int32_t>(), static_cast<int>(row_counts.data ? row_counts.numel() : 0), n, f,
      static_cast<T*>(dh.data), dprobs.as<float>());
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(SwigluBackwardKernel);
  return absl::OkStatus();
}

}  // namespace

absl::Status SwigluForwardCuda(const Stream& stream, const Tensor& h, const Tensor& probs,
                               const Tensor& row_counts, const Tensor& a) {
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  const cudaStream_t cs = stream.cuda_stream;
  if (h.dim(0) == 0 || a.dim(1) == 0) return absl::OkStatus();
  const int64_t f = a.dim(1);
  const bool aligned = Aligned16({h.data, a.data});
  if (h.dtype == DType::kBF16) {
    if (aligned && f % 8 == 0) return ForwardAs<__nv_bfloat16, 8>(cs, h, probs, row_counts, a);
    return ForwardAs<__nv_bfloat16, 1>(cs, h, probs, row_counts, a);
  }
  if (aligned && f % 4 == 0) return ForwardAs<float, 4>(cs, h, probs, row_counts, a);
  return ForwardAs<float, 1>(cs, h, probs, row_counts, a);
}

absl::Status SwigluBackwardCuda(const Stream& stream, const Tensor& da, const Tensor& h,
                                const Tensor& probs, const Tensor& row_counts, const Tensor& dh,
                                const Tensor& dprobs) {
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  const cudaStream_t cs = stream.cuda_stream;
  if (h.dim(0) == 0) return absl::OkStatus();
  const int64_t f = da.dim(1);
  const bool aligned = Aligned16({da.data, h.data, dh.data});
  if (h.dtype == DType::kBF16) {
    if (aligned && f % 8 == 0) {
      return BackwardAs<__nv_bfloat16, 8>(cs, da, h, probs, row_counts, dh, dprobs);
    }
    return BackwardAs<__nv_bfloat16, 1>(cs, da, h, probs, row_counts, dh, dprobs);
  }
  if (aligned && f % 4 == 0) return BackwardAs<float, 4>(cs, da, h, probs, row_counts, dh, dprobs);
  return BackwardAs<float, 1>(cs, da, h, probs, row_counts, dh, dprobs);
}

}  // namespace switchyard::kernels::internal
