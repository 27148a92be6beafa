// Portable CUDA path of GroupedGemm: a one-block setup kernel turns the device counts into group
// offsets and a prefix sum of row tiles; a 64x64x16 shared-memory SIMT kernel (fp32 FMA, 4x4
// outputs per thread) then computes every (group, tile). Any shape, any CUDA GPU, no host sync.
//
// Fprop/Dgrad: the grid's y dimension walks the row tiles of all groups, whose total is bounded
// by ceil(R / 64) + G without knowing the counts; a block finds its group by binary search in
// the tile prefix sum and exits past the total. Wgrad: one z-slice per group over the fixed
// [K, N] output; a group with zero rows writes zeros (or leaves dW_g alone when accumulating).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/gemm/grouped_gemm.h"
#include "kernels/gemm/grouped_gemm_scan.cuh"
#include "kernels/runtime/buffer.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

constexpr int kBlockM = 64;
constexpr int kBlockN = 64;
constexpr int kBlockK = 16;
constexpr int kThreads = 256;  // 16 x 16 threads, 4 x 4 outputs each
constexpr int kMaxGridY = 65535;

// Per-op device arrays written by the setup kernel.
struct GroupArrays {
  int64_t* offsets;     // [G]
  int32_t* rows;        // [G]
  int32_t* tile_start;  // [G + 1]: exclusive prefix of ceil(rows / kBlockM); [G] = total
};

__global__ void __launch_bounds__(kSetupThreads)
    FallbackSetupKernel(const int32_t* counts, int groups, int64_t capacity, GroupArrays arrays) {
  BlockExclusiveScan(
      groups, [&](int g) { return NonNegativeCount(counts, g); },
      [&](int g, int64_t raw_offset, int64_t count) {
        const GroupRows r = ClampGroup(raw_offset, count, capacity);
        arrays.offsets[g] = r.offset;
        arrays.rows[g] = r.rows;
      });
  __syncthreads();  // rows[] written above are read by other threads below
  const int64_t total = BlockExclusiveScan(
      groups, [&](int g) { return static_cast<int64_t>((arrays.rows[g] + kBlockM - 1) / kBlockM); },
      [&](int g, int64_t start, int64_t) { arrays.tile_start[g] = static_cast<int32_t>(start); });
  if (threadIdx.x == 0) arrays.tile_start[groups] = static_cast<int32_t>(total);
}

struct FallbackParams {
  GroupedGemmOp op;
  const __nv_bfloat16* a;
  const __nv_bfloat16* b;
  void* out;
  int64_t k;
  int64_t n;
  int groups;
  bool accumulate;
  GroupArrays arrays;
};

// One output tile: C[m0 + i, n0 + j] (+)= sum_p A(m0 + i, p) B(p, n0 + j), with A(i, p) at
// a[i * a_rs + p * a_cs] and B(p, j) at b[p * b_rs + j * b_cs], for i < m, j < n, p < kdim.
template <typename OutT>
__device__ void ComputeTile(const __nv_bfloat16* a, int64_t a_rs, int64_t a_cs,
                            const __nv_bfloat16* b, int64_t b_rs, int64_t b_cs, OutT* c,
                            int64_t ldc, int64_t m, int64_t n, int64_t kdim, int64_t m0, int64_t n0,
                            bool accumulate, float (*as)[kBlockM + 4], float (*bs)[kBlockN + 4]) {
  const int tx = threadIdx.x % 16;
  const int ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < kdim; k0 += kBlockK) {
    // Load so that consecutive threads read consecutive addresses along the contiguous mode.
#pragma unroll
    for (int r = 0; r < kBlockM * kBlockK / kThreads; ++r) {
      const int e = threadIdx.x + r * kThreads;
      const int mm = a_cs == 1 ? e / kBlockK : e % kBlockM;
      const int kk = a_cs == 1 ? e % kBlockK : e / kBlockM;
      const int64_t gi = m0 + mm, gp = k0 + kk;
      as[kk][mm] = (gi < m && gp < kdim) ? __bfloat162float(a[gi * a_rs + gp * a_cs]) : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < kBlockN * kBlockK / kThreads; ++r) {
      const int e = threadIdx.x + r * kThreads;
      const int nn = b_cs == 1 ? e % kBlockN : e / kBlockK;
      const int kk = b_cs == 1 ? e / kBlockN : e % kBlockK;
      const int64_t gp = k0 + kk, gj = n0 + nn;
      bs[kk][nn] = (gp < kdim && gj < n) ? __bfloat162float(b[gp * b_rs + gj * b_cs]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBlockK; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t gi = m0 + ty + 16 * i;
    if (gi >= m) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t gj = n0 + tx + 16 * j;
      if (gj >= n) continue;
      OutT* dst = c + gi * ldc + gj;
      float v = acc[i][j];
      if (accumulate) v += static_cast<float>(*dst);
      *dst = static_cast<OutT>(v);
    }
  }
}

template <typename OutT>
__global__ void __launch_bounds__(kThreads) FallbackGemmKernel(FallbackParams p) {
  __shared__ float as[kBlockK][kBlockM + 4];
  __shared__ float bs[kBlockK][kBlockN + 4];
  const int64_t k = p.k, n = p.n;
  OutT* out = static_cast<OutT*>(p.out);
  if (p.op == GroupedGemmOp::kWgrad) {
    // dW_g [K, N] = x_g^T [K, m] · dy_g [m, N]: A(i, r) = x[(off + r) * K + i].
    const int g = blockIdx.z;
    const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBlockM;
    const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBlockN;
    const int32_t rows = p.arrays.rows[g];
    if (m0 >= k || n0 >= n || (rows == 0 && p.accumulate)) return;
    const int64_t off = p.arrays.offsets[g];
    ComputeTile(p.a + off * k, 1, k, p.b + off * n, n, 1, out + g * k * n, n, k, n, rows, m0, n0,
                p.accumulate, as, bs);
    return;
  }
  // Fprop: y_g [m, N] = x_g [m, K] · W_g [K, N]. Dgrad: dx_g [m, K] = dy_g [m, N] · W_g^T, with
  // B(j, i) = W[i * N + j].
  const bool fprop = p.op == GroupedGemmOp::kFprop;
  const int64_t out_cols = fprop ? n : k;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBlockN;
  if (n0 >= out_cols) return;
  const int32_t total = p.arrays.tile_start[p.groups];
  for (int64_t t = blockIdx.y; t < total; t += gridDim.y) {
    // The last group whose first tile is <= t; it is non-empty since tile_start[G] > t.
    int lo = 0, hi = p.groups - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (p.arrays.tile_start[mid] <= t) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const int g = lo;
    const int64_t m0 = (t - p.arrays.tile_start[g]) * kBlockM;
    const int64_t off = p.arrays.offsets[g];
    const int32_t rows = p.arrays.rows[g];
    const __nv_bfloat16* w = p.b + static_cast<int64_t>(g) * k * n;
    if (fprop) {
      ComputeTile(p.a + off * k, k, 1, w, n, 1, out + off * n, n, rows, n, k, m0, n0, false, as,
                  bs);
    } else {
      ComputeTile(p.a + off * n, n, 1, w, 1, n, out + off * k, k, rows, k, n, m0, n0, false, as,
                  bs);
    }
  }
}

class FallbackPath final : public GroupedGemmCudaPath {
 public:
  FallbackPath(int device, int max_groups, Buffer arrays)
      : device_(device), max_groups_(max_groups), arrays_(std::move(arrays)) {}

  absl::Status Run(const GroupedGemmCall& call) override {
    SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cudaStream_t stream = call.cuda_stream;
    const GroupArrays arrays = ArraysFor(call.op);
    FallbackSetupKernel<<<1, kSetupThreads, 0, stream>>>(call.tokens_per_group, call.groups,
                                                         call.rows, arrays);
    SY_CUDA_RETURN_IF_LAUNCH_ERROR(FallbackSetupKernel);

    FallbackParams p;
    p.op = call.op;
    p.a = static_cast<const __nv_bfloat16*>(call.a);
    p.b = static_cast<const __nv_bfloat16*>(call.b);
    p.out = call.out;
    p.k = call.k;
    p.n = call.n;
    p.groups = call.groups;
    p.accumulate = call.accumulate;
    p.arrays = arrays;
    dim3 grid;
    if (call.op == GroupedGemmOp::kWgrad) {
      grid =
          dim3(static_cast<unsigned>(CeilDiv(call.n, kBlockN)),
               static_cast<unsigned>(CeilDiv(call.k, kBlockM)), static_cast<unsigned>(call.groups));
      if (grid.y > static_cast<unsigned>(kMaxGridY)) {
        return absl::InvalidArgumentError(absl::StrCat("fallback: K (", call.k, ") too large"));
      }
    } else {
      const int64_t out_cols = call.op == GroupedGemmOp::kFprop ? call.n : call.k;
      const int64_t max_tiles = CeilDiv(call.rows, kBlockM) + call.groups;
      grid = dim3(
          static_cast<unsigned>(CeilDiv(out_cols, kBlockN)),
          static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(max_tiles, 1), kMaxGridY)));
    }
    if (call.out_dtype == DType::kF32) {
      FallbackGemmKernel<float><<<grid, kThreads, 0, stream>>>(p);
    } else {
      FallbackGemmKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(p);
    }
    SY_CUDA_RETURN_IF_LAUNCH_ERROR(FallbackGemmKernel);
    return absl::OkStatus();
  }

  // Per op: offsets [max_groups] int64, rows [max_groups] int32, tile_start [max_groups + 1].
  static size_t BytesPerOp(int max_groups) {
    return RoundUp(sizeof(int64_t) * max_groups) + RoundUp(sizeof(int32_t) * max_groups) +
           RoundUp(sizeof(int32_t) * (max_groups + 1));
  }

 private:
  static int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
  static size_t RoundUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

  GroupArrays ArraysFor(GroupedGemmOp op) const {
    char* base =
        static_cast<char*>(arrays_.data()) + static_cast<int>(op) * BytesPerOp(max_groups_);
    GroupArrays a;
    a.offsets = reinterpret_cast<int64_t*>(base);
    base += RoundUp(sizeof(int64_t) * max_groups_);
    a.rows = reinterpret_cast<int32_t*>(base);
    base += RoundUp(sizeof(int32_t) * max_groups_);
    a.tile_start = reinterpret_cast<int32_t*>(base);
    return a;
  }

  int device_;
  int max_groups_;
  Buffer arrays_;  // one GroupArrays per op, so different ops may overlap on different streams
};

}  // namespace

absl::StatusOr<std::unique_ptr<GroupedGemmCudaPath>> CreateGroupedGemmFallback(int device,
                                                                               int max_groups) {
  SY_ASSIGN_OR_RETURN(Buffer arrays, Buffer::Allocate(Device::Cuda(device),
                                                      3 * FallbackPath::BytesPerOp(max_groups)));
  return std::unique_ptr<GroupedGemmCudaPath>(
      new FallbackPath(device, max_groups, std::move(arrays)));
}

}  // namespace switchyard::kernels::internal
