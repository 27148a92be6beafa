// CUDA path of the embedding lookup. The forward copies rows with the widest word the row size
// and pointers allow; the backward is a device-side stable counting sort of token indices by id
// followed by one block per id summing its dout rows in ascending token order (no float
// atomics, so the result is bit-identical from run to run).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/device_convert.cuh"
#include "kernels/embedding/embedding.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

constexpr int kForwardThreads = 128;
constexpr int kTokenThreads = 256;
constexpr int kScanThreads = 1024;
constexpr int kReduceThreads = 128;
constexpr int kReduceCols = 8;  // columns per thread held in registers

cudaStream_t S(const Stream& s) { return s.cuda_stream; }

unsigned Blocks(int64_t n, int threads, int64_t cap) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(b, cap)));
}

// out row t = table row ids[t] as `words` words of type W; zero for an invalid id.
template <typename W>
__global__ void EmbeddingForwardKernel(const int32_t* __restrict__ ids, const W* __restrict__ table,
                                       W* __restrict__ out, int64_t t_n, int64_t v_n,
                                       int64_t words) {
  for (int64_t t = blockIdx.x; t < t_n; t += gridDim.x) {
    const int32_t id = ids[t];
    const bool valid = id >= 0 && id < v_n;
    const W* src = table + static_cast<int64_t>(valid ? id : 0) * words;
    W* dst = out + t * words;
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) dst[w] = valid ? src[w] : W{};
  }
}

template <typename W>
absl::Status LaunchForward(const Stream& stream, const Tensor& ids, const Tensor& table,
                           const Tensor& out) {
  const int64_t t_n = out.dim(0);
  const int64_t words = static_cast<int64_t>(out.dim(1) * DTypeSize(out.dtype) / sizeof(W));
  EmbeddingForwardKernel<W><<<Blocks(t_n, 1, 1 << 20), kForwardThreads, 0, S(stream)>>>(
      ids.as<int32_t>(), static_cast<const W*>(table.data), static_cast<W*>(out.data), t_n,
      table.dim(0), words);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(EmbeddingForwardKernel);
  return absl::OkStatus();
}

// counts[ids[t]] += 1 for valid ids (integer atomics: the result does not depend on order).
__global__ void EmbeddingHistogramKernel(const int32_t* __restrict__ ids, int32_t* counts,
                                         int64_t t_n, int64_t v_n) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < t_n;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int32_t id = ids[t];
    if (id >= 0 && id < v_n) atomicAdd(&counts[id], 1);
  }
}

// One block: offsets[v] = sum_{u < v} counts[u] for v in [0, V]; counts becomes the scatter
// cursor (counts[v] = offsets[v]).
__global__ void EmbeddingScanKernel(int32_t* counts, int32_t* offsets, int64_t v_n) {
  __shared__ int32_t partial[kScanThreads];
  const int64_t chunk = (v_n + kScanThreads - 1) / kScanThreads;
  const int64_t begin = std::min<int64_t>(v_n, threadIdx.x * chunk);
  const int64_t end = std::min<int64_t>(v_n, begin + chunk);
  int32_t local = 0;
  for (int64_t v = begin; v < end; ++v) local += counts[v];
  partial[threadIdx.x] = local;
  __syncthreads();
  for (int stride = 1; stride < kScanThreads; stride *= 2) {  // inclusive Hillis-Steele scan
    const int32_t add = threadIdx.x >= stride ? partial[threadIdx.x - stride] : 0;
    __syncthreads();
    partial[threadIdx.x] += add;
    __syncthreads();
  }
  int32_t running = partial[threadIdx.x] - local;
  for (int64_t v = begin; v < end; ++v) {
    const int32_t c = counts[v];
    offsets[v] = running;
    counts[v] = running;
    running += c;
  }
  if (threadIdx.x == kScanThreads - 1) offsets[v_n] = partial[kScanThreads - 1];
}

// unsorted[cursor[id]++] = t: groups tokens by id, in an arbitrary order within an id.
__global__ void EmbeddingScatterKernel(const int32_t* __restrict__ ids, int32_t* cursor,
                                       int32_t* __restrict__ unsorted, int64_t t_n, int64_t v_n) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < t_n;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int32_t id = ids[t];
    if (id >= 0 && id < v_n) unsorted[atomicAdd(&cursor[id], 1)] = static_cast<int32_t>(t);
  }
}

// sorted[offsets[id] + rank] = t with rank = #{tokens of the same id before t}: ascending token
// order within each id. Costs sum over ids of count^2 reads (broadcast within a warp).
__global__ void EmbeddingRankKernel(const int32_t* __restrict__ ids,
                                    const int32_t* __restrict__ offsets,
                                    const int32_t* __restrict__ unsorted,
                                    int32_t* __restrict__ sorted, int64_t t_n, int64_t v_n) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < t_n;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int32_t id = ids[t];
    if (id < 0 || id >= v_n) continue;
    const int32_t begin = offsets[id], end = offsets[id + 1];
    int32_t rank = 0;
    for (int32_t i = begin; i < end; ++i) rank += unsorted[i] < t ? 1 : 0;
    sorted[begin + rank] = static_cast<int32_t>(t);
  }
}

// Block v: dtable[v, :] = (accumulate ? dtable[v, :] : 0) + sum of dout rows sorted[offsets[v]
// .. offsets[v + 1]) in that order, fp32. Rows of absent ids are untouched when accumulating.
template <typename TIn, typename TOut>
__global__ void EmbeddingReduceKernel(const TIn* __restrict__ dout, const int32_t* offsets,
                                      const int32_t* __restrict__ sorted, TOut* dtable, int64_t h_n,
                                      bool accumulate) {
  const int64_t v = blockIdx.x;
  const int32_t begin = offsets[v], end = offsets[v + 1];
  TOut* row = dtable + v * h_n;
  if (begin == end) {
    if (!accumulate) {
      for (int64_t h = threadIdx.x; h < h_n; h += blockDim.x) row[h] = FromFloat<TOut>(0.0f);
    }
    return;
  }
  for (int64_t h0 = 0; h0 < h_n; h0 += int64_t(kReduceThreads) * kReduceCols) {
    float acc[kReduceCols];
#pragma unroll
    for (int k = 0; k < kReduceCols; ++k) {
      const int64_t h = h0 + threadIdx.x + int64_t(k) * kReduceThreads;
      acc[k] = (accumulate && h < h_n) ? ToFloat(row[h]) : 0.0f;
    }
    for (int32_t i = begin; i < end; ++i) {
      const TIn* src = dout + static_cast<int64_t>(sorted[i]) * h_n;
#pragma unroll
      for (int k = 0; k < kReduceCols; ++k) {
        const int64_t h = h0 + threadIdx.x + int64_t(k) * kReduceThreads;
        if (h < h_n) acc[k] += ToFloat(src[h]);
      }
    }
#pragma unroll
    for (int k = 0; k < kReduceCols; ++k) {
      const int64_t h = h0 + threadIdx.x + int64_t(k) * kReduceThreads;
      if (h < h_n) row[h] = FromFloat<TOut>(acc[k]);
    }
  }
}

template <typename TIn, typename TOut>
absl::Status LaunchReduce(const Stream& stream, const Tensor& dout, const int32_t* offsets,
                          const int32_t* sorted, const Tensor& dtable, bool accumulate) {
  EmbeddingReduceKernel<TIn, TOut>
      <<<static_cast<unsigned>(dtable.dim(0)), kReduceThreads, 0, S(stream)>>>(
          static_cast<const TIn*>(dout.data), offsets, sorted, static_cast<TOut*>(dtable.data),
          dtable.dim(1), accumulate);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(EmbeddingReduceKernel);
  return absl::OkStatus();
}

__global__ void LocalVocabIdsKernel(const int32_t* __restrict__ ids, int32_t* __restrict__ local,
                                    int64_t t_n, int64_t start, int64_t local_vocab) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < t_n;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t l = static_cast<int64_t>(ids[t]) - start;
    local[t] = l >= 0 && l < local_vocab ? static_cast<int32_t>(l) : -1;
  }
}

}  // namespace

absl::Status LocalVocabIdsCuda(const Stream& stream, const Tensor& ids, int64_t vocab_start,
                               int64_t local_vocab, const Tensor& local_ids) {
  const int64_t t_n = ids.numel();
  if (t_n == 0) return absl::OkStatus();
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  LocalVocabIdsKernel<<<Blocks(t_n, kTokenThreads, 1 << 16), kTokenThreads, 0, S(stream)>>>(
      ids.as<int32_t>(), local_ids.as<int32_t>(), t_n, vocab_start, local_vocab);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(LocalVocabIdsKernel);
  return absl::OkStatus();
}

absl::Status EmbeddingForwardCuda(const Stream& stream, const Tensor& ids, const Tensor& table,
                                  const Tensor& out) {
  if (out.numel() == 0) return absl::OkStatus();
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  const uint64_t row_bytes = static_cast<uint64_t>(out.dim(1)) * DTypeSize(out.dtype);
  const uint64_t align =
      row_bytes | reinterpret_cast<uintptr_t>(table.data) | reinterpret_cast<uintptr_t>(out.data);
  if (align % 16 == 0) return LaunchForward<uint4>(stream, ids, table, out);
  if (align % 8 == 0) return LaunchForward<uint2>(stream, ids, table, out);
  if (align % 4 == 0) return LaunchForward<uint32_t>(stream, ids, table, out);
  return LaunchForward<uint16_t>(stream, ids, table, out);  // bf16 rows: 2-byte multiples
}

absl::Status EmbeddingBackwardCuda(const Stream& stream, const Tensor& ids, const Tensor& dout,
                                   const Tensor& dtable, bool accumulate, const Tensor& workspace) {
  const int64_t t_n = dout.dim(0), v_n = dtable.dim(0);
  if (dtable.numel() == 0) return absl::OkStatus();
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  cudaStream_t s = S(stream);
  int32_t* offsets = static_cast<int32_t*>(workspace.data);  // [V + 1]
  int32_t* cursor = offsets + (v_n + 1);                     // [V]: counts, then cursors
  int32_t* unsorted = cursor + v_n;                          // [T]
  int32_t* sorted = unsorted + t_n;                          // [T]
  SY_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(cursor, 0, sizeof(int32_t) * v_n, s));
  const int32_t* id = ids.as<int32_t>();
  const unsigned token_blocks = Blocks(t_n, kTokenThreads, 1 << 16);
  if (t_n > 0) {
    EmbeddingHistogramKernel<<<token_blocks, kTokenThreads, 0, s>>>(id, cursor, t_n, v_n);
    SY_CUDA_RETURN_IF_LAUNCH_ERROR(EmbeddingHistogramKernel);
  }
  EmbeddingScanKernel<<<1, kScanThreads, 0, s>>>(cursor, offsets, v_n);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(EmbeddingScanKernel);
  if (t_n > 0) {
    EmbeddingScatterKernel<<<token_blocks, kTokenThreads, 0, s>>>(id, cursor, unsorted, t_n, v_n);
    SY_CUDA_RETURN_IF_LAUNCH_ERROR(EmbeddingScatterKernel);
    EmbeddingRankKernel<<<token_blocks, kTokenThreads, 0, s>>>(id, offsets, unsorted, sorted, t_n,
                                                               v_n);
    SY_CUDA_RETURN_IF_LAUNCH_ERROR(EmbeddingRankKernel);
  }
  const bool in_bf16 = dout.dtype == DType::kBF16, out_bf16 = dtable.dtype == DType::kBF16;
  if (in_bf16 && out_bf16) {
    return LaunchReduce<__nv_bfloat16, __nv_bfloat16>(stream, dout, offsets, sorted, dtable,
                                                      accumulate);
  }
  if (in_bf16) {
    return LaunchReduce<__nv_bfloat16, float>(stream, dout, offsets, sorted, dtable, accumulate);
  }
  if (out_bf16) {
    return LaunchReduce<float, __nv_bfloat16>(stream, dout, offsets, sorted, dtable, accumulate);
  }
  return LaunchReduce<float, float>(stream, dout, offsets, sorted, dtable, accumulate);
}

}  // namespace switchyard::kernels::internal
