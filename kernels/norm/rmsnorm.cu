// CUDA path of RMSNorm: one block per row in the forward; in the backward a fixed grid of
// RmsNormBackwardBlocks(T) blocks walks rows (one warp per row for rows of at most 256 vectors,
// see RmsNormBackwardWarpKernel; otherwise one block per row) with stride gridDim.x, reducing each
// row's dot product with a fixed-order block reduction and keeping the block's dw partial sums
// (fp32) in shared memory (or, when H does not fit, in its own slice of the workspace); a second
// kernel sums the partials over blocks in a fixed order (8 ascending runs, then the runs in
// order). Deterministic, no atomics.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/device_convert.cuh"
#include "kernels/device_reduce.cuh"
#include "kernels/norm/rmsnorm.h"
#include "kernels/norm/rmsnorm_device.cuh"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

// Sum over the block (blockDim.x a multiple of 32, at most 1024) in a fixed order: warp
// butterfly, then every thread adds the warp sums in warp order. Every thread gets the result.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.0f;
  const int warps = blockDim.x >> 5;
  for (int i = 0; i < warps; ++i) s += scratch[i];
  __syncthreads();  // scratch may be reused by the next call
  return s;
}

template <typename T, int kVec>
__global__ void RmsNormForwardKernel(const T* x, const T* w, float eps, T* y, float* rstd,
                                     int64_t h_n) {
  using P = Pack<T, kVec>;
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const int64_t nv = h_n / kVec;
  const P* xr = reinterpret_cast<const P*>(x + t * h_n);
  const P* wr = reinterpret_cast<const P*>(w);
  P* yr = reinterpret_cast<P*>(y + t * h_n);
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    const P p = xr[i];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      ss = NormSumSquares(ss, ToFloat(p.v[k]));
    }
  }
  ss = BlockSum(ss, scratch);
  const float r = NormRstd(ss, static_cast<float>(h_n), eps);
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    const P p = xr[i];
    const P q = wr[i];
    P o;
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      o.v[k] = FromFloat<T>(NormOut(ToFloat(p.v[k]), r, ToFloat(q.v[k])));
    yr[i] = o;
  }
  if (threadIdx.x == 0) rstd[t] = r;
}

// Block b handles rows b, b + gridDim.x, ... and leaves sum_t dy * x * rstd over them in
// partial[b, :]. Column group i (kVec columns) always belongs to thread i % blockDim.x, so the
// accumulator needs no synchronisation. In shared memory it is stored transposed (k * nv + i)
// to avoid bank conflicts.
template <typename T, int kVec, bool kSmemAcc>
__global__ void RmsNormBackwardKernel(const T* dy, const T* x, const T* w, const float* rstd, T* dx,
                                      float* partial, int64_t t_n, int64_t h_n, bool accum_dx) {
  using P = Pack<T, kVec>;
  extern __shared__ float acc_smem[];
  __shared__ float scratch[32];
  const int64_t nv = h_n / kVec;
  float* const slice = partial + static_cast<int64_t>(blockIdx.x) * h_n;
  float* const acc = kSmemAcc ? acc_smem : slice;
  auto at = [&](int64_t i, int k) { return kSmemAcc ? k * nv + i : i * kVec + k; };
  const P* wr = reinterpret_cast<const P*>(w);
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) acc[at(i, k)] = 0.0f;
  }
  for (int64_t t = blockIdx.x; t < t_n; t += gridDim.x) {
    const float r = rstd[t];
    const P* dyr = reinterpret_cast<const P*>(dy + t * h_n);
    const P* xr = reinterpret_cast<const P*>(x + t * h_n);
    P* dxr = reinterpret_cast<P*>(dx + t * h_n);
    float dot = 0.0f;
    for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
      const P d = dyr[i], xv = xr[i], wv = wr[i];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        dot = NormDot(dot, ToFloat(d.v[k]), ToFloat(wv.v[k]), ToFloat(xv.v[k]));
      }
    }
    dot = BlockSum(dot, scratch);  // all reads of dy[t] happen before any write of dx[t]
    const float c = NormGradCoef(r, dot, static_cast<float>(h_n));
    for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
      const P d = dyr[i], xv = xr[i], wv = wr[i];
      P o;
      if (accum_dx) o = dxr[i];  // dx does not alias dy here
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float df = ToFloat(d.v[k]), xf = ToFloat(xv.v[k]);
        acc[at(i, k)] = NormGradWeight(acc[at(i, k)], df, xf, r);
        const float g = NormGradIn(r, df, ToFloat(wv.v[k]), xf, c);
        o.v[k] = FromFloat<T>(accum_dx ? __fadd_rn(ToFloat(o.v[k]), g) : g);
      }
      dxr[i] = o;
    }
  }
  if (kSmemAcc) {
    for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) slice[i * kVec + k] = acc[at(i, k)];
    }
  }
}

// Rows of at most 8·32 vectors (the per-head QK-norm rows of D = 128, and hidden rows up to 2048
// bf16 / 1024 f32): one WARP per row, kRowWarps warps per block, so a block works on kRowWarps
// rows at once with warp-level reductions only (the block-per-row kernel above runs a few warps
// per SM through __syncthreads twice per row: latency-bound, and it was used for every row past
// 32 vectors, e.g. the benchmark model's H = 1536 norms). Warp j of block b handles rows
// b * kRowWarps + j, then every gridDim.x * kRowWarps further; lane i owns vectors i + 32·q,
// q < kJ, of every row and accumulates their dw partial sums; at the end the block adds its warps'
// partials in warp order into partial[b, :]. The row-to-(block, warp) map depends on T only:
// deterministic. Rows of up to 64 vectors keep the partials (and w) in registers; longer rows keep
// them in the warp's slice of shared memory and re-read w (L1) per row: with 48 partials and the
// row in registers the H = 1536 kernel took 237 registers, one block (8 warps) per SM, 66 us per
// call at 8192 rows (ncu, one H100, 2026-12-07). Accumulator slot of (q, k) of lane l:
// (q·kVec + k)·32 + l, bank-conflict free; the same order of additions either way. Loading the
// accumulated dx together with dy and x (one round trip per row) was measured and dropped: at
// H = 1536 it needs 86 bytes of register spill within the 128 registers of 2 blocks per SM, and
// the call went 43.6 -> 68.4 us (ncu, one H100, 2026-12-07, session 19).
constexpr int kRowWarps = 8;
constexpr int kMaxWarpVectors = 8;  // kJ: vectors per lane, at most

template <int kVec, int kJ>
constexpr int WarpAccSlots() {
  return kJ * kVec * 32;
}

template <typename T, int kVec, int kJ>
__global__ void __launch_bounds__(kRowWarps * 32, kJ >= 4 ? 2 : 1)
    RmsNormBackwardWarpKernel(const T* dy, const T* x, const T* w, const float* rstd, T* dx,
                              float* partial, int64_t t_n, int64_t h_n, bool accum_dx) {
  using P = Pack<T, kVec>;
  constexpr bool kSmemAcc = kJ >= 4;
  constexpr int kSlots = WarpAccSlots<kVec, kJ>();
  extern __shared__ float warp_acc[];  // [kRowWarps, kSlots]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t nv = h_n / kVec;
  const float hf = static_cast<float>(h_n);
  float* const my_acc = warp_acc + warp * kSlots;
  float acc[kJ][kVec];
  P wv[kJ];
  if constexpr (kSmemAcc) {
    for (int slot = lane; slot < kSlots; slot += 32) my_acc[slot] = 0.0f;  // this lane's slots
  } else {
#pragma unroll
    for (int q = 0; q < kJ; ++q) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[q][k] = 0.0f;
      if (lane + 32 * q < nv) wv[q] = reinterpret_cast<const P*>(w)[lane + 32 * q];
    }
  }
  auto weight = [&](int q, int64_t i) -> P {
    if constexpr (kSmemAcc) {
      return reinterpret_cast<const P*>(w)[i];
    } else {
      return wv[q];
    }
  };
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kRowWarps;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kRowWarps + warp; t < t_n; t += stride) {
    const float r = rstd[t];
    P d[kJ], xv[kJ];
    float dot = 0.0f;
#pragma unroll
    for (int q = 0; q < kJ; ++q) {
      const int64_t i = lane + 32 * q;
      if (i < nv) {
        d[q] = reinterpret_cast<const P*>(dy + t * h_n)[i];
        xv[q] = reinterpret_cast<const P*>(x + t * h_n)[i];
        const P wq = weight(q, i);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          dot = NormDot(dot, ToFloat(d[q].v[k]), ToFloat(wq.v[k]), ToFloat(xv[q].v[k]));
        }
      }
    }
    dot = GroupSum<32>(dot);
    const float c = NormGradCoef(r, dot, hf);
    // Each lane wrote nothing before reading its own dy vectors: dx may alias dy.
#pragma unroll
    for (int q = 0; q < kJ; ++q) {
      const int64_t i = lane + 32 * q;
      if (i < nv) {
        P o;
        if (accum_dx) o = reinterpret_cast<const P*>(dx + t * h_n)[i];  // no alias with dy
        const P wq = weight(q, i);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const float df = ToFloat(d[q].v[k]), xf = ToFloat(xv[q].v[k]);
          if constexpr (kSmemAcc) {
            float& a = my_acc[(q * kVec + k) * 32 + lane];
            a = NormGradWeight(a, df, xf, r);
          } else {
            acc[q][k] = NormGradWeight(acc[q][k], df, xf, r);
          }
          const float g = NormGradIn(r, df, ToFloat(wq.v[k]), xf, c);
          o.v[k] = FromFloat<T>(accum_dx ? __fadd_rn(ToFloat(o.v[k]), g) : g);
        }
        reinterpret_cast<P*>(dx + t * h_n)[i] = o;
      }
    }
  }
  if constexpr (!kSmemAcc) {
#pragma unroll
    for (int q = 0; q < kJ; ++q) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) my_acc[(q * kVec + k) * 32 + lane] = acc[q][k];
    }
  }
  __syncthreads();
  for (int64_t h = threadIdx.x; h < h_n; h += blockDim.x) {
    const int64_t i = h / kVec;
    const int slot = static_cast<int>(((i >> 5) * kVec + h % kVec) * 32 + (i & 31));
    float sum = 0.0f;
    for (int j = 0; j < kRowWarps; ++j) sum = __fadd_rn(sum, warp_acc[j * kSlots + slot]);
    partial[static_cast<int64_t>(blockIdx.x) * h_n + h] = sum;
  }
}

// dw[h] = (accumulate ? dw[h] : 0) + sum_b partial[b, h]: a block per kDwColumns columns; warp
// w sums the blocks [w·n, (w + 1)·n) (n = ⌈blocks / kDwWarps⌉) in ascending order, then warp 0
// adds the warps' sums in warp order (a function of T only, like the partials). Was one thread
// per column adding all 256 partials in turn: 6 blocks at H = 1536, 16 dependent batches of
// loads each.
constexpr int kDwColumns = 32;
constexpr int kDwWarps = 8;

template <typename DW>
__global__ void __launch_bounds__(kDwWarps * 32)
    RmsNormDwReduceKernel(const float* partial, int64_t blocks, int64_t h_n, DW* dw,
                          bool accumulate) {
  __shared__ float warp_sum[kDwWarps][kDwColumns];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int64_t h = static_cast<int64_t>(blockIdx.x) * kDwColumns + lane;
  const int64_t per = (blocks + kDwWarps - 1) / kDwWarps;
  const int64_t b0 = w * per, b1 = b0 + per < blocks ? b0 + per : blocks;
  float s = 0.0f;
  if (h < h_n && b0 < b1) s = OrderedSum(partial + b0 * h_n + h, b1 - b0, h_n);  // batched loads
  warp_sum[w][lane] = s;
  __syncthreads();
  if (w != 0 || h >= h_n) return;
  float total = warp_sum[0][lane];
#pragma unroll
  for (int i = 1; i < kDwWarps; ++i) total += warp_sum[i][lane];
  dw[h] = FromFloat<DW>(accumulate ? ToFloat(dw[h]) + total : total);
}

cudaStream_t S(const Stream& s) { return s.cuda_stream; }

// Threads per row: enough warps to cover the row's vectors once, capped at max_threads.
int RowThreads(int64_t vectors, int max_threads) {
  const int64_t t = (vectors + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : (t > max_threads ? max_threads : t));
}

bool Aligned16(std::initializer_list<const void*> ps) {
  for (const void* p : ps) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// Forward for short rows (at most 32 vectors): one warp per row, kRowWarps rows per block.
template <typename T, int kVec>
__global__ void __launch_bounds__(kRowWarps * 32)
    RmsNormForwardWarpKernel(const T* x, const T* w, float eps, T* y, float* rstd, int64_t t_n,
                             int64_t h_n) {
  using P = Pack<T, kVec>;
  const int lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  if (t >= t_n) return;  // whole warps leave together
  const int64_t nv = h_n / kVec;
  const bool owns = lane < nv;
  P p;
  float ss = 0.0f;
  if (owns) {
    p = reinterpret_cast<const P*>(x + t * h_n)[lane];
#pragma unroll
    for (int k = 0; k < kVec; ++k) ss = NormSumSquares(ss, ToFloat(p.v[k]));
  }
  ss = GroupSum<32>(ss);
  const float r = NormRstd(ss, static_cast<float>(h_n), eps);
  if (owns) {
    const P q = reinterpret_cast<const P*>(w)[lane];
    P o;
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      o.v[k] = FromFloat<T>(NormOut(ToFloat(p.v[k]), r, ToFloat(q.v[k])));
    reinterpret_cast<P*>(y + t * h_n)[lane] = o;
  }
  if (lane == 0) rstd[t] = r;
}

template <typename T, int kVec>
absl::Status LaunchForward(const Stream& stream, const Tensor& x, const Tensor& w, float eps,
                           const Tensor& y, const Tensor& rstd) {
  const int64_t t_n = x.dim(0), h_n = x.dim(1);
  if (h_n / kVec <= 32) {
    RmsNormForwardWarpKernel<T, kVec><<<static_cast<unsigned>((t_n + kRowWarps - 1) / kRowWarps),
                                        kRowWarps * 32, 0, S(stream)>>>(
        x.as<const T>(), w.as<const T>(), eps, y.as<T>(), rstd.as<float>(), t_n, h_n);
    SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  }
  RmsNormForwardKernel<T, kVec>
      <<<static_cast<unsigned>(t_n), RowThreads(h_n / kVec, 256), 0, S(stream)>>>(
          x.as<const T>(), w.as<const T>(), eps, y.as<T>(), rstd.as<float>(), h_n);
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T, int kVec>
absl::Status LaunchBackward(const Stream& stream, const Tensor& dy, const Tensor& x,
                            const Tensor& w, const Tensor& rstd, const Tensor& dx,
                            const Tensor& workspace, bool accum_dx) {
  const int64_t t_n = x.dim(0), h_n = x.dim(1);
  const int64_t blocks = RmsNormBackwardBlocks(t_n);
  float* partial = workspace.as<float>();
  int max_smem = 0;
  SY_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                                 stream.device.index));
  const int64_t nv = h_n / kVec;
  const int64_t max_warp_smem =
      kRowWarps * WarpAccSlots<kVec, kMaxWarpVectors>() * static_cast<int64_t>(sizeof(float));
  if (nv <= 32 * kMaxWarpVectors && max_warp_smem <= max_smem) {
    auto launch = [&](auto kj) -> absl::Status {
      constexpr int kJ = decltype(kj)::value;
      const int64_t warp_smem =
          kRowWarps * WarpAccSlots<kVec, kJ>() * static_cast<int64_t>(sizeof(float));
      auto* kernel = &RmsNormBackwardWarpKernel<T, kVec, kJ>;
      if (warp_smem > 48 * 1024) {
        SY_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
            kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(warp_smem)));
      }
      kernel<<<static_cast<unsigned>(blocks), kRowWarps * 32, static_cast<size_t>(warp_smem),
               S(stream)>>>(dy.as<const T>(), x.as<const T>(), w.as<const T>(),
                            rstd.as<const float>(), dx.as<T>(), partial, t_n, h_n, accum_dx);
      SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      return absl::OkStatus();
    };
    if (nv <= 32) return launch(std::integral_constant<int, 1>{});
    if (nv <= 64) return launch(std::integral_constant<int, 2>{});
    if (nv <= 128) return launch(std::integral_constant<int, 4>{});
    if (nv <= 192) return launch(std::integral_constant<int, 6>{});
    return launch(std::integral_constant<int, 8>{});
  }
  const int threads = RowThreads(h_n / kVec, 512);
  const int64_t smem = h_n * static_cast<int64_t>(sizeof(float));
  const int64_t static_smem = 32 * sizeof(float);
  if (smem + static_smem <= max_smem) {
    auto* kernel = &RmsNormBackwardKernel<T, kVec, true>;
    if (smem + static_smem > 48 * 1024) {  // the default covers dynamic + static (H = 12288)
      SY_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    }
    kernel<<<static_cast<unsigned>(blocks), threads, static_cast<size_t>(smem), S(stream)>>>(
        dy.as<const T>(), x.as<const T>(), w.as<const T>(), rstd.as<const float>(), dx.as<T>(),
        partial, t_n, h_n, accum_dx);
  } else {
    RmsNormBackwardKernel<T, kVec, false><<<static_cast<unsigned>(blocks), threads, 0, S(stream)>>>(
        dy.as<const T>(), x.as<const T>(), w.as<const T>(), rstd.as<const float>(), dx.as<T>(),
        partial, t_n, h_n, accum_dx);
  }
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status DispatchForward(const Stream& stream, const Tensor& x, const Tensor& w, float eps,
                             const Tensor& y, const Tensor& rstd) {
  constexpr int kVec = 16 / sizeof(T);
  if (x.dim(1) % kVec == 0 && Aligned16({x.data, w.data, y.data})) {
    return LaunchForward<T, kVec>(stream, x, w, eps, y, rstd);
  }
  return LaunchForward<T, 1>(stream, x, w, eps, y, rstd);
}

template <typename T>
absl::Status DispatchBackward(const Stream& stream, const Tensor& dy, const Tensor& x,
                              const Tensor& w, const Tensor& rstd, const Tensor& dx,
                              const Tensor& workspace, bool accum_dx) {
  constexpr int kVec = 16 / sizeof(T);
  if (x.dim(1) % kVec == 0 && Aligned16({dy.data, x.data, w.data, dx.data})) {
    return LaunchBackward<T, kVec>(stream, dy, x, w, rstd, dx, workspace, accum_dx);
  }
  return LaunchBackward<T, 1>(stream, dy, x, w, rstd, dx, workspace, accum_dx);
}

}  // namespace

absl::Status RmsNormForwardCuda(const Stream& stream, const Tensor& x, const Tensor& w, float eps,
                                const Tensor& y, const Tensor& rstd) {
  if (x.dim(0) == 0) return absl::OkStatus();
  if (x.dim(0) > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("RmsNormForward: T must be < 2^31 on CUDA, got ", x.dim(0)));
  }
  if (x.dtype == DType::kBF16) return DispatchForward<__nv_bfloat16>(stream, x, w, eps, y, rstd);
  return DispatchForward<float>(stream, x, w, eps, y, rstd);
}

absl::Status RmsNormBackwardCuda(const Stream& stream, const Tensor& dy, const Tensor& x,
                                 const Tensor& w, const Tensor& rstd, const Tensor& dx,
                                 const Tensor& dw, bool accumulate_dw, const Tensor& workspace,
                                 bool accumulate_dx) {
  const int64_t t_n = x.dim(0), h_n = x.dim(1);
  if (t_n > 0) {
    if (x.dtype == DType::kBF16) {
      SY_RETURN_IF_ERROR(
          DispatchBackward<__nv_bfloat16>(stream, dy, x, w, rstd, dx, workspace, accumulate_dx));
    } else {
      SY_RETURN_IF_ERROR(
          DispatchBackward<float>(stream, dy, x, w, rstd, dx, workspace, accumulate_dx));
    }
  }
  // With T == 0 no partials were written: sum over zero blocks (dw unchanged or zeroed).
  const int64_t blocks = t_n > 0 ? RmsNormBackwardBlocks(t_n) : 0;
  const unsigned grid = static_cast<unsigned>((h_n + kDwColumns - 1) / kDwColumns);
  if (dw.dtype == DType::kBF16) {
    RmsNormDwReduceKernel<__nv_bfloat16><<<grid, kDwWarps * 32, 0, S(stream)>>>(
        workspace.as<const float>(), blocks, h_n, dw.as<__nv_bfloat16>(), accumulate_dw);
  } else {
    RmsNormDwReduceKernel<float><<<grid, kDwWarps * 32, 0, S(stream)>>>(
        workspace.as<const float>(), blocks, h_n, dw.as<float>(), accumulate_dw);
  }
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace switchyard::kernels::internal
