// CUDA path of the fused QK-norm + RoPE (qk_norm_rope.h). A block of kThreads threads walks groups
// of kTok consecutive tokens (kTok · D/2 = kThreads, e.g. 4 at D = 128), every gridDim.x-th group;
// per group it computes the tokens' D/2 (cos, sin) pairs once into shared memory (RopeCosSin, as
// rope.cu; one pair per thread), then each group of kLanes = D / V lanes takes one head row (each
// token's q heads, then its k heads; kThreads / kLanes rows at a time). Lane l holds
// the row's vector l (V elements); the other half of each rotated pair (i, i + D/2) is in lane
// l ^ kLanes/2 and comes by shuffle. The row sums are GroupSum butterflies over the kLanes lanes,
// which give the bits of the warp-per-row norm kernels (rmsnorm.cu), and the arithmetic is that of
// rmsnorm_device.cuh and rope_device.cuh, rounded to the activation dtype where the composed path
// stores: so out, rstd and the gradient of pre equal the composed CUDA path bit for bit.
// Backward: the rotation by -theta, then the norm's backward; each lane keeps its columns' dw
// partial sums (q and k) in registers, the block adds its row groups' partials in order into
// workspace [2, blocks, D], and a second kernel sums those over blocks into dw (one warp per
// column: lane l adds blocks l, l + 32, ... in order, then a fixed butterfly; deterministic).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention/qk_norm_rope.h"
#include "kernels/attention/rope_device.cuh"
#include "kernels/device_convert.cuh"
#include "kernels/device_reduce.cuh"
#include "kernels/norm/rmsnorm_device.cuh"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

constexpr int kThreads = 256;

template <typename T>
struct FusedArgs {
  const T* pre[2];  // q, k
  const T* w[2];
  T* out[2];  // forward: out; backward: the gradient, in place
  const float* rstd_in[2];
  float* rstd_out[2];
  int heads[2];
  int64_t t_n, seq_len;
  RopeCp cp;
  InvFreqTable table;
  float eps;
  float* partial;  // backward: [2, gridDim.x, D]
};

// v from lane ^ o, as 32-bit words.
template <typename P>
__device__ __forceinline__ P ShflXor(const P& v, int o) {
  static_assert(sizeof(P) % 4 == 0, "packs are whole words");
  P r;
  const unsigned* s = reinterpret_cast<const unsigned*>(&v);
  unsigned* d = reinterpret_cast<unsigned*>(&r);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(P) / 4); ++i) {
    d[i] = __shfl_xor_sync(0xffffffffu, s[i], o);
  }
  return r;
}

// One row's rotation in the lane that holds vector `lane` of it: `mine` is that vector, `other` the
// partner lane's (the other half of each pair). Returns this lane's half of the rotated pairs,
// rounded to T. cs: cos [0, half), sign·sin [half, 2·half).
template <typename T, int kVec, int kLanes>
__device__ __forceinline__ Pack<T, kVec> RotateRow(const Pack<T, kVec>& mine,
                                                   const Pack<T, kVec>& other, const float* cs,
                                                   int lane) {
  constexpr int kHalfLanes = kLanes / 2, kHalf = kLanes * kVec / 2;
  const bool first = lane < kHalfLanes;
  const int i0 = (first ? lane : lane - kHalfLanes) * kVec;
  Pack<T, kVec> o;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float xa = ToFloat(first ? mine.v[k] : other.v[k]);
    const float xb = ToFloat(first ? other.v[k] : mine.v[k]);
    float ra, rb;
    RotatePair(xa, xb, cs[i0 + k], cs[kHalf + i0 + k], &ra, &rb);
    o.v[k] = FromFloat<T>(first ? ra : rb);
  }
  return o;
}

// Tokens per iteration of a block: enough that every thread computes one (cos, sin) pair of the
// iteration's tokens (the fp64 sincos is the long part of a token's set-up: with one token per
// iteration 3/4 of the block waited for it at D = 128).
template <int kD>
constexpr int TokensPerIter() {
  return kThreads / (kD / 2) >= 1 ? kThreads / (kD / 2) : 1;
}

// cos / sign·sin of tokens t0 .. t0 + kTok - 1 into cs[u · kD ..] (all threads call; barriers on
// both sides).
template <int kD, int kTok>
__device__ __forceinline__ void TokensCosSin(float* cs, int64_t t0, int64_t t_n, int64_t seq_len,
                                             RopeCp cp, const InvFreqTable& table, float sign) {
  constexpr int kHalf = kD / 2;
  __syncthreads();  // the previous tokens are done with cs
  for (int i = threadIdx.x; i < kTok * kHalf; i += blockDim.x) {
    const int u = i / kHalf, j = i % kHalf;
    if (t0 + u < t_n) {
      RopeCosSin(t0 + u, seq_len, cp, table.v[j], sign, &cs[u * kD + j], &cs[u * kD + kHalf + j]);
    }
  }
  __syncthreads();
}

template <typename T, int kVec, int kLanes>
__global__ void __launch_bounds__(kThreads) QkNormRopeForwardKernel(FusedArgs<T> a) {
  using P = Pack<T, kVec>;
  constexpr int kSlots = kThreads / kLanes, kD = kLanes * kVec, kTok = TokensPerIter<kD>();
  __shared__ float cs[kTok * kD];
  const int lane = threadIdx.x % kLanes, slot = threadIdx.x / kLanes;
  const P wv[2] = {reinterpret_cast<const P*>(a.w[0])[lane],
                   reinterpret_cast<const P*>(a.w[1])[lane]};
  const int rows = a.heads[0] + a.heads[1], iter_rows = kTok * rows;
  for (int64_t t0 = static_cast<int64_t>(blockIdx.x) * kTok; t0 < a.t_n;
       t0 += static_cast<int64_t>(gridDim.x) * kTok) {
    TokensCosSin<kD, kTok>(cs, t0, a.t_n, a.seq_len, a.cp, a.table, 1.0f);
    // Every lane runs every round (the shuffles need whole warps); rows past the tokens' are idle.
    for (int base = 0; base < iter_rows; base += kSlots) {
      const int idx = base + slot, u = idx / rows, row = idx - u * rows;
      const int64_t t = t0 + u;
      const bool active = idx < iter_rows && t < a.t_n;
      const int side = row < a.heads[0] ? 0 : 1;
      const int64_t r_idx = t * a.heads[side] + (side == 0 ? row : row - a.heads[0]);
      P p{};
      if (active) p = reinterpret_cast<const P*>(a.pre[side] + r_idx * kD)[lane];
      float ss = 0.0f;
#pragma unroll
      for (int k = 0; k < kVec; ++k) ss = NormSumSquares(ss, ToFloat(p.v[k]));
      ss = GroupSum<kLanes>(ss);
      const float r = NormRstd(ss, static_cast<float>(kD), a.eps);
      P y;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        y.v[k] = FromFloat<T>(NormOut(ToFloat(p.v[k]), r, ToFloat(wv[side].v[k])));
      }
      const float* tcs = cs + (active ? u : 0) * kD;
      const P o = RotateRow<T, kVec, kLanes>(y, ShflXor(y, kLanes / 2), tcs, lane);
      if (active) {
        reinterpret_cast<P*>(a.out[side] + r_idx * kD)[lane] = o;
        if (lane == 0) a.rstd_out[side][r_idx] = r;
      }
    }
  }
}

template <typename T, int kVec, int kLanes>
__global__ void __launch_bounds__(kThreads) QkNormRopeBackwardKernel(FusedArgs<T> a) {
  using P = Pack<T, kVec>;
  constexpr int kSlots = kThreads / kLanes, kD = kLanes * kVec, kTok = TokensPerIter<kD>();
  __shared__ float cs[kTok * kD];
  __shared__ float slot_acc[2][kSlots][kD];
  const int lane = threadIdx.x % kLanes, slot = threadIdx.x / kLanes;
  const P wv[2] = {reinterpret_cast<const P*>(a.w[0])[lane],
                   reinterpret_cast<const P*>(a.w[1])[lane]};
  float acc[2][kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) acc[0][k] = acc[1][k] = 0.0f;
  const int rows = a.heads[0] + a.heads[1], iter_rows = kTok * rows;
  for (int64_t t0 = static_cast<int64_t>(blockIdx.x) * kTok; t0 < a.t_n;
       t0 += static_cast<int64_t>(gridDim.x) * kTok) {
    TokensCosSin<kD, kTok>(cs, t0, a.t_n, a.seq_len, a.cp, a.table, -1.0f);
    for (int base = 0; base < iter_rows; base += kSlots) {
      const int idx = base + slot, u = idx / rows, row = idx - u * rows;
      const int64_t t = t0 + u;
      const bool active = idx < iter_rows && t < a.t_n;
      const int side = row < a.heads[0] ? 0 : 1;
      const int64_t r_idx = t * a.heads[side] + (side == 0 ? row : row - a.heads[0]);
      P g{}, xv{};
      float r = 0.0f;
      if (active) {
        g = reinterpret_cast<const P*>(a.out[side] + r_idx * kD)[lane];
        xv = reinterpret_cast<const P*>(a.pre[side] + r_idx * kD)[lane];
        r = a.rstd_in[side][r_idx];
      }
      // The RoPE backward, rounded to T as the composed path stores it: the norm's dy.
      const float* tcs = cs + (active ? u : 0) * kD;
      const P d = RotateRow<T, kVec, kLanes>(g, ShflXor(g, kLanes / 2), tcs, lane);
      float dot = 0.0f;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        dot = NormDot(dot, ToFloat(d.v[k]), ToFloat(wv[side].v[k]), ToFloat(xv.v[k]));
      }
      dot = GroupSum<kLanes>(dot);
      if (!active) continue;  // no shuffles below
      const float c = NormGradCoef(r, dot, static_cast<float>(kD));
      P o;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float df = ToFloat(d.v[k]), xf = ToFloat(xv.v[k]);
        if (side == 0) {
          acc[0][k] = NormGradWeight(acc[0][k], df, xf, r);
        } else {
          acc[1][k] = NormGradWeight(acc[1][k], df, xf, r);
        }
        o.v[k] = FromFloat<T>(NormGradIn(r, df, ToFloat(wv[side].v[k]), xf, c));
      }
      reinterpret_cast<P*>(a.out[side] + r_idx * kD)[lane] = o;
    }
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    slot_acc[0][slot][lane * kVec + k] = acc[0][k];
    slot_acc[1][slot][lane * kVec + k] = acc[1][k];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 2 * kD; i += kThreads) {
    const int side = i / kD, h = i % kD;
    float sum = 0.0f;
    for (int s = 0; s < kSlots; ++s) sum = __fadd_rn(sum, slot_acc[side][s][h]);
    a.partial[(static_cast<int64_t>(side) * gridDim.x + blockIdx.x) * kD + h] = sum;
  }
}

// dw_side[h] += sum_b partial[side, b, h]: one warp per (side, h); lane l sums blocks l, l + 32,
// ... in ascending order, then the lanes' sums by a fixed butterfly (deterministic; was one thread
// per column summing the 1024 blocks in turn: 38 us per call, latency-bound).
template <typename DW>
__global__ void QkDwReduceKernel(const float* partial, int64_t blocks, int64_t d, DW* dwq,
                                 DW* dwk) {
  const int64_t col = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (col >= 2 * d) return;  // warp-uniform
  const int lane = threadIdx.x & 31;
  const int64_t side = col / d, h = col % d;
  const int64_t mine = blocks > lane ? (blocks - lane + 31) / 32 : 0;
  float s = OrderedSum(partial + (side * blocks + lane) * d + h, mine, 32 * d);
  s = GroupSum<32>(s);
  if (lane == 0) {
    DW* dw = side == 0 ? dwq : dwk;
    dw[h] = FromFloat<DW>(__fadd_rn(ToFloat(dw[h]), s));
  }
}

template <typename T>
FusedArgs<T> MakeArgs(const Tensor& q_pre, const Tensor& k_pre, const Tensor& q_w,
                      const Tensor& k_w, int64_t seq_len, float rotary_base, RopeCp cp) {
  FusedArgs<T> a{};
  a.pre[0] = q_pre.as<const T>();
  a.pre[1] = k_pre.as<const T>();
  a.w[0] = q_w.as<const T>();
  a.w[1] = k_w.as<const T>();
  a.heads[0] = static_cast<int>(q_pre.dim(1));
  a.heads[1] = static_cast<int>(k_pre.dim(1));
  a.t_n = q_pre.dim(0);
  a.seq_len = seq_len;
  a.cp = cp;
  RopeInvFreq(q_pre.dim(2), rotary_base, a.table.v);
  return a;
}

// Calls f(integral_constant<kLanes>) for D / V lanes per row.
template <typename F>
absl::Status DispatchLanes(int64_t lanes, const F& f) {
  switch (lanes) {
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 8:
      return f(std::integral_constant<int, 8>{});
    case 16:
      return f(std::integral_constant<int, 16>{});
    case 32:
      return f(std::integral_constant<int, 32>{});
    default:
      return absl::InternalError(
          absl::StrCat("QkNormRope: no fused kernel for ", lanes, " lanes per row"));
  }
}

template <int kD>
unsigned ForwardBlocks(int64_t t_n) {
  const int64_t iters = (t_n + TokensPerIter<kD>() - 1) / TokensPerIter<kD>();
  return static_cast<unsigned>(iters < 65536 ? iters : 65536);
}

template <typename T>
absl::Status Forward(const Stream& stream, const QkNormRopeSide& q, const QkNormRopeSide& k,
                     float eps, int64_t seq_len, float rotary_base, RopeCp cp) {
  constexpr int kVec = 16 / sizeof(T);
  FusedArgs<T> a = MakeArgs<T>(q.pre, k.pre, q.w, k.w, seq_len, rotary_base, cp);
  a.out[0] = q.out.as<T>();
  a.out[1] = k.out.as<T>();
  a.rstd_out[0] = q.rstd.as<float>();
  a.rstd_out[1] = k.rstd.as<float>();
  a.eps = eps;
  return DispatchLanes(q.pre.dim(2) / kVec, [&](auto lanes) -> absl::Status {
    constexpr int kLanes = decltype(lanes)::value;
    QkNormRopeForwardKernel<T, kVec, kLanes>
        <<<ForwardBlocks<kLanes * kVec>(a.t_n), kThreads, 0, stream.cuda_stream>>>(a);
    SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  });
}

template <typename T>
absl::Status Backward(const Stream& stream, const QkNormRopeGradSide& q,
                      const QkNormRopeGradSide& k, int64_t seq_len, float rotary_base,
                      const Tensor& workspace, RopeCp cp) {
  constexpr int kVec = 16 / sizeof(T);
  FusedArgs<T> a = MakeArgs<T>(q.pre, k.pre, q.w, k.w, seq_len, rotary_base, cp);
  a.out[0] = q.grad.as<T>();
  a.out[1] = k.grad.as<T>();
  a.rstd_in[0] = q.rstd.as<const float>();
  a.rstd_in[1] = k.rstd.as<const float>();
  a.partial = workspace.as<float>();
  const int64_t d = q.pre.dim(2);
  const int64_t blocks = QkNormRopeBackwardBlocks(a.t_n);
  if (a.t_n > 0) {
    SY_RETURN_IF_ERROR(DispatchLanes(d / kVec, [&](auto lanes) -> absl::Status {
      QkNormRopeBackwardKernel<T, kVec, decltype(lanes)::value>
          <<<static_cast<unsigned>(blocks), kThreads, 0, stream.cuda_stream>>>(a);
      SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      return absl::OkStatus();
    }));
  }
  // With T == 0 no partials were written: sum over zero blocks (dw unchanged).
  const int64_t summed = a.t_n > 0 ? blocks : 0;
  const unsigned grid = static_cast<unsigned>((2 * d * 32 + 255) / 256);
  if (q.dw.dtype == DType::kBF16) {
    QkDwReduceKernel<__nv_bfloat16><<<grid, 256, 0, stream.cuda_stream>>>(
        workspace.as<const float>(), summed, d, q.dw.as<__nv_bfloat16>(), k.dw.as<__nv_bfloat16>());
  } else {
    QkDwReduceKernel<float><<<grid, 256, 0, stream.cuda_stream>>>(
        workspace.as<const float>(), summed, d, q.dw.as<float>(), k.dw.as<float>());
  }
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

bool QkNormRopeFusable(const Tensor& q, const Tensor& k,
                       std::initializer_list<const void*> pointers) {
  if (q.dtype != DType::kBF16 && q.dtype != DType::kF32) return false;
  const int64_t vec = 16 / static_cast<int64_t>(DTypeSize(q.dtype));
  const int64_t d = q.dim(2);
  if (d % vec != 0) return false;
  const int64_t lanes = d / vec;
  if (lanes < 2 || lanes > 32 || (lanes & (lanes - 1)) != 0) return false;
  // A block iteration's rows, TokensPerIter (at most 32) tokens of hq + hkv heads, are counted in
  // int: larger head counts take the composed path.
  if (32 * (q.dim(1) + k.dim(1)) > 0x7fffffff) return false;
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

absl::Status QkNormRopeForwardCuda(const Stream& stream, const QkNormRopeSide& q,
                                   const QkNormRopeSide& k, float eps, int64_t seq_len,
                                   float rotary_base, RopeCp cp) {
  if (q.pre.dim(0) == 0) return absl::OkStatus();
  if (q.pre.dtype == DType::kBF16) {
    return Forward<__nv_bfloat16>(stream, q, k, eps, seq_len, rotary_base, cp);
  }
  return Forward<float>(stream, q, k, eps, seq_len, rotary_base, cp);
}

absl::Status QkNormRopeBackwardCuda(const Stream& stream, const QkNormRopeGradSide& q,
                                    const QkNormRopeGradSide& k, int64_t seq_len, float rotary_base,
                                    const Tensor& workspace, RopeCp cp) {
  if (q.pre.dtype == DType::kBF16) {
    return Backward<__nv_bfloat16>(stream, q, k, seq_len, rotary_base, workspace, cp);
  }
  return Backward<float>(stream, q, k, seq_len, rotary_base, workspace, cp);
}

}  // namespace switchyard::kernels::internal
