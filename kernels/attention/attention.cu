// CUDA path of causal GQA attention. bf16 tensors (16-byte aligned) go to the tensor-core kernels
// of attention_tc.cu; this file keeps the simple tiled flash-attention kernels with fp32 math that
// serve f32 tensors (and bf16 tensors the tensor-core path cannot take). The rest of this comment
// describes those SIMT kernels.
//
// Tiles are 32 query rows x 32 keys; a block has 4 warps and each warp owns 8 rows (forward, dq)
// or 8 keys (dk/dv) of its tile; a lane owns D / 32 columns d = lane + 32 c of each accumulator
// row. Scores are computed with lane = the other tile index and exchanged with __shfl_sync, so
// no score tile goes through shared memory. Tiles of q/k/v/dO are staged in dynamic shared
// memory as fp32 (rows read by varying lanes are padded to D + 1 floats against bank conflicts).
//   Forward:   block (query tile, q head, sequence); online softmax over the key tiles up to
//              the one holding key (last row of the tile) + off (Geometry: bottom-right mask).
//   Delta:     one warp per (token, q head): delta = sum_d dO * o.
//   dk/dv:     block (key tile, kv head, sequence); loops over the group's query heads and the
//              query tiles from the one holding row k0 - off, in a fixed order, accumulating in
//              registers (deterministic).
//   dq:        block (query tile, q head, sequence); loops over the forward's key tiles.
// UNOPTIMISED: CUDA cores only, no tensor cores, no pipelining of tile loads.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_tc.h"
#include "kernels/device_convert.cuh"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

constexpr int kTile = 32;                 // query rows and keys per tile
constexpr int kWarps = 4;                 // warps per block
constexpr int kPerWarp = kTile / kWarps;  // rows (or keys) a warp owns
constexpr int kThreads = kWarps * 32;
constexpr unsigned kFull = 0xffffffffu;

// Bottom-right causal mask: query row i of a sequence (s_n rows from b * s_n) sees keys
// j <= i + off of the same sequence (kv_n rows from b * kv_n; off = kv_n - s_n >= 0, 0 for the
// square causal mask).
struct Geometry {
  int64_t s_n, hq, hkv, group;  // group = Hq / Hkv
  int64_t kv_n, off;
  float scale;
};

__device__ __forceinline__ float WarpMax(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
  return x;
}
__device__ __forceinline__ float WarpSum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

// Copies rows [row0, row0 + kTile) of head `head` of a [T, H, D] tensor (sequence base `base`,
// valid rows < s_n) into smem [kTile][stride] as fp32; rows past the sequence are zero.
template <typename T, int kD>
__device__ void LoadTile(const T* src, int64_t base, int64_t row0, int64_t s_n, int64_t heads,
                         int64_t head, float* dst, int stride) {
  for (int e = threadIdx.x; e < kTile * kD; e += kThreads) {
    const int r = e / kD, x = e % kD;
    const int64_t row = row0 + r;
    dst[r * stride + x] = row < s_n ? ToFloat(src[((base + row) * heads + head) * kD + x]) : 0.0f;
  }
}

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    AttentionForwardKernel(const T* q, const T* k, const T* v, T* o, float* lse, Geometry g) {
  constexpr int kC = kD / 32;
  extern __shared__ float smem[];
  float* qs = smem;                   // [kTile][kD]      (row read warp-uniformly)
  float* ks = qs + kTile * kD;        // [kTile][kD + 1]  (row = lane)
  float* vs = ks + kTile * (kD + 1);  // [kTile][kD]      (column = lane + 32 c)
  const int qt = blockIdx.x, h = blockIdx.y;
  const int64_t b = blockIdx.z, base = b * g.s_n, kbase = b * g.kv_n, q0 = int64_t{qt} * kTile;
  const int64_t kvh = h / g.group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Last key tile: the one holding the last key the tile's last row sees (< kv_n).
  const int64_t kt_last = (min(q0 + kTile, g.s_n) - 1 + g.off) / kTile;

  LoadTile<T, kD>(q, base, q0, g.s_n, g.hq, h, qs, kD);
  float m[kPerWarp], l[kPerWarp], acc[kPerWarp][kC];
#pragma unroll
  for (int r = 0; r < kPerWarp; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < kC; ++c) acc[r][c] = 0.0f;
  }
  for (int64_t kt = 0; kt <= kt_last; ++kt) {
    const int64_t k0 = kt * kTile;
    __syncthreads();  // the previous tile is consumed (and, first time, qs is ready below)
    LoadTile<T, kD>(k, kbase, k0, g.kv_n, g.hkv, kvh, ks, kD + 1);
    LoadTile<T, kD>(v, kbase, k0, g.kv_n, g.hkv, kvh, vs, kD);
    __syncthreads();
    float s[kPerWarp];
#pragma unroll
    for (int r = 0; r < kPerWarp; ++r) s[r] = 0.0f;
    for (int x = 0; x < kD; ++x) {
      const float kx = ks[lane * (kD + 1) + x];
#pragma unroll
      for (int r = 0; r < kPerWarp; ++r) s[r] += qs[(warp * kPerWarp + r) * kD + x] * kx;
    }
    const int64_t key = k0 + lane;
#pragma unroll
    for (int r = 0; r < kPerWarp; ++r) {
      const int64_t row = q0 + warp * kPerWarp + r;
      const bool valid = row < g.s_n && key <= row + g.off;  // implies key < kv_n
      const float sc = valid ? s[r] * g.scale : -INFINITY;
      const float m_new = fmaxf(m[r], WarpMax(sc));
      float p = 0.0f, corr = 1.0f;
      if (m_new != -INFINITY) {  // warp-uniform
        p = valid ? expf(sc - m_new) : 0.0f;
        corr = expf(m[r] - m_new);  // exp(-inf) = 0 on the first live tile
      }
      l[r] = l[r] * corr + WarpSum(p);
      m[r] = m_new;
      s[r] = p;
#pragma unroll
      for (int c = 0; c < kC; ++c) acc[r][c] *= corr;
    }
    for (int j = 0; j < kTile; ++j) {
      float vj[kC];
#pragma unroll
      for (int c = 0; c < kC; ++c) vj[c] = vs[j * kD + lane + 32 * c];
#pragma unroll
      for (int r = 0; r < kPerWarp; ++r) {
        const float p = __shfl_sync(kFull, s[r], j);
#pragma unroll
        for (int c = 0; c < kC; ++c) acc[r][c] += p * vj[c];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kPerWarp; ++r) {
    const int64_t row = q0 + warp * kPerWarp + r;
    if (row >= g.s_n) continue;
    const float inv = 1.0f / l[r];
    T* out = o + ((base + row) * g.hq + h) * kD;
#pragma unroll
    for (int c = 0; c < kC; ++c) out[lane + 32 * c] = FromFloat<T>(acc[r][c] * inv);
    if (lane == 0) lse[(b * g.hq + h) * g.s_n + row] = m[r] + logf(l[r]);
  }
}

// delta[b, h, s] = sum_d dO[t, h, d] * o[t, h, d]; one warp per (t, h).
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    AttentionDeltaKernel(const T* o, const T* d_o, float* delta, int64_t t_n, Geometry g) {
  const int64_t w = (int64_t{blockIdx.x} * kThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= t_n * g.hq) return;  // warp-uniform
  const int64_t t = w / g.hq, h = w % g.hq;
  float s = 0.0f;
  for (int x = lane; x < kD; x += 32) s += ToFloat(o[w * kD + x]) * ToFloat(d_o[w * kD + x]);
  s = WarpSum(s);
  const int64_t b = t / g.s_n, i = t % g.s_n;
  if (lane == 0) delta[(b * g.hq + h) * g.s_n + i] = s;
}

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    AttentionDkDvKernel(const T* q, const T* k, const T* v, const T* d_o, const float* lse,
                        const float* delta, T* dk, T* dv, Geometry g) {
  constexpr int kC = kD / 32;
  extern __shared__ float smem[];
  float* ks = smem;                    // [kTile][kD]      (row read warp-uniformly)
  float* vs = ks + kTile * kD;         // [kTile][kD]
  float* qs = vs + kTile * kD;         // [kTile][kD + 1]  (row = lane, and column = lane)
  float* dos = qs + kTile * (kD + 1);  // [kTile][kD + 1]
  const int kt = blockIdx.x, kvh = blockIdx.y;
  const int64_t b = blockIdx.z, base = b * g.s_n, kbase = b * g.kv_n, k0 = int64_t{kt} * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_tiles = static_cast<int>((g.s_n + kTile - 1) / kTile);
  // Query i sees key j iff i >= j - off: the first query tile holds row max(0, k0 - off).
  const int qt_begin = static_cast<int>(max(int64_t{0}, k0 - g.off) / kTile);

  LoadTile<T, kD>(k, kbase, k0, g.kv_n, g.hkv, kvh, ks, kD);
  LoadTile<T, kD>(v, kbase, k0, g.kv_n, g.hkv, kvh, vs, kD);
  float dk_acc[kPerWarp][kC], dv_acc[kPerWarp][kC];
#pragma unroll
  for (int r = 0; r < kPerWarp; ++r) {
#pragma unroll
    for (int c = 0; c < kC; ++c) dk_acc[r][c] = dv_acc[r][c] = 0.0f;
  }
  for (int64_t h = kvh * g.group; h < (kvh + 1) * g.group; ++h) {
    for (int qt = qt_begin; qt < n_tiles; ++qt) {
      const int64_t q0 = int64_t{qt} * kTile, row = q0 + lane;
      __syncthreads();
      LoadTile<T, kD>(q, base, q0, g.s_n, g.hq, h, qs, kD + 1);
      LoadTile<T, kD>(d_o, base, q0, g.s_n, g.hq, h, dos, kD + 1);
      __syncthreads();
      // Lane = query row; r = this warp's keys.
      float s[kPerWarp], dp[kPerWarp];
#pragma unroll
      for (int r = 0; r < kPerWarp; ++r) s[r] = dp[r] = 0.0f;
      for (int x = 0; x < kD; ++x) {
        const float qx = qs[lane * (kD + 1) + x], dox = dos[lane * (kD + 1) + x];
#pragma unroll
        for (int r = 0; r < kPerWarp; ++r) {
          s[r] += qx * ks[(warp * kPerWarp + r) * kD + x];
          dp[r] += dox * vs[(warp * kPerWarp + r) * kD + x];
        }
      }
      const bool row_ok = row < g.s_n;
      const float l_i = row_ok ? lse[(b * g.hq + h) * g.s_n + row] : 0.0f;
      const float d_i = row_ok ? delta[(b * g.hq + h) * g.s_n + row] : 0.0f;
#pragma unroll
      for (int r = 0; r < kPerWarp; ++r) {
        const int64_t key = k0 + warp * kPerWarp + r;
        const bool valid = row_ok && key <= row + g.off;  // key <= row + off < kv_n
        const float p = valid ? expf(s[r] * g.scale - l_i) : 0.0f;
        s[r] = p;
        dp[r] = p * (dp[r] - d_i);  // dS (without the scale)
      }
      for (int i = 0; i < kTile; ++i) {
        float qi[kC], doi[kC];
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          qi[c] = qs[i * (kD + 1) + lane + 32 * c];
          doi[c] = dos[i * (kD + 1) + lane + 32 * c];
        }
#pragma unroll
        for (int r = 0; r < kPerWarp; ++r) {
          const float p = __shfl_sync(kFull, s[r], i), ds = __shfl_sync(kFull, dp[r], i);
#pragma unroll
          for (int c = 0; c < kC; ++c) {
            dv_acc[r][c] += p * doi[c];
            dk_acc[r][c] += ds * qi[c];
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kPerWarp; ++r) {
    const int64_t key = k0 + warp * kPerWarp + r;
    if (key >= g.kv_n) continue;
    const int64_t off = ((kbase + key) * g.hkv + kvh) * kD;
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      dk[off + lane + 32 * c] = FromFloat<T>(dk_acc[r][c] * g.scale);
      dv[off + lane + 32 * c] = FromFloat<T>(dv_acc[r][c]);
    }
  }
}

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    AttentionDqKernel(const T* q, const T* k, const T* v, const T* d_o, const float* lse,
                      const float* delta, T* dq, Geometry g) {
  constexpr int kC = kD / 32;
  extern __shared__ float smem[];
  float* qs = smem;                   // [kTile][kD]      (row read warp-uniformly)
  float* dos = qs + kTile * kD;       // [kTile][kD]
  float* ks = dos + kTile * kD;       // [kTile][kD + 1]  (row = lane, and column = lane)
  float* vs = ks + kTile * (kD + 1);  // [kTile][kD + 1]
  const int qt = blockIdx.x, h = blockIdx.y;
  const int64_t b = blockIdx.z, base = b * g.s_n, kbase = b * g.kv_n, q0 = int64_t{qt} * kTile;
  const int64_t kvh = h / g.group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t kt_last = (min(q0 + kTile, g.s_n) - 1 + g.off) / kTile;  // as the forward

  LoadTile<T, kD>(q, base, q0, g.s_n, g.hq, h, qs, kD);
  LoadTile<T, kD>(d_o, base, q0, g.s_n, g.hq, h, dos, kD);
  float l_r[kPerWarp], d_r[kPerWarp], acc[kPerWarp][kC];
#pragma unroll
  for (int r = 0; r < kPerWarp; ++r) {
    const int64_t row = q0 + warp * kPerWarp + r;
    l_r[r] = row < g.s_n ? lse[(b * g.hq + h) * g.s_n + row] : 0.0f;
    d_r[r] = row < g.s_n ? delta[(b * g.hq + h) * g.s_n + row] : 0.0f;
#pragma unroll
    for (int c = 0; c < kC; ++c) acc[r][c] = 0.0f;
  }
  for (int64_t kt = 0; kt <= kt_last; ++kt) {
    const int64_t k0 = kt * kTile, key = k0 + lane;
    __syncthreads();
    LoadTile<T, kD>(k, kbase, k0, g.kv_n, g.hkv, kvh, ks, kD + 1);
    LoadTile<T, kD>(v, kbase, k0, g.kv_n, g.hkv, kvh, vs, kD + 1);
    __syncthreads();
    // Lane = key; r = this warp's query rows.
    float s[kPerWarp], dp[kPerWarp];
#pragma unroll
    for (int r = 0; r < kPerWarp; ++r) s[r] = dp[r] = 0.0f;
    for (int x = 0; x < kD; ++x) {
      const float kx = ks[lane * (kD + 1) + x], vx = vs[lane * (kD + 1) + x];
#pragma unroll
      for (int r = 0; r < kPerWarp; ++r) {
        s[r] += qs[(warp * kPerWarp + r) * kD + x] * kx;
        dp[r] += dos[(warp * kPerWarp + r) * kD + x] * vx;
      }
    }
#pragma unroll
    for (int r = 0; r < kPerWarp; ++r) {
      const int64_t row = q0 + warp * kPerWarp + r;
      const bool valid = row < g.s_n && key <= row + g.off;
      const float p = valid ? expf(s[r] * g.scale - l_r[r]) : 0.0f;
      dp[r] = p * (dp[r] - d_r[r]);
    }
    for (int j = 0; j < kTile; ++j) {
      float kj[kC];
#pragma unroll
      for (int c = 0; c < kC; ++c) kj[c] = ks[j * (kD + 1) + lane + 32 * c];
#pragma unroll
      for (int r = 0; r < kPerWarp; ++r) {
        const float ds = __shfl_sync(kFull, dp[r], j);
#pragma unroll
        for (int c = 0; c < kC; ++c) acc[r][c] += ds * kj[c];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kPerWarp; ++r) {
    const int64_t row = q0 + warp * kPerWarp + r;
    if (row >= g.s_n) continue;
    T* out = dq + ((base + row) * g.hq + h) * kD;
#pragma unroll
    for (int c = 0; c < kC; ++c) out[lane + 32 * c] = FromFloat<T>(acc[r][c] * g.scale);
  }
}

// Every kernel above uses 2 tiles of [kTile][kD] and 2 of [kTile][kD + 1] floats.
constexpr size_t SmemBytes(int d) { return sizeof(float) * kTile * (4 * d + 2); }

template <typename Kernel>
absl::Status PrepareSmem(Kernel kernel, size_t bytes) {
  SY_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(bytes)));
  return absl::OkStatus();
}

Geometry MakeGeometry(const Tensor& q, const Tensor& k, int64_t seq_len, int64_t kv_seq_len,
                      float scale) {
  return Geometry{
      seq_len, q.dim(1), k.dim(1), q.dim(1) / k.dim(1), kv_seq_len, kv_seq_len - seq_len, scale};
}

absl::Status CheckGrid(int64_t tiles, int64_t heads, int64_t batches) {
  if (tiles > INT32_MAX || heads > 65535 || batches > 65535) {
    return absl::InvalidArgumentError("Attention CUDA: grid too large (heads and batch <= 65535)");
  }
  return absl::OkStatus();
}

template <typename T, int kD>
absl::Status Forward(const Stream& stream, const Tensor& q, const Tensor& k, const Tensor& v,
                     int64_t seq_len, int64_t kv_seq_len, float scale, const Tensor& o,
                     const Tensor& lse) {
  const Geometry g = MakeGeometry(q, k, seq_len, kv_seq_len, scale);
  const int64_t tiles = (seq_len + kTile - 1) / kTile, batches = q.dim(0) / seq_len;
  SY_RETURN_IF_ERROR(CheckGrid(tiles, g.hq, batches));
  const size_t smem = SmemBytes(kD);
  SY_RETURN_IF_ERROR(PrepareSmem(AttentionForwardKernel<T, kD>, smem));
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(g.hq),
                  static_cast<unsigned>(batches));
  AttentionForwardKernel<T, kD><<<grid, kThreads, smem, stream.cuda_stream>>>(
      q.as<const T>(), k.as<const T>(), v.as<const T>(), o.as<T>(), lse.as<float>(), g);
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T, int kD>
absl::Status Backward(const Stream& stream, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& o, const Tensor& lse, const Tensor& d_o, int64_t seq_len,
                      int64_t kv_seq_len, float scale, const Tensor& delta, const Tensor& dq,
                      const Tensor& dk, const Tensor& dv) {
  const Geometry g = MakeGeometry(q, k, seq_len, kv_seq_len, scale);
  const int64_t t_n = q.dim(0), tiles = (seq_len + kTile - 1) / kTile, batches = t_n / seq_len;
  const int64_t kv_tiles = (kv_seq_len + kTile - 1) / kTile;
  SY_RETURN_IF_ERROR(CheckGrid(tiles, g.hq, batches));
  SY_RETURN_IF_ERROR(CheckGrid(kv_tiles, g.hkv, batches));
  const auto cs = stream.cuda_stream;
  const int64_t warps = t_n * g.hq, delta_blocks = (warps + kWarps - 1) / kWarps;
  if (delta_blocks > INT32_MAX) return absl::InvalidArgumentError("Attention CUDA: T too large");
  AttentionDeltaKernel<T, kD><<<static_cast<unsigned>(delta_blocks), kThreads, 0, cs>>>(
      o.as<const T>(), d_o.as<const T>(), delta.as<float>(), t_n, g);
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());

  const size_t smem = SmemBytes(kD);
  SY_RETURN_IF_ERROR(PrepareSmem(AttentionDkDvKernel<T, kD>, smem));
  SY_RETURN_IF_ERROR(PrepareSmem(AttentionDqKernel<T, kD>, smem));
  const dim3 kv_grid(static_cast<unsigned>(kv_tiles), static_cast<unsigned>(g.hkv),
                     static_cast<unsigned>(batches));
  AttentionDkDvKernel<T, kD><<<kv_grid, kThreads, smem, cs>>>(
      q.as<const T>(), k.as<const T>(), v.as<const T>(), d_o.as<const T>(), lse.as<const float>(),
      delta.as<const float>(), dk.as<T>(), dv.as<T>(), g);
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const dim3 q_grid(static_cast<unsigned>(tiles), static_cast<unsigned>(g.hq),
                    static_cast<unsigned>(batches));
  AttentionDqKernel<T, kD><<<q_grid, kThreads, smem, cs>>>(
      q.as<const T>(), k.as<const T>(), v.as<const T>(), d_o.as<const T>(), lse.as<const float>(),
      delta.as<const float>(), dq.as<T>(), g);
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

absl::Status AttentionForwardCuda(const Stream& stream, const Tensor& q, const Tensor& k,
                                  const Tensor& v, int64_t seq_len, int64_t kv_seq_len, float scale,
                                  const Tensor& o, const Tensor& lse) {
  if (q.numel() == 0) return absl::OkStatus();
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  if (AttentionTcApplies(seq_len, kv_seq_len, {&q, &k, &v, &o})) {
    return AttentionForwardTc(stream, q, k, v, seq_len, kv_seq_len, scale, o, lse);
  }
  const bool bf16 = q.dtype == DType::kBF16;
  if (q.dim(2) == 64) {
    return bf16 ? Forward<__nv_bfloat16, 64>(stream, q, k, v, seq_len, kv_seq_len, scale, o, lse)
                : Forward<float, 64>(stream, q, k, v, seq_len, kv_seq_len, scale, o, lse);
  }
  return bf16 ? Forward<__nv_bfloat16, 128>(stream, q, k, v, seq_len, kv_seq_len, scale, o, lse)
              : Forward<float, 128>(stream, q, k, v, seq_len, kv_seq_len, scale, o, lse);
}

absl::Status AttentionBackwardCuda(const Stream& stream, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const Tensor& o, const Tensor& lse,
                                   const Tensor& d_o, int64_t seq_len, int64_t kv_seq_len,
                                   float scale, const Tensor& delta, const Tensor& dq,
                                   const Tensor& dk, const Tensor& dv) {
  if (q.numel() == 0) return absl::OkStatus();
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  if (AttentionTcApplies(seq_len, kv_seq_len, {&q, &k, &v, &o, &d_o, &dq, &dk, &dv})) {
    return AttentionBackwardTc(stream, q, k, v, o, lse, d_o, seq_len, kv_seq_len, scale, delta, dq,
                               dk, dv);
  }
  const bool bf16 = q.dtype == DType::kBF16;
  if (q.dim(2) == 64) {
    return bf16 ? Backward<__nv_bfloat16, 64>(stream, q, k, v, o, lse, d_o, seq_len, kv_seq_len,
                                              scale, delta, dq, dk, dv)
                : Backward<float, 64>(stream, q, k, v, o, lse, d_o, seq_len, kv_seq_len, scale,
                                      delta, dq, dk, dv);
  }
  return bf16 ? Backward<__nv_bfloat16, 128>(stream, q, k, v, o, lse, d_o, seq_len, kv_seq_len,
                                             scale, delta, dq, dk, dv)
              : Backward<float, 128>(stream, q, k, v, o, lse, d_o, seq_len, kv_seq_len, scale,
                                     delta, dq, dk, dv);
}

}  // namespace switchyard::kernels::internal
