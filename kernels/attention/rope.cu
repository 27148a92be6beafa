// CUDA path of RoPE: each block takes rows t = blockIdx.x, blockIdx.x + gridDim.x, ...; per row it
// computes the D/2 (cos, sin) pairs once into shared memory (fp64 sincos of the fp32 angle,
// rounded to fp32, exactly as the CPU reference), then every thread rotates kVec pairs of one
// head at a time, loading x[i..i+kVec) and x[D/2+i..D/2+i+kVec) as vectors. fp32 math, with the
// explicit roundings of rope_device.cuh (shared with the fused QK-norm + RoPE kernels).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention/rope.h"
#include "kernels/attention/rope_device.cuh"
#include "kernels/device_convert.cuh"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

template <typename T, int kVec>
__global__ void RopeKernel(const T* x, T* out, InvFreqTable table, int64_t t_n, int64_t heads,
                           int64_t half, int64_t seq_len, RopeCp cp, float sign) {
  using P = Pack<T, kVec>;
  __shared__ float cs[kMaxRopeHeadDim];  // cos [0, half), sign * sin [half, 2 * half)
  const int64_t groups_per_head = half / kVec;
  const int64_t groups = heads * groups_per_head;
  for (int64_t t = blockIdx.x; t < t_n; t += gridDim.x) {
    __syncthreads();  // the previous row is done with cs
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      RopeCosSin(t, seq_len, cp, table.v[i], sign, &cs[i], &cs[half + i]);
    }
    __syncthreads();
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
      const int64_t head = g / groups_per_head;
      const int64_t i0 = (g - head * groups_per_head) * kVec;
      const int64_t row = (t * heads + head) * 2 * half;
      const P a = *reinterpret_cast<const P*>(x + row + i0);
      const P b = *reinterpret_cast<const P*>(x + row + half + i0);
      P oa, ob;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        float ra, rb;
        RotatePair(ToFloat(a.v[k]), ToFloat(b.v[k]), cs[i0 + k], cs[half + i0 + k], &ra, &rb);
        oa.v[k] = FromFloat<T>(ra);
        ob.v[k] = FromFloat<T>(rb);
      }
      *reinterpret_cast<P*>(out + row + i0) = oa;
      *reinterpret_cast<P*>(out + row + half + i0) = ob;
    }
  }
}

template <typename T, int kVec>
absl::Status Launch(const Stream& stream, const Tensor& x, int64_t seq_len, RopeCp cp,
                    const InvFreqTable& table, float sign, const Tensor& out) {
  const int64_t t_n = x.dim(0), heads = x.dim(1), half = x.dim(2) / 2;
  const int64_t work = heads * (half / kVec);
  const int64_t w32 = (work + 31) / 32 * 32;
  const int threads = static_cast<int>(w32 < 64 ? 64 : (w32 > 256 ? 256 : w32));
  const unsigned blocks = static_cast<unsigned>(t_n < 65536 ? t_n : 65536);
  RopeKernel<T, kVec><<<blocks, threads, 0, stream.cuda_stream>>>(
      x.as<const T>(), out.as<T>(), table, t_n, heads, half, seq_len, cp, sign);
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status Dispatch(const Stream& stream, const Tensor& x, int64_t seq_len, RopeCp cp,
                      const InvFreqTable& table, float sign, const Tensor& out) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t half = x.dim(2) / 2;
  if (half % kVec == 0 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out.data) % 16 == 0) {
    return Launch<T, kVec>(stream, x, seq_len, cp, table, sign, out);
  }
  return Launch<T, 1>(stream, x, seq_len, cp, table, sign, out);
}

}  // namespace

absl::Status RopeCuda(const Stream& stream, const Tensor& x, int64_t seq_len, float rotary_base,
                      float sign, const Tensor& out, RopeCp cp) {
  if (x.numel() == 0) return absl::OkStatus();
  InvFreqTable table{};
  RopeInvFreq(x.dim(2), rotary_base, table.v);
  if (x.dtype == DType::kBF16) {
    return Dispatch<__nv_bfloat16>(stream, x, seq_len, cp, table, sign, out);
  }
  return Dispatch<float>(stream, x, seq_len, cp, table, sign, out);
}

}  // namespace switchyard::kernels::internal
