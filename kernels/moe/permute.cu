// CUDA path of the permutation ops (permute.h).
//
// Permute runs five kernels on the stream, none of which synchronises with the host:
//   1. ChunkHistogramKernel: per chunk of kChunk tokens, the count of each expert (shared-memory
//      integer atomics: the counts, not an order, so the result is deterministic).
//   2. ExpertOffsetsKernel (one block, thread e = expert e): exclusive prefix over chunks, then an
//      exclusive scan over experts (or e * C when padding): the absolute first row of each
//      (chunk, expert); writes tokens_per_expert.
//   3. PermuteRankKernel: per chunk, the rank of each (token, slot) among the earlier slots of the
//      chunk routed to the same expert (warp __match_any_sync + per-warp counts in shared memory,
//      rounds in (token, slot) order), so the order inside an expert is ascending token order;
//      writes row_map and permuted_probs.
//   4. ScatterRowsKernel: one block per token reads its row once and writes it to its k rows.
//   5. ZeroPaddingRowsKernel (pad mode): zero rows and probs in [e*C + kept_e, (e+1)*C).
// Unpermute / PermuteBackward are one gather-sum kernel (one block per token, fp32 sums in slot
// order); UnpermuteBackward is ScatterRowsKernel.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/device_convert.cuh"
#include "kernels/moe/copy_unit.cuh"
#include "kernels/moe/permute.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

constexpr int kChunk = static_cast<int>(kPermuteChunkTokens);
constexpr int kRankThreads = 128;
constexpr int kRankWarps = kRankThreads / 32;
constexpr int kHistThreads = 256;
constexpr int kScanThreads = 1024;
static_assert(kMaxExpertsCuda <= kScanThreads, "ExpertOffsetsKernel: one thread per expert");
static_assert(kScanThreads / 32 <= 32, "ExpertOffsetsKernel: one warp scans the warp sums");

cudaStream_t CudaStreamOf(const Stream& s) { return s.cuda_stream; }

int ThreadsFor(int64_t units) {
  return static_cast<int>(std::clamp<int64_t>((units + 31) / 32 * 32, 32, 256));
}

__global__ void ChunkHistogramKernel(const int32_t* __restrict__ idx, int64_t num_tokens, int k,
                                     int num_experts, int32_t* __restrict__ chunk_counts,
                                     int32_t* __restrict__ global_counts) {
  extern __shared__ int32_t hist[];
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const int64_t f0 = static_cast<int64_t>(blockIdx.x) * kChunk * k;
  const int64_t f1 = min(num_tokens, static_cast<int64_t>(blockIdx.x + 1) * kChunk) * k;
  for (int64_t f = f0 + threadIdx.x; f < f1; f += blockDim.x) {
    const int e = idx[f];
    if (e >= 0 && e < num_experts) atomicAdd(&hist[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
    if (chunk_counts != nullptr) {
      chunk_counts[static_cast<int64_t>(blockIdx.x) * num_experts + e] = hist[e];
    }
    if (global_counts != nullptr && hist[e] != 0) atomicAdd(&global_counts[e], hist[e]);
  }
}

__device__ int32_t WarpInclusiveScan(int32_t v, int lane) {
  for (int off = 1; off < 32; off <<= 1) {
    const int32_t n = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v += n;
  }
  return v;
}

__global__ void ExpertOffsetsKernel(int32_t* __restrict__ chunk_base, int64_t num_chunks,
                                    int num_experts, int capacity,
                                    int32_t* __restrict__ tokens_per_expert,
                                    int32_t* __restrict__ kept) {
  __shared__ int32_t warp_sums[kScanThreads / 32];
  const int e = threadIdx.x, lane = e & 31, warp = e >> 5;
  int32_t total = 0;
  if (e < num_experts) {
    // Loads in batches so that kBatch of them are in flight (the loop is latency-bound).
    constexpr int kBatch = 8;
    for (int64_t c0 = 0; c0 < num_chunks; c0 += kBatch) {
      int32_t v[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        v[i] = c0 + i < num_chunks ? chunk_base[(c0 + i) * num_experts + e] : 0;
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        if (c0 + i < num_chunks) chunk_base[(c0 + i) * num_experts + e] = total;
        total += v[i];
      }
    }
  }
  const int32_t inclusive = WarpInclusiveScan(total, lane);
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) warp_sums[lane] = WarpInclusiveScan(warp_sums[lane], lane);
  __syncthreads();
  if (e >= num_experts) return;
  const int32_t exclusive = inclusive - total + (warp > 0 ? warp_sums[warp - 1] : 0);
  const int32_t start = capacity > 0 ? e * capacity : exclusive;
  for (int64_t c = 0; c < num_chunks; ++c) chunk_base[c * num_experts + e] += start;
  tokens_per_expert[e] = capacity > 0 ? capacity : total;
  kept[e] = capacity > 0 ? min(total, capacity) : total;
}

__global__ void __launch_bounds__(kRankThreads)
    PermuteRankKernel(const int32_t* __restrict__ idx, const float* __restrict__ probs,
                      int64_t num_tokens, int k, int num_experts, int capacity,
                      const int32_t* __restrict__ chunk_base, int64_t max_rows,
                      int32_t* __restrict__ row_map, float* __restrict__ permuted_probs,
                      int32_t* __restrict__ source_rows) {
  extern __shared__ int32_t smem[];
  int32_t* running = smem;                 // [E]: rows of each expert taken earlier in the chunk
  int32_t* warp_cnt = smem + num_experts;  // [kRankWarps][E]: this round's count per warp
  for (int i = threadIdx.x; i < num_experts * (kRankWarps + 1); i += blockDim.x) smem[i] = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t f0 = static_cast<int64_t>(blockIdx.x) * kChunk * k;
  const int64_t f1 = min(num_tokens, static_cast<int64_t>(blockIdx.x + 1) * kChunk) * k;
  const int32_t* base = chunk_base + static_cast<int64_t>(blockIdx.x) * num_experts;
  // Block-uniform loop: every thread reaches every __match_any_sync and __syncthreads.
  for (int64_t round = f0; round < f1; round += kRankThreads) {
    const int64_t f = round + threadIdx.x;
    const int raw = f < f1 ? idx[f] : -1;
    const bool valid = raw >= 0 && raw < num_experts;
    const int e = valid ? raw : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int warp_rank = __popc(peers & ((1u << lane) - 1u));
    const bool leader = valid && warp_rank == 0;
    if (leader) warp_cnt[warp * num_experts + e] = __popc(peers);
    __syncthreads();
    int32_t rank = 0, new_running = 0;
    bool last_leader = false;
    if (valid) {
      int32_t before = running[e];
      for (int w = 0; w < warp; ++w) before += warp_cnt[w * num_experts + e];
      rank = before + warp_rank;
      if (leader) {
        last_leader = true;
        for (int w = warp + 1; w < kRankWarps; ++w) {
          last_leader = last_leader && warp_cnt[w * num_experts + e] == 0;
        }
        new_running = before + __popc(peers);
      }
    }
    __syncthreads();
    if (last_leader) running[e] = new_running;
    if (leader) warp_cnt[warp * num_experts + e] = 0;
    if (f < f1) {
      int32_t dest = -1;
      if (valid) {
        const int32_t row = base[e] + rank;
        // Pad mode: rank past the capacity is an error state; drop it rather than overflow.
        if (capacity == 0 || row - e * capacity < capacity) dest = row;
        // A routing keeping more slots than permuted_x has rows (a wrong max_routed_rows):
        // drop them rather than write out of bounds.
        if (dest >= max_rows) dest = -1;
      }
      row_map[f] = dest;
      if (dest >= 0) {
        permuted_probs[dest] = probs[f];
        if (source_rows != nullptr) source_rows[dest] = static_cast<int32_t>(f / k);
      }
    }
    __syncthreads();
  }
}

template <typename V>
__global__ void ScatterRowsKernel(const V* __restrict__ src, const int32_t* __restrict__ row_map,
                                  int k, int64_t units, int64_t max_rows, V* __restrict__ dst) {
  extern __shared__ int32_t dest[];  // [k]
  const int64_t t = blockIdx.x;
  for (int s = threadIdx.x; s < k; s += blockDim.x) {
    const int32_t r = row_map[t * k + s];
    dest[s] = (r >= 0 && r < max_rows) ? r : -1;
  }
  __syncthreads();
  const V* in = src + t * units;
  for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
    const V v = in[u];
    for (int s = 0; s < k; ++s) {
      if (dest[s] >= 0) dst[dest[s] * units + u] = v;
    }
  }
}

template <typename V>
__global__ void ZeroPaddingRowsKernel(const int32_t* __restrict__ kept, int num_experts,
                                      int capacity, int64_t units, V* __restrict__ dst,
                                      float* __restrict__ probs) {
  const int64_t rows = static_cast<int64_t>(num_experts) * capacity;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t e = row / capacity;
    if (row - e * capacity < kept[e]) continue;  // block-uniform
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) dst[row * units + u] = V{};
    if (threadIdx.x == 0) probs[row] = 0.0f;
  }
}

// out[t] = sum_s y[row_map[t, s]] in fp32, slot order; out_probs[t, s] = probs[row_map[t, s]].
template <typename T, int V>
__global__ void GatherSumKernel(const Pack<T, V>* __restrict__ y, const float* __restrict__ probs,
                                const int32_t* __restrict__ row_map, int k, int64_t units,
                                int64_t max_rows, Pack<T, V>* __restrict__ out,
                                float* __restrict__ out_probs) {
  extern __shared__ int32_t src_row[];  // [k]
  const int64_t t = blockIdx.x;
  for (int s = threadIdx.x; s < k; s += blockDim.x) {
    const int32_t r = row_map[t * k + s];
    const bool ok = r >= 0 && r < max_rows;
    src_row[s] = ok ? r : -1;
    if (out_probs != nullptr) out_probs[t * k + s] = ok ? probs[r] : 0.0f;
  }
  __syncthreads();
  for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.0f;
    for (int s = 0; s < k; ++s) {
      if (src_row[s] < 0) continue;
      const Pack<T, V> p = y[src_row[s] * units + u];
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] += ToFloat(p.v[i]);
    }
    Pack<T, V> o;
#pragma unroll
    for (int i = 0; i < V; ++i) o.v[i] = FromFloat<T>(acc[i]);
    out[t * units + u] = o;
  }
}

// Row copies (and pad-mode zero rows) moved in units of V.
template <typename V>
absl::Status LaunchCopies(cudaStream_t cs, const void* src, const int32_t* row_map, int64_t t,
                          int k, int64_t row_bytes, int64_t max_rows, void* dst,
                          const int32_t* kept, int num_experts, int capacity, float* probs) {
  const int64_t units = row_bytes / static_cast<int64_t>(sizeof(V));
  if (t > 0 && units > 0) {
    ScatterRowsKernel<V><<<static_cast<unsigned>(t), ThreadsFor(units), k * sizeof(int32_t), cs>>>(
        static_cast<const V*>(src), row_map, k, units, max_rows, static_cast<V*>(dst));
    SY_CUDA_RETURN_IF_LAUNCH_ERROR(ScatterRowsKernel);
  }
  if (capacity > 0) {
    const int64_t rows = static_cast<int64_t>(num_experts) * capacity;
    ZeroPaddingRowsKernel<V>
        <<<static_cast<unsigned>(std::min<int64_t>(rows, 8192)), ThreadsFor(units), 0, cs>>>(
            kept, num_experts, capacity, units, static_cast<V*>(dst), probs);
    SY_CUDA_RETURN_IF_LAUNCH_ERROR(ZeroPaddingRowsKernel);
  }
  return absl::OkStatus();
}

absl::Status LaunchCopiesAnyUnit(cudaStream_t cs, const void* src, const int32_t* row_map,
                                 int64_t t, int k, int64_t row_bytes, int64_t max_rows, void* dst,
                                 const int32_t* kept, int num_experts, int capacity, float* probs) {
  return WithCopyUnit(row_bytes, src, dst, [&](auto unit) {
    return LaunchCopies<decltype(unit)>(cs, src, row_map, t, k, row_bytes, max_rows, dst, kept,
                                        num_experts, capacity, probs);
  });
}

template <typename T, int V>
absl::Status LaunchGatherSum(cudaStream_t cs, const Tensor& y, const Tensor& probs,
                             const Tensor& row_map, const Tensor& out, const Tensor& out_probs) {
  const int64_t units = out.dim(1) / V;
  const int k = static_cast<int>(row_map.dim(1));
  GatherSumKernel<T, V>
      <<<static_cast<unsigned>(out.dim(0)), ThreadsFor(units), k * sizeof(int32_t), cs>>>(
          static_cast<const Pack<T, V>*>(y.data), probs.as<float>(), row_map.as<int32_t>(), k,
          units, y.dim(0), static_cast<Pack<T, V>*>(out.data), out_probs.as<float>());
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(GatherSumKernel);
  return absl::OkStatus();
}

}  // namespace

absl::Status TokensPerExpertCuda(const Stream& stream, const Tensor& topk_idx, int64_t num_experts,
                                 const Tensor& counts) {
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  const cudaStream_t cs = CudaStreamOf(stream);
  SY_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(counts.data, 0, counts.bytes(), cs));
  const int64_t t = topk_idx.dim(0);
  const int k = static_cast<int>(topk_idx.dim(1));
  if (t == 0 || k == 0) return absl::OkStatus();
  const int64_t chunks = (t + kChunk - 1) / kChunk;
  ChunkHistogramKernel<<<static_cast<unsigned>(chunks), kHistThreads, num_experts * sizeof(int32_t),
                         cs>>>(topk_idx.as<int32_t>(), t, k, static_cast<int>(num_experts), nullptr,
                               counts.as<int32_t>());
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(ChunkHistogramKernel);
  return absl::OkStatus();
}

absl::Status PermuteCuda(const Stream& stream, const Tensor& x, const Tensor& topk_idx,
                         const Tensor& topk_probs, int64_t num_experts, int64_t pad_to_capacity,
                         int64_t max_rows, const Tensor& permuted_x, const Tensor& permuted_probs,
                         const Tensor& row_map, const Tensor& source_rows,
                         const Tensor& tokens_per_expert, const Tensor& workspace) {
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  const cudaStream_t cs = CudaStreamOf(stream);
  const int64_t t = topk_idx.dim(0);
  const int k = static_cast<int>(topk_idx.dim(1));
  const int e_count = static_cast<int>(num_experts);
  const int capacity = static_cast<int>(pad_to_capacity);
  const int64_t chunks = (t + kChunk - 1) / kChunk;
  int32_t* chunk_base = workspace.as<int32_t>();      // [chunks, E]
  int32_t* kept = chunk_base + chunks * num_experts;  // [E]
  if (chunks > 0) {
    ChunkHistogramKernel<<<static_cast<unsigned>(chunks), kHistThreads,
                           num_experts * sizeof(int32_t), cs>>>(topk_idx.as<int32_t>(), t, k,
                                                                e_count, chunk_base, nullptr);
    SY_CUDA_RETURN_IF_LAUNCH_ERROR(ChunkHistogramKernel);
  }
  ExpertOffsetsKernel<<<1, kScanThreads, 0, cs>>>(chunk_base, chunks, e_count, capacity,
                                                  tokens_per_expert.as<int32_t>(), kept);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(ExpertOffsetsKernel);
  if (chunks > 0) {
    PermuteRankKernel<<<static_cast<unsigned>(chunks), kRankThreads,
                        num_experts*(kRankWarps + 1) * sizeof(int32_t), cs>>>(
        topk_idx.as<int32_t>(), topk_probs.as<float>(), t, k, e_count, capacity, chunk_base,
        max_rows, row_map.as<int32_t>(), permuted_probs.as<float>(),
        source_rows.data != nullptr ? source_rows.as<int32_t>() : nullptr);
    SY_CUDA_RETURN_IF_LAUNCH_ERROR(PermuteRankKernel);
  }
  if (permuted_x.data == nullptr) return absl::OkStatus();  // PermuteIndex: no rows move
  const int64_t row_bytes = x.dim(1) * static_cast<int64_t>(DTypeSize(x.dtype));
  return LaunchCopiesAnyUnit(cs, x.data, row_map.as<int32_t>(), t, k, row_bytes, permuted_x.dim(0),
                             permuted_x.data, kept, e_count, capacity, permuted_probs.as<float>());
}

absl::Status GatherSumCuda(const Stream& stream, const Tensor& y, const Tensor& probs,
                           const Tensor& row_map, const Tensor& out, const Tensor& out_probs) {
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  const cudaStream_t cs = CudaStreamOf(stream);
  if (out.dim(0) == 0) return absl::OkStatus();
  const int64_t h = out.dim(1);
  const bool aligned = UnitBytes(16, y.data, out.data) == 16;
  if (out.dtype == DType::kBF16) {
    if (aligned && h % 8 == 0) {
      return LaunchGatherSum<__nv_bfloat16, 8>(cs, y, probs, row_map, out, out_probs);
    }
    return LaunchGatherSum<__nv_bfloat16, 1>(cs, y, probs, row_map, out, out_probs);
  }
  if (aligned && h % 4 == 0)
    return LaunchGatherSum<float, 4>(cs, y, probs, row_map, out, out_probs);
  return LaunchGatherSum<float, 1>(cs, y, probs, row_map, out, out_probs);
}

absl::Status ScatterRowsCuda(const Stream& stream, const Tensor& dout, const Tensor& row_map,
                             const Tensor& dy, bool zero_unmapped_rows) {
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  const cudaStream_t cs = CudaStreamOf(stream);
  if (zero_unmapped_rows && dy.bytes() > 0) {
    SY_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dy.data, 0, dy.bytes(), cs));
  }
  const int64_t row_bytes = dout.dim(1) * static_cast<int64_t>(DTypeSize(dout.dtype));
  return LaunchCopiesAnyUnit(cs, dout.data, row_map.as<int32_t>(), dout.dim(0),
                             static_cast<int>(row_map.dim(1)), row_bytes, dy.dim(0), dy.data,
                             nullptr, 0, 0, nullptr);
}

}  // namespace switchyard::kernels::internal
