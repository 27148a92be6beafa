// CUDA path of the chunk sort (sort_chunks.h). Two kernels on the stream, no host sync:
//   1. ChunkOffsetsKernel (one block of kScanThreads, thread i = chunk i): clamps the split sizes,
//      takes exclusive scans in the input order and in the sorted order, and writes, in OUTPUT
//      chunk order, out_start[0..C] (monotone; out_start[C] = total) and in_start[0..C) (first
//      source row of the same chunk) to the workspace.
//   2. CopyChunkRowsKernel: one warp per output row r < min(total, N): binary search of the
//      largest chunk k with out_start[k] <= r (offsets staged in shared memory per block; an empty
//      chunk shares its start with the next one, so the search lands on the non-empty chunk),
//      then copies row in_start[k] + r - out_start[k] in units of V, and its prob.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/moe/copy_unit.cuh"
#include "kernels/moe/sort_chunks.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

constexpr int kScanThreads = 1024;
constexpr int kCopyThreads = 256;
constexpr int kCopyWarps = kCopyThreads / 32;
constexpr int64_t kMaxCopyBlocks = 16384;
static_assert(kMaxSortChunks <= kScanThreads, "ChunkOffsetsKernel: one thread per chunk");
static_assert(kScanThreads == 1024, "BlockExclusiveScan assumes 32 full warps");
static_assert(kMaxSortChunks <= 65536, "chunk indices are passed as uint16");

// The order, by value: a kernel parameter (2 KB + 4 bytes, under the 4 KB classic limit).
struct OrderParam {
  int32_t num_chunks;
  uint16_t order[kMaxSortChunks];
};

cudaStream_t CudaStreamOf(const Stream& s) { return s.cuda_stream; }

// Exclusive scan of v over the block (blockDim.x == 1024); *total gets the block sum. Contains
// __syncthreads, so every thread must call it.
__device__ long long BlockExclusiveScan(long long v, long long* warp_sums, long long* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  long long inc = v;
  for (int off = 1; off < 32; off <<= 1) {
    const long long n = __shfl_up_sync(0xffffffffu, inc, off);
    if (lane >= off) inc += n;
  }
  if (lane == 31) warp_sums[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    long long w = warp_sums[lane];
    for (int off = 1; off < 32; off <<= 1) {
      const long long n = __shfl_up_sync(0xffffffffu, w, off);
      if (lane >= off) w += n;
    }
    warp_sums[lane] = w;
  }
  __syncthreads();
  const long long ex = inc - v + (warp > 0 ? warp_sums[warp - 1] : 0);
  *total = warp_sums[31];
  __syncthreads();  // warp_sums may be reused by the next call
  return ex;
}

__global__ void __launch_bounds__(kScanThreads)
    ChunkOffsetsKernel(const int32_t* __restrict__ split_sizes, const OrderParam ord,
                       long long max_rows, bool inverse, long long* __restrict__ out_start,
                       long long* __restrict__ in_start) {
  __shared__ long long size[kMaxSortChunks];
  __shared__ long long orig_start[kMaxSortChunks];
  __shared__ long long sorted_start[kMaxSortChunks];  // by chunk id
  __shared__ long long warp_sums[32];
  const int c = ord.num_chunks;
  const int i = threadIdx.x;
  long long s = 0;
  if (i < c) {
    s = split_sizes[i];
    s = s < 0 ? 0 : (s > max_rows ? max_rows : s);
    size[i] = s;
  }
  long long total = 0;
  const long long ex_orig = BlockExclusiveScan(s, warp_sums, &total);  // also publishes size[]
  if (i < c) orig_start[i] = ex_orig;
  const int chunk_at_i = i < c ? static_cast<int>(ord.order[i]) : 0;
  const long long s_sorted = i < c ? size[chunk_at_i] : 0;
  long long total_sorted = 0;
  const long long ex_sorted = BlockExclusiveScan(s_sorted, warp_sums, &total_sorted);
  if (i < c) sorted_start[chunk_at_i] = ex_sorted;
  __syncthreads();
  if (i < c) {
    if (inverse) {  // output chunk i = chunk i, read from its sorted position
      out_start[i] = orig_start[i];
      in_start[i] = sorted_start[i];
    } else {  // output chunk i = chunk order[i], read from its input position
      out_start[i] = ex_sorted;
      in_start[i] = orig_start[chunk_at_i];
    }
  }
  if (i == 0) out_start[c] = total;
}

template <typename V>
__global__ void __launch_bounds__(kCopyThreads)
    CopyChunkRowsKernel(const V* __restrict__ in, V* __restrict__ out, long long units,
                        const float* __restrict__ probs, float* __restrict__ probs_out,
                        long long num_rows, int num_chunks,
                        const long long* __restrict__ g_out_start,
                        const long long* __restrict__ g_in_start) {
  extern __shared__ long long offsets[];  // out_start[0..C], then in_start[0..C)
  long long* out_start = offsets;
  long long* in_start = offsets + num_chunks + 1;
  for (int k = threadIdx.x; k <= num_chunks; k += blockDim.x) {
    out_start[k] = g_out_start[k];
    if (k < num_chunks) in_start[k] = g_in_start[k];
  }
  __syncthreads();
  const long long end = min(out_start[num_chunks], num_rows);
  const int lane = threadIdx.x & 31;
  const long long stride = static_cast<long long>(gridDim.x) * kCopyWarps;
  for (long long r = static_cast<long long>(blockIdx.x) * kCopyWarps + (threadIdx.x >> 5); r < end;
       r += stride) {
    int lo = 0, hi = num_chunks - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (out_start[mid] <= r) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const long long src = in_start[lo] + (r - out_start[lo]);
    if (src >= num_rows) continue;  // only when sum(split_sizes) > N (contract broken)
    const V* s = in + src * units;
    V* d = out + r * units;
    for (long long u = lane; u < units; u += 32) d[u] = s[u];
    if (probs != nullptr && lane == 0) probs_out[r] = probs[src];
  }
}

template <typename V>
absl::Status LaunchCopy(cudaStream_t cs, const void* in, void* out, int64_t row_bytes,
                        const float* probs, float* probs_out, int64_t n, int c,
                        const long long* out_start, const long long* in_start) {
  const int64_t units = row_bytes / static_cast<int64_t>(sizeof(V));
  const int64_t blocks = std::min<int64_t>((n + kCopyWarps - 1) / kCopyWarps, kMaxCopyBlocks);
  const size_t smem = static_cast<size_t>(2 * c + 1) * sizeof(long long);
  CopyChunkRowsKernel<V><<<static_cast<unsigned>(blocks), kCopyThreads, smem, cs>>>(
      static_cast<const V*>(in), static_cast<V*>(out), units, probs, probs_out, n, c, out_start,
      in_start);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(CopyChunkRowsKernel);
  return absl::OkStatus();
}

}  // namespace

absl::Status SortChunksCuda(const Stream& stream, const Tensor& input, const Tensor& split_sizes,
                            absl::Span<const int32_t> sorted_order, bool inverse,
                            const Tensor& output, const Tensor& probs, const Tensor& probs_out,
                            const Tensor& workspace) {
  const int64_t n = input.dim(0);
  if (n == 0) return absl::OkStatus();  // nothing can be copied; outputs untouched
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  cudaStream_t cs = CudaStreamOf(stream);
  OrderParam ord{};
  ord.num_chunks = static_cast<int32_t>(sorted_order.size());
  for (int i = 0; i < ord.num_chunks; ++i) ord.order[i] = static_cast<uint16_t>(sorted_order[i]);
  long long* out_start = workspace.as<long long>();
  long long* in_start = out_start + ord.num_chunks + 1;
  ChunkOffsetsKernel<<<1, kScanThreads, 0, cs>>>(
      split_sizes.as<int32_t>(), ord, static_cast<long long>(n), inverse, out_start, in_start);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(ChunkOffsetsKernel);
  const int64_t row_bytes = input.dim(1) * static_cast<int64_t>(DTypeSize(input.dtype));
  const float* p = probs.data != nullptr ? probs.as<float>() : nullptr;
  float* po = p != nullptr ? probs_out.as<float>() : nullptr;
  const int c = ord.num_chunks;
  return WithCopyUnit(row_bytes, input.data, output.data, [&](auto unit) {
    return LaunchCopy<decltype(unit)>(cs, input.data, output.data, row_bytes, p, po, n, c,
                                      out_start, in_start);
  });
}

}  // namespace switchyard::kernels::internal
