// bf16 tensor-core CUDA path of causal GQA attention (FlashAttention-2 style).
//
// All matrix products use mma.sync m16n8k16 (bf16 in, fp32 accumulate) fed by ldmatrix from
// shared memory; tiles are copied with cp.async into XOR-swizzled smem (16-byte chunk c of row r
// is stored at chunk c ^ (r & 7), so ldmatrix of 8 rows is bank-conflict free) and double
// buffered: the next tile is in flight while the current one is consumed. Each warp owns 16 rows
// of its output tile, so scores, probabilities and dS stay in registers (the mma accumulator
// layout of S is re-packed in place as the A operand of the next product). Softmax runs in the
// exp2 domain with scale * log2(e) folded in; lse is stored in natural log. 8 warps per block.
//   Forward:  block (query tile of 128, q head, sequence), heaviest (last) query tiles first;
//             key tiles of 64 from 0 to the diagonal; online softmax; o and lse written once.
//             The diagonal is bottom-right aligned (TcGeometry: query i sees keys j <= i + off,
//             off = kv_len - q_len, 0 for the square mask; context parallelism's K/V prefix).
//   Delta:    one warp per (token, q head): delta = rowsum(dO * o).
//   dK/dV:    block (key tile of 128, kv head, sequence), each warp 16 keys; loops, in a fixed
//             order, over the group's query heads and the query tiles (64 rows at D = 64, 32 at
//             D = 128) that see the key tile (rows >= key - off), computing S^T = K Q^T and
//             dP^T = V dO^T, then dV += P^T dO and dK += dS^T Q in registers. No atomics:
//             deterministic.
//   dQ:       block (query tile of 128, q head, sequence); key tiles of 64 up to the diagonal;
//             dQ += dS K.
// Rows past the sequence are zero-filled in smem (never read from global memory) and never
// written; causal and ragged positions are masked to probability 0.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/attention_tc.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpRows = 16;                 // rows of an output tile per warp (mma M)
constexpr int kRowTile = kWarps * kWarpRows;  // 128: query rows (fwd, dq) or keys (dk/dv) per block
constexpr int kColTile = 64;                  // keys (fwd, dq) or queries (dk/dv) per step
constexpr int kMaxSmem = 227 * 1024;          // Hopper opt-in limit per block
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFull = 0xffffffffu;

// Bottom-right causal mask: query row i of a sequence (s_n rows) sees keys j <= i + off of the
// same sequence (kv_n rows, off = kv_n - s_n >= 0; off = 0 is the square causal mask). Query rows
// of sequence b start at b * s_n, key rows at b * kv_n.
struct TcGeometry {
  int s_n, hq, hkv, group;  // group = Hq / Hkv
  int kv_n, off;            // keys per sequence, kv_n - s_n
  float scale, scale_log2;  // scale_log2 = scale * log2(e)
};

template <int kRows, int kD>
constexpr int TileBytes() {
  return kRows * kD * 2;
}

// Byte offset of 16-byte chunk c of row r in a swizzled [rows][kD] bf16 tile.
template <int kD>
__device__ __forceinline__ uint32_t Swz(int r, int c) {
  return static_cast<uint32_t>(r * (kD * 2) + ((c ^ (r & 7)) << 4));
}

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; with valid == false nothing is read and the destination is zero-filled.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsync4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kN>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kN));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c[16 x 8] += a[16 x 16] * b[16 x 8], bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Issues cp.async copies of rows [row0, row0 + kRows) of head `head` of a [T, heads, kD] tensor
// (sequence rows start at `base`) into a swizzled smem tile; rows >= s_n are zero-filled.
template <int kRows, int kD>
__device__ __forceinline__ void LoadTile(const bf16* src, int64_t base, int row0, int s_n,
                                         int heads, int head, uint32_t dst) {
  constexpr int kChunks = kD / 8;
  static_assert((kRows * kChunks) % kThreads == 0, "tile copy must split evenly over threads");
#pragma unroll
  for (int j = 0; j < kRows * kChunks / kThreads; ++j) {
    const int i = j * kThreads + threadIdx.x, r = i / kChunks, c = i % kChunks, row = row0 + r;
    const bool valid = row < s_n;
    const bf16* p = valid ? src + ((base + row) * heads + head) * kD + c * 8 : src;
    CpAsync16(dst + Swz<kD>(r, c), p, valid);
  }
}

// Copies kN floats stat[row0 ..) (rows >= s_n read as 0) into smem.
template <int kN>
__device__ __forceinline__ void LoadStat(const float* stat, int row0, int s_n, uint32_t dst) {
  for (int i = threadIdx.x; i < kN; i += kThreads) {
    const bool valid = row0 + i < s_n;
    CpAsync4(dst + 4 * i, valid ? stat + row0 + i : stat, valid);
  }
}

// acc[16 x kN] += A[a_row0, +16) x B[b_row0, +kN)^T over kD columns; A and B are swizzled smem
// tiles whose rows are the M and N indices (both read with non-transposed ldmatrix).
template <int kD, int kN>
__device__ __forceinline__ void MmaABt(uint32_t a_tile, int a_row0, uint32_t b_tile,
                                       float (&acc)[kN / 8][4], int lane) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    uint32_t a[4];
    LdMatrixX4(a_tile + Swz<kD>(a_row0 + lane % 16, kk * 2 + lane / 16), a);
#pragma unroll
    for (int nb2 = 0; nb2 < kN / 16; ++nb2) {
      uint32_t b[4];
      LdMatrixX4(b_tile + Swz<kD>(nb2 * 16 + lane % 8 + 8 * (lane / 16), kk * 2 + (lane / 8) % 2),
                 b);
      Mma(acc[2 * nb2], a, b[0], b[1]);
      Mma(acc[2 * nb2 + 1], a, b[2], b[3]);
    }
  }
}

// acc[16 x kD] += P[16 x kK] x B[0, kK) where P is in registers (A fragments) and B is a swizzled
// smem tile of kK rows and kD columns (read with transposed ldmatrix).
template <int kD, int kK>
__device__ __forceinline__ void MmaPB(const uint32_t (&p)[kK / 16][4], uint32_t b_tile,
                                      float (&acc)[kD / 8][4], int lane) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
#pragma unroll
    for (int db2 = 0; db2 < kD / 16; ++db2) {
      uint32_t b[4];
      LdMatrixX4Trans(
          b_tile + Swz<kD>(kk * 16 + lane % 8 + 8 * ((lane / 8) % 2), db2 * 2 + lane / 16), b);
      Mma(acc[2 * db2], p[kk], b[0], b[1]);
      Mma(acc[2 * db2 + 1], p[kk], b[2], b[3]);
    }
  }
}

// Re-packs an fp32 accumulator tile [16 x kN] as bf16 A fragments [16 x kN] (k = the N index).
template <int kN>
__device__ __forceinline__ void ToAFrags(const float (&s)[kN / 8][4], uint32_t (&p)[kN / 16][4]) {
#pragma unroll
  for (int j = 0; j < kN / 16; ++j) {
    p[j][0] = PackBf16(s[2 * j][0], s[2 * j][1]);
    p[j][1] = PackBf16(s[2 * j][2], s[2 * j][3]);
    p[j][2] = PackBf16(s[2 * j + 1][0], s[2 * j + 1][1]);
    p[j][3] = PackBf16(s[2 * j + 1][2], s[2 * j + 1][3]);
  }
}

template <int kN>
__device__ __forceinline__ void Zero(float (&a)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) a[i][0] = a[i][1] = a[i][2] = a[i][3] = 0.0f;
}

// Writes the warp's accumulator tile [16 x kD] (rows row_lo = first + lane / 4 and row_lo + 8)
// times `mul` to rows < s_n of head `head` of a [T, heads, kD] tensor.
template <int kD>
__device__ __forceinline__ void StoreRows(const float (&acc)[kD / 8][4], float mul, bf16* dst,
                                          int64_t base, int row_lo, int s_n, int heads, int head,
                                          int lane) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row_lo + 8 * half;
    if (row >= s_n) continue;
    bf16* out = dst + ((base + row) * heads + head) * kD + 2 * (lane % 4);
#pragma unroll
    for (int db = 0; db < kD / 8; ++db) {
      *reinterpret_cast<__nv_bfloat162*>(out + db * 8) =
          __floats2bfloat162_rn(acc[db][2 * half] * mul, acc[db][2 * half + 1] * mul);
    }
  }
}

template <int kD>
struct FwdSmem {
  static constexpr int kQ = TileBytes<kRowTile, kD>(), kKv = TileBytes<kColTile, kD>();
  static constexpr int kBytes = kQ + 2 * 2 * kKv;  // Q + 2 stages of (K, V)
  static_assert(kBytes <= kMaxSmem, "forward smem budget");
};

template <int kD>
__global__ void __launch_bounds__(kThreads, kD == 64 ? 2 : 1)  // 2 blocks at D = 128 spill
    AttentionForwardTcKernel(const bf16* __restrict__ q, const bf16* __restrict__ k,
                             const bf16* __restrict__ v, bf16* __restrict__ o,
                             float* __restrict__ lse, TcGeometry g) {
  using L = FwdSmem<kD>;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t q_s = SmemAddr(smem), kv_s = q_s + L::kQ;  // stage st: K at kv_s + 2 st kKv
  const int n_qt = (g.s_n + kRowTile - 1) / kRowTile;
  const int qt = n_qt - 1 - static_cast<int>(blockIdx.x);  // longest rows first
  const int h = blockIdx.y, kvh = h / g.group;
  const int64_t b = blockIdx.z, base = b * g.s_n, kbase = b * g.kv_n;
  const int q0 = qt * kRowTile, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_w = q0 + warp * kWarpRows, r_lo = row_w + lane / 4;
  // Key tiles up to the one holding the last key the block's last row sees (< kv_n).
  const int n_kt = (min(q0 + kRowTile, g.s_n) - 1 + g.off) / kColTile + 1;

  LoadTile<kRowTile, kD>(q, base, q0, g.s_n, g.hq, h, q_s);
  LoadTile<kColTile, kD>(k, kbase, 0, g.kv_n, g.hkv, kvh, kv_s);
  LoadTile<kColTile, kD>(v, kbase, 0, g.kv_n, g.hkv, kvh, kv_s + L::kKv);
  CpAsyncCommit();

  float acc[kD / 8][4];
  Zero(acc);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int kt = 0; kt < n_kt; ++kt) {
    const uint32_t k_s = kv_s + 2 * (kt & 1) * L::kKv, v_s = k_s + L::kKv;
    if (kt + 1 < n_kt) {
      const uint32_t nk_s = kv_s + 2 * ((kt + 1) & 1) * L::kKv;
      LoadTile<kColTile, kD>(k, kbase, (kt + 1) * kColTile, g.kv_n, g.hkv, kvh, nk_s);
      LoadTile<kColTile, kD>(v, kbase, (kt + 1) * kColTile, g.kv_n, g.hkv, kvh, nk_s + L::kKv);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const int k0 = kt * kColTile;
    if (row_w < g.s_n && k0 <= row_w + kWarpRows - 1 + g.off) {  // warp-uniform: a visible key
      float s[kColTile / 8][4];
      Zero(s);
      MmaABt<kD, kColTile>(q_s, warp * kWarpRows, k_s, s, lane);
      const bool masked = k0 + kColTile - 1 > row_w + g.off || k0 + kColTile > g.kv_n;
      float mx[2] = {m[0], m[1]};
#pragma unroll
      for (int nb = 0; nb < kColTile / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[nb][e] * g.scale_log2;
          if (masked) {
            const int key = k0 + nb * 8 + 2 * (lane % 4) + (e & 1), row = r_lo + 8 * (e / 2);
            if (key > row + g.off || key >= g.kv_n) x = -INFINITY;
          }
          s[nb][e] = x;
          mx[e / 2] = fmaxf(mx[e / 2], x);
        }
      }
      float sub[2], rs[2] = {0.0f, 0.0f}, corr[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(kFull, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(kFull, mx[i], 2));
        sub[i] = mx[i] == -INFINITY ? 0.0f : mx[i];  // fully masked row so far: p = 0, no NaN
        corr[i] = FastExp2(m[i] - sub[i]);           // 0 while m is -inf
        m[i] = mx[i];
      }
#pragma unroll
      for (int nb = 0; nb < kColTile / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[nb][e] = FastExp2(s[nb][e] - sub[e / 2]);
          rs[e / 2] += s[nb][e];
        }
      }
      l[0] = l[0] * corr[0] + rs[0];  // per-thread partial sums; reduced over the quad at the end
      l[1] = l[1] * corr[1] + rs[1];
#pragma unroll
      for (int db = 0; db < kD / 8; ++db) {
        acc[db][0] *= corr[0];
        acc[db][1] *= corr[0];
        acc[db][2] *= corr[1];
        acc[db][3] *= corr[1];
      }
      uint32_t p[kColTile / 16][4];
      ToAFrags<kColTile>(s, p);
      MmaPB<kD, kColTile>(p, v_s, acc, lane);
    }
    __syncthreads();  // the stage is consumed before the next iteration refills it
  }
  float inv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(kFull, l[i], 1);
    l[i] += __shfl_xor_sync(kFull, l[i], 2);
    inv[i] = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
  }
  // Rows of one half share a scale; StoreRows takes one multiplier, so scale in place first.
#pragma unroll
  for (int db = 0; db < kD / 8; ++db) {
    acc[db][0] *= inv[0];
    acc[db][1] *= inv[0];
    acc[db][2] *= inv[1];
    acc[db][3] *= inv[1];
  }
  StoreRows<kD>(acc, 1.0f, o, base, r_lo, g.s_n, g.hq, h, lane);
  if (lane % 4 == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = r_lo + 8 * i;
      if (row < g.s_n) lse[(b * g.hq + h) * g.s_n + row] = m[i] * kLn2 + logf(l[i]);
    }
  }
}

// delta[b, h, s] = sum_d dO[t, h, d] * o[t, h, d]; one warp per (t, h).
template <int kD>
__global__ void __launch_bounds__(kThreads)
    AttentionDeltaTcKernel(const bf16* __restrict__ o, const bf16* __restrict__ d_o,
                           float* __restrict__ delta, int64_t rows, TcGeometry g) {
  const int64_t w = (int64_t{blockIdx.x} * kThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= rows) return;  // warp-uniform
  float s = 0.0f;
#pragma unroll
  for (int x = 2 * lane; x < kD; x += 64) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(o + w * kD + x));
    const float2 c = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(d_o + w * kD + x));
    s += a.x * c.x + a.y * c.y;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(kFull, s, off);
  const int64_t t = w / g.hq, h = w % g.hq, b = t / g.s_n, i = t % g.s_n;
  if (lane == 0) delta[(b * g.hq + h) * g.s_n + i] = s;
}

template <int kD>
struct DqSmem {
  static constexpr int kQ = TileBytes<kRowTile, kD>(), kKv = TileBytes<kColTile, kD>();
  static constexpr int kBytes = 2 * kQ + 2 * 2 * kKv;  // Q, dO + 2 stages of (K, V)
  static_assert(kBytes <= kMaxSmem, "dq smem budget");
};

template <int kD>
__global__ void __launch_bounds__(kThreads, 1)
    AttentionDqTcKernel(const bf16* __restrict__ q, const bf16* __restrict__ k,
                        const bf16* __restrict__ v, const bf16* __restrict__ d_o,
                        const float* __restrict__ lse, const float* __restrict__ delta,
                        bf16* __restrict__ dq, TcGeometry g) {
  using L = DqSmem<kD>;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t q_s = SmemAddr(smem), do_s = q_s + L::kQ, kv_s = do_s + L::kQ;
  const int n_qt = (g.s_n + kRowTile - 1) / kRowTile;
  const int qt = n_qt - 1 - static_cast<int>(blockIdx.x);
  const int h = blockIdx.y, kvh = h / g.group;
  const int64_t b = blockIdx.z, base = b * g.s_n, kbase = b * g.kv_n;
  const int64_t stat = (b * g.hq + h) * g.s_n;
  const int q0 = qt * kRowTile, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_w = q0 + warp * kWarpRows, r_lo = row_w + lane / 4;
  const int n_kt = (min(q0 + kRowTile, g.s_n) - 1 + g.off) / kColTile + 1;

  LoadTile<kRowTile, kD>(q, base, q0, g.s_n, g.hq, h, q_s);
  LoadTile<kRowTile, kD>(d_o, base, q0, g.s_n, g.hq, h, do_s);
  LoadTile<kColTile, kD>(k, kbase, 0, g.kv_n, g.hkv, kvh, kv_s);
  LoadTile<kColTile, kD>(v, kbase, 0, g.kv_n, g.hkv, kvh, kv_s + L::kKv);
  CpAsyncCommit();
  float l2[2], dl[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = r_lo + 8 * i;
    l2[i] = row < g.s_n ? lse[stat + row] * kLog2e : 0.0f;
    dl[i] = row < g.s_n ? delta[stat + row] : 0.0f;
  }

  float acc[kD / 8][4];
  Zero(acc);
  for (int kt = 0; kt < n_kt; ++kt) {
    const uint32_t k_s = kv_s + 2 * (kt & 1) * L::kKv, v_s = k_s + L::kKv;
    if (kt + 1 < n_kt) {
      const uint32_t nk_s = kv_s + 2 * ((kt + 1) & 1) * L::kKv;
      LoadTile<kColTile, kD>(k, kbase, (kt + 1) * kColTile, g.kv_n, g.hkv, kvh, nk_s);
      LoadTile<kColTile, kD>(v, kbase, (kt + 1) * kColTile, g.kv_n, g.hkv, kvh, nk_s + L::kKv);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const int k0 = kt * kColTile;
    if (row_w < g.s_n && k0 <= row_w + kWarpRows - 1 + g.off) {
      float s[kColTile / 8][4], dp[kColTile / 8][4];
      Zero(s);
      Zero(dp);
      MmaABt<kD, kColTile>(q_s, warp * kWarpRows, k_s, s, lane);
      MmaABt<kD, kColTile>(do_s, warp * kWarpRows, v_s, dp, lane);
#pragma unroll
      for (int nb = 0; nb < kColTile / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + nb * 8 + 2 * (lane % 4) + (e & 1), row = r_lo + 8 * (e / 2);
          const float p = key <= row + g.off && key < g.kv_n
                              ? FastExp2(s[nb][e] * g.scale_log2 - l2[e / 2])
                              : 0.0f;
          s[nb][e] = p * (dp[nb][e] - dl[e / 2]);  // dS without the scale
        }
      }
      uint32_t ds[kColTile / 16][4];
      ToAFrags<kColTile>(s, ds);
      MmaPB<kD, kColTile>(ds, k_s, acc, lane);
    }
    __syncthreads();
  }
  StoreRows<kD>(acc, g.scale, dq, base, r_lo, g.s_n, g.hq, h, lane);
}

// Queries per dk/dv step: 32 at D = 128 keeps the dK, dV accumulators and the S^T, dP^T tiles
// within 255 registers.
template <int kD>
constexpr int DkDvStep() {
  return kD == 128 ? 32 : 64;
}

template <int kD>
struct DkDvSmem {
  static constexpr int kStep = DkDvStep<kD>();
  static constexpr int kKv = TileBytes<kRowTile, kD>(), kQ = TileBytes<kStep, kD>();
  static constexpr int kStat = kStep * 4;
  static constexpr int kStage = 2 * kQ + 2 * kStat;  // Q, dO, lse, delta
  static constexpr int kBytes = 2 * kKv + 2 * kStage;
  static_assert(kBytes <= kMaxSmem, "dk/dv smem budget");
};

template <int kD>
__global__ void __launch_bounds__(kThreads, 1)
    AttentionDkDvTcKernel(const bf16* __restrict__ q, const bf16* __restrict__ k,
                          const bf16* __restrict__ v, const bf16* __restrict__ d_o,
                          const float* __restrict__ lse, const float* __restrict__ delta,
                          bf16* __restrict__ dk, bf16* __restrict__ dv, TcGeometry g) {
  using L = DkDvSmem<kD>;
  constexpr int kStep = L::kStep;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t k_s = SmemAddr(smem), v_s = k_s + L::kKv, st_s = v_s + L::kKv;
  const int kt = blockIdx.x, kvh = blockIdx.y;
  const int64_t b = blockIdx.z, base = b * g.s_n, kbase = b * g.kv_n;
  const int k0 = kt * kRowTile, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kw0 = k0 + warp * kWarpRows;  // this warp's first key
  // Query i sees key j iff i >= j - off: the first query tile that sees key k0 holds row
  // max(0, k0 - off). k0 < kv_n gives k0 - off < s_n, so n_local >= 1.
  const int n_qt = (g.s_n + kStep - 1) / kStep, qt_begin = max(0, k0 - g.off) / kStep;
  const int n_local = n_qt - qt_begin, n_items = g.group * n_local;
  // Item `it`: query head kvh * group + it / n_local, query tile qt_begin + it % n_local.
  auto load_item = [&](int it, int st) {
    const int h = kvh * g.group + it / n_local, q0 = (qt_begin + it % n_local) * kStep;
    const uint32_t s = st_s + st * L::kStage;
    const int64_t stat = (b * g.hq + h) * g.s_n;
    LoadTile<kStep, kD>(q, base, q0, g.s_n, g.hq, h, s);
    LoadTile<kStep, kD>(d_o, base, q0, g.s_n, g.hq, h, s + L::kQ);
    LoadStat<kStep>(lse + stat, q0, g.s_n, s + 2 * L::kQ);
    LoadStat<kStep>(delta + stat, q0, g.s_n, s + 2 * L::kQ + L::kStat);
  };

  LoadTile<kRowTile, kD>(k, kbase, k0, g.kv_n, g.hkv, kvh, k_s);
  LoadTile<kRowTile, kD>(v, kbase, k0, g.kv_n, g.hkv, kvh, v_s);
  load_item(0, 0);
  CpAsyncCommit();

  float dk_acc[kD / 8][4], dv_acc[kD / 8][4];
  Zero(dk_acc);
  Zero(dv_acc);
  for (int it = 0; it < n_items; ++it) {
    const int st = it & 1;
    const uint32_t q_s = st_s + st * L::kStage, do_s = q_s + L::kQ;
    const float* lse_s =
        reinterpret_cast<const float*>(smem + (q_s - k_s) + 2 * L::kQ);  // generic pointer
    const float* dl_s = lse_s + kStep;
    if (it + 1 < n_items) {
      load_item(it + 1, st ^ 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const int q0 = (qt_begin + it % n_local) * kStep;
    if (kw0 < g.kv_n && q0 + kStep - 1 + g.off >= kw0) {  // warp-uniform: any query sees these keys
      float s[kStep / 8][4], dp[kStep / 8][4];
      Zero(s);
      Zero(dp);
      MmaABt<kD, kStep>(k_s, warp * kWarpRows, q_s, s, lane);    // S^T [keys x queries]
      MmaABt<kD, kStep>(v_s, warp * kWarpRows, do_s, dp, lane);  // dP^T
#pragma unroll
      for (int nb = 0; nb < kStep / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = nb * 8 + 2 * (lane % 4) + (e & 1), query = q0 + col;
          const int key = kw0 + lane / 4 + 8 * (e / 2);
          const float p = query + g.off >= key && query < g.s_n
                              ? FastExp2(s[nb][e] * g.scale_log2 - lse_s[col] * kLog2e)
                              : 0.0f;
          s[nb][e] = p;
          dp[nb][e] = p * (dp[nb][e] - dl_s[col]);  // dS^T without the scale
        }
      }
      uint32_t pf[kStep / 16][4], dsf[kStep / 16][4];
      ToAFrags<kStep>(s, pf);
      ToAFrags<kStep>(dp, dsf);
      MmaPB<kD, kStep>(pf, do_s, dv_acc, lane);
      MmaPB<kD, kStep>(dsf, q_s, dk_acc, lane);
    }
    __syncthreads();
  }
  const int key_lo = kw0 + lane / 4;
  StoreRows<kD>(dk_acc, g.scale, dk, kbase, key_lo, g.kv_n, g.hkv, kvh, lane);
  StoreRows<kD>(dv_acc, 1.0f, dv, kbase, key_lo, g.kv_n, g.hkv, kvh, lane);
}

template <typename Kernel>
absl::Status AllowSmem(Kernel kernel, int bytes) {
  SY_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  return absl::OkStatus();
}

TcGeometry MakeGeometry(const Tensor& q, const Tensor& k, int64_t seq_len, int64_t kv_seq_len,
                        float scale) {
  return TcGeometry{static_cast<int>(seq_len),
                    static_cast<int>(q.dim(1)),
                    static_cast<int>(k.dim(1)),
                    static_cast<int>(q.dim(1) / k.dim(1)),
                    static_cast<int>(kv_seq_len),
                    static_cast<int>(kv_seq_len - seq_len),
                    scale,
                    scale * kLog2e};
}

absl::Status CheckGrid(int64_t tiles, int64_t heads, int64_t batches) {
  if (tiles > INT32_MAX || heads > 65535 || batches > 65535) {
    return absl::InvalidArgumentError("Attention CUDA: grid too large (heads and batch <= 65535)");
  }
  return absl::OkStatus();
}

template <int kD>
absl::Status Forward(const Stream& stream, const Tensor& q, const Tensor& k, const Tensor& v,
                     int64_t seq_len, int64_t kv_seq_len, float scale, const Tensor& o,
                     const Tensor& lse) {
  const TcGeometry g = MakeGeometry(q, k, seq_len, kv_seq_len, scale);
  const int64_t tiles = (seq_len + kRowTile - 1) / kRowTile, batches = q.dim(0) / seq_len;
  SY_RETURN_IF_ERROR(CheckGrid(tiles, g.hq, batches));
  constexpr int kSmem = FwdSmem<kD>::kBytes;
  SY_RETURN_IF_ERROR(AllowSmem(AttentionForwardTcKernel<kD>, kSmem));
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(g.hq),
                  static_cast<unsigned>(batches));
  AttentionForwardTcKernel<kD><<<grid, kThreads, kSmem, stream.cuda_stream>>>(
      q.as<const bf16>(), k.as<const bf16>(), v.as<const bf16>(), o.as<bf16>(), lse.as<float>(), g);
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <int kD>
absl::Status Backward(const Stream& stream, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& o, const Tensor& lse, const Tensor& d_o, int64_t seq_len,
                      int64_t kv_seq_len, float scale, const Tensor& delta, const Tensor& dq,
                      const Tensor& dk, const Tensor& dv) {
  const TcGeometry g = MakeGeometry(q, k, seq_len, kv_seq_len, scale);
  const int64_t t_n = q.dim(0), batches = t_n / seq_len;
  const int64_t q_tiles = (seq_len + kRowTile - 1) / kRowTile;
  const int64_t k_tiles = (kv_seq_len + kRowTile - 1) / kRowTile;
  SY_RETURN_IF_ERROR(CheckGrid(q_tiles, g.hq, batches));
  SY_RETURN_IF_ERROR(CheckGrid(k_tiles, g.hkv, batches));
  const auto cs = stream.cuda_stream;

  const int64_t rows = t_n * g.hq, delta_blocks = (rows + kWarps - 1) / kWarps;
  if (delta_blocks > INT32_MAX) return absl::InvalidArgumentError("Attention CUDA: T too large");
  AttentionDeltaTcKernel<kD><<<static_cast<unsigned>(delta_blocks), kThreads, 0, cs>>>(
      o.as<const bf16>(), d_o.as<const bf16>(), delta.as<float>(), rows, g);
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());

  constexpr int kKvSmem = DkDvSmem<kD>::kBytes, kQSmem = DqSmem<kD>::kBytes;
  SY_RETURN_IF_ERROR(AllowSmem(AttentionDkDvTcKernel<kD>, kKvSmem));
  SY_RETURN_IF_ERROR(AllowSmem(AttentionDqTcKernel<kD>, kQSmem));
  const dim3 kv_grid(static_cast<unsigned>(k_tiles), static_cast<unsigned>(g.hkv),
                     static_cast<unsigned>(batches));
  AttentionDkDvTcKernel<kD><<<kv_grid, kThreads, kKvSmem, cs>>>(
      q.as<const bf16>(), k.as<const bf16>(), v.as<const bf16>(), d_o.as<const bf16>(),
      lse.as<const float>(), delta.as<const float>(), dk.as<bf16>(), dv.as<bf16>(), g);
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const dim3 q_grid(static_cast<unsigned>(q_tiles), static_cast<unsigned>(g.hq),
                    static_cast<unsigned>(batches));
  AttentionDqTcKernel<kD><<<q_grid, kThreads, kQSmem, cs>>>(
      q.as<const bf16>(), k.as<const bf16>(), v.as<const bf16>(), d_o.as<const bf16>(),
      lse.as<const float>(), delta.as<const float>(), dq.as<bf16>(), g);
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

bool AttentionTcApplies(int64_t seq_len, int64_t kv_seq_len,
                        std::initializer_list<const Tensor*> tensors) {
  // kv_seq_len < 2^30 keeps every int row index (row + off, tile ends) below 2^31.
  if (seq_len <= 0 || kv_seq_len < seq_len || kv_seq_len >= (int64_t{1} << 30)) return false;
  for (const Tensor* t : tensors) {
    if (t->dtype != DType::kBF16 || reinterpret_cast<uintptr_t>(t->data) % 16 != 0) return false;
  }
  return true;
}

absl::Status AttentionForwardTc(const Stream& stream, const Tensor& q, const Tensor& k,
                                const Tensor& v, int64_t seq_len, int64_t kv_seq_len, float scale,
                                const Tensor& o, const Tensor& lse) {
  if (q.dim(2) == 64) return Forward<64>(stream, q, k, v, seq_len, kv_seq_len, scale, o, lse);
  return Forward<128>(stream, q, k, v, seq_len, kv_seq_len, scale, o, lse);
}

absl::Status AttentionBackwardTc(const Stream& stream, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& o, const Tensor& lse,
                                 const Tensor& d_o, int64_t seq_len, int64_t kv_seq_len,
                                 float scale, const Tensor& delta, const Tensor& dq,
                                 const Tensor& dk, const Tensor& dv) {
  if (q.dim(2) == 64) {
    return Backward<64>(stream, q, k, v, o, lse, d_o, seq_len, kv_seq_len, scale, delta, dq, dk,
                        dv);
  }
  return Backward<128>(stream, q, k, v, o, lse, d_o, seq_len, kv_seq_len, scale, delta, dq, dk, dv);
}

}  // namespace switchyard::kernels::internal
