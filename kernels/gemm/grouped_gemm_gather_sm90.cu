// Gathered grouped GEMM on Hopper: see grouped_gemm_gather_sm90.h. The kernel is built from
// CUTLASS 4.2's SM90 cp.async GMMA collective (its shared-memory layouts, pipeline and consumer
// mainloop: the one CUTLASS's KernelCpAsyncWarpSpecializedCooperative kernels use); the producer
// (loads through the row index), the tile walk over the device-side groups and the epilogue are
// ours, because CUTLASS's grouped (ptr-array) kernels load with TMA, which cannot gather rows on
// SM90.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "cutlass/arch/config.h"
#include "kernels/gemm/grouped_gemm_gather_sm90.h"
#include "kernels/gemm/grouped_gemm_scan.cuh"
#include "kernels/runtime/cuda_status.h"

#if defined(CUTLASS_ARCH_MMA_MODIFIABLE_TMA_SM90_SUPPORTED)
#define SY_GATHER_GEMM_SM90 1
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/pipeline/pipeline.hpp"
#else
#define SY_GATHER_GEMM_SM90 0
#endif

namespace switchyard::kernels::internal {

#if SY_GATHER_GEMM_SM90
namespace {

using bf16 = __nv_bfloat16;

constexpr int kBM = 256;  // the tile (M x N x K); each consumer warp group owns 128 x 128
constexpr int kBN = 128;
constexpr int kBK = 64;
constexpr int kProducerThreads = 128;
constexpr int kThreads = kProducerThreads + 256;

// Per-group rows and tiles, written by every CTA from the device counts at its start.
struct GroupTable {
  int32_t tile_start[kGatherMaxGroups + 1];  // exclusive prefix of the groups' tiles; [G] = total
  int32_t row_offset[kGatherMaxGroups];      // first permuted row (clamped to the capacity)
  int32_t rows[kGatherMaxGroups];            // rows after clamping
};

// The operand layouts of the three ops (as grouped_gemm_sm90.cuh's, for one problem):
//   Fprop  A = x_g [m_g, K] K-major, B(n, k) = W_g[k, n] N-major
//   Dgrad  A = dy_g [m_g, N] K-major, B(n, k) = W_g[n, k] K-major
//   Wgrad  A(m, k) = x_g[k, m] M-major, B(n, k) = dy_g[k, n] N-major
template <GroupedGemmOp kOp>
struct Layouts;
template <>
struct Layouts<GroupedGemmOp::kFprop> {
  using A = cutlass::layout::RowMajor;
  using B = cutlass::layout::RowMajor;
};
template <>
struct Layouts<GroupedGemmOp::kDgrad> {
  using A = cutlass::layout::RowMajor;
  using B = cutlass::layout::ColumnMajor;
};
template <>
struct Layouts<GroupedGemmOp::kWgrad> {
  using A = cutlass::layout::ColumnMajor;
  using B = cutlass::layout::RowMajor;
};

template <GroupedGemmOp kOp>
struct GatherTypes {
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::bfloat16_t,
      typename Layouts<kOp>::A, 8, cutlass::bfloat16_t, typename Layouts<kOp>::B, 8, float,
      cute::Shape<cute::Int<kBM>, cute::Int<kBN>, cute::Int<kBK>>,
      cute::Shape<cute::_1, cute::_1, cute::_1>,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(GroupTable))>,
      cutlass::gemm::KernelCpAsyncWarpSpecializedCooperative>::CollectiveOp;
  using Pipeline = typename Mainloop::MainloopPipeline;
  static_assert(cute::size(typename Mainloop::TiledMma{}) == kThreads - kProducerThreads,
                "two consumer warp groups");

  struct SharedStorage {
    typename Mainloop::TensorStorage tensors;
    alignas(16) typename Mainloop::PipelineStorage pipeline;
    GroupTable table;
  };
};

struct GatherParams {
  const bf16* a;
  const int32_t* a_index;
  const bf16* b;
  const int32_t* b_index;
  void* out;
  const int32_t* counts;
  int groups;
  int32_t capacity;  // R
  int32_t k;         // w [G, K, N]
  int32_t n;
  bool accumulate;
};

// 16 bytes global -> shared, or 16 zero bytes when !valid (src is then not read).
//
// Proxies: wgmma reads shared memory through the async proxy, and the PTX ISA (9.7.15.4) asks
// for a fence.proxy.async between generic-proxy writes (these cp.async) and such reads. Like
// CUTLASS 4.2's own SM90 cp.async GMMA kernels (KernelCpAsyncWarpSpecialized*, whose pipeline
// this kernel uses), the producer signals each stage with cp.async.mbarrier.arrive and no proxy
// fence. If a GPU run ever shows sporadic mismatches, the fix is on the producer side: commit the
// stage's copies as a group, cp.async.wait_group for the stage before, fence.proxy.async, then a
// plain arrive on that stage.
__device__ __forceinline__ void CpAsync16(void* smem, const void* src, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}

__device__ __forceinline__ int32_t SourceRow(const int32_t* index, int32_t row) {
  return index != nullptr ? __ldg(index + row) : row;
}

// The (M, N_out) extent of group g's problem and its reduction length.
template <GroupedGemmOp kOp>
struct Problem {
  int32_t m, n, kred;
};
template <GroupedGemmOp kOp>
__device__ __forceinline__ Problem<kOp> GroupProblem(const GatherParams& p, int32_t rows) {
  if constexpr (kOp == GroupedGemmOp::kFprop) return {rows, p.n, p.k};
  if constexpr (kOp == GroupedGemmOp::kDgrad) return {rows, p.k, p.n};
  return {p.k, p.n, rows};
}

template <GroupedGemmOp kOp>
__device__ __forceinline__ int32_t GroupTiles(const GatherParams& p, int32_t rows) {
  const Problem<kOp> q = GroupProblem<kOp>(p, rows);
  if constexpr (kOp == GroupedGemmOp::kWgrad) {
    if (rows == 0 && p.accumulate) return 0;  // dW_g += 0: nothing to do
  }
  return ((q.m + kBM - 1) / kBM) * (q.n / kBN);
}

// Warp 0 fills the group table from the device counts (clamped as GroupedGemm clamps them).
template <GroupedGemmOp kOp>
__device__ void FillGroupTable(const GatherParams& p, GroupTable& t) {
  const int lane = threadIdx.x;
  int64_t row_carry = 0;
  int32_t tile_carry = 0;
  for (int base = 0; base < p.groups; base += 32) {
    const int g = base + lane;
    const int64_t c = g < p.groups ? NonNegativeCount(p.counts, g) : 0;
    int64_t x = c;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    const GroupRows r = ClampGroup(row_carry + x - c, c, p.capacity);
    const int32_t tiles = g < p.groups ? GroupTiles<kOp>(p, r.rows) : 0;
    int32_t tx = tiles;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t y = __shfl_up_sync(0xffffffffu, tx, o);
      if (lane >= o) tx += y;
    }
    if (g < p.groups) {
      t.tile_start[g] = tile_carry + tx - tiles;
      t.row_offset[g] = static_cast<int32_t>(r.offset);
      t.rows[g] = r.rows;
    }
    row_carry += __shfl_sync(0xffffffffu, x, 31);
    tile_carry += __shfl_sync(0xffffffffu, tx, 31);
  }
  if (lane == 0) t.tile_start[p.groups] = tile_carry;
}

// The group of linear tile `tile`: the last group whose first tile is at or before it.
__device__ __forceinline__ int FindGroup(const GroupTable& t, int groups, int32_t tile) {
  int lo = 0, hi = groups - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.tile_start[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

struct TileCoord {
  int g;
  int32_t m0, n0;  // the tile's first row and column of the group's (M, N_out) problem
  int32_t k_tiles;
  int32_t rows;    // the group's rows
  int32_t offset;  // the group's first permuted row
};

template <GroupedGemmOp kOp>
__device__ __forceinline__ TileCoord DecodeTile(const GatherParams& p, const GroupTable& t,
                                                int32_t tile) {
  TileCoord c;
  c.g = FindGroup(t, p.groups, tile);
  c.rows = t.rows[c.g];
  c.offset = t.row_offset[c.g];
  const Problem<kOp> q = GroupProblem<kOp>(p, c.rows);
  const int32_t local = tile - t.tile_start[c.g];
  const int32_t tiles_n = q.n / kBN;
  c.m0 = (local / tiles_n) * kBM;
  c.n0 = (local % tiles_n) * kBN;
  c.k_tiles = (q.kred + kBK - 1) / kBK;
  return c;
}

// The producer warp group: for every k tile of the tile, waits for a free stage and fills it with
// cp.async (A: kBM x kBK, B: kBN x kBK), rows outside the group (or columns outside the problem)
// zero-filled.
template <GroupedGemmOp kOp, class SmemA, class SmemB>
__device__ __forceinline__ void ProduceTile(
    const GatherParams& p, const TileCoord& c, typename GatherTypes<kOp>::Pipeline& pipeline,
    typename GatherTypes<kOp>::Mainloop::PipelineState& state, SmemA& sA, SmemB& sB, int tid) {
  if constexpr (kOp != GroupedGemmOp::kWgrad) {
    constexpr bool kFprop = kOp == GroupedGemmOp::kFprop;
    const int32_t lda = kFprop ? p.k : p.n;  // A's columns: the reduction
    // A is K-major: 8 vectors of 8 per row, 16 rows per pass, kBM / 16 rows per thread, whose
    // addresses stay for the whole tile.
    constexpr int kRowsA = kBM / 16;
    const int va = (tid % 8) * 8;
    const bf16* arow[kRowsA];
#pragma unroll
    for (int i = 0; i < kRowsA; ++i) {
      const int32_t m = c.m0 + tid / 8 + 16 * i;
      arow[i] = m < c.rows
                    ? p.a + static_cast<int64_t>(SourceRow(p.a_index, c.offset + m)) * lda + va
                    : p.a;
    }
    const bf16* w = p.b + static_cast<int64_t>(c.g) * p.k * p.n;
    for (int32_t kt = 0; kt < c.k_tiles; ++kt) {
      pipeline.producer_acquire(state);
      const int s = state.index();
      const int32_t k0 = kt * kBK;
#pragma unroll
      for (int i = 0; i < kRowsA; ++i) {
        const int32_t m = c.m0 + tid / 8 + 16 * i;
        CpAsync16(&sA(tid / 8 + 16 * i, va, s), arow[i] + k0, m < c.rows);
      }
      if constexpr (kFprop) {
        // B(n, k) = W_g[k, n], N-major: 16 vectors per k row, 8 k rows per pass.
        const int vb = (tid % 16) * 8;
#pragma unroll
        for (int i = 0; i < kBK / 8; ++i) {
          const int kk = tid / 16 + 8 * i;
          CpAsync16(&sB(vb, kk, s), w + static_cast<int64_t>(k0 + kk) * p.n + c.n0 + vb, true);
        }
      } else {
        // B(n, k) = W_g[n, k] (n < K, k < N), K-major: 8 vectors per row, 16 rows per pass.
        const int vb = (tid % 8) * 8;
#pragma unroll
        for (int i = 0; i < kBN / 16; ++i) {
          const int nn = tid / 8 + 16 * i;
          CpAsync16(&sB(nn, vb, s), w + static_cast<int64_t>(c.n0 + nn) * p.n + k0 + vb, true);
        }
      }
      pipeline.producer_commit(state, cutlass::arch::cpasync_barrier_arrive);
      ++state;
    }
  } else {
    // A(m, r) = x[src(r)][m], M-major: 32 vectors per row r, 4 rows per pass. B(n, r) =
    // dy[src(r)][n], N-major: 16 vectors per row, 8 rows per pass. Rows r past the group's end
    // and columns m past K are zero-filled.
    const int va = (tid % 32) * 8;
    const int vb = (tid % 16) * 8;
    const bool a_col_ok = c.m0 + va < p.k;
    for (int32_t kt = 0; kt < c.k_tiles; ++kt) {
      pipeline.producer_acquire(state);
      const int s = state.index();
      const int32_t r0 = kt * kBK;
#pragma unroll
      for (int i = 0; i < kBK / 4; ++i) {
        const int r = tid / 32 + 4 * i;
        const bool ok = a_col_ok && r0 + r < c.rows;
        const bf16* src =
            ok ? p.a + static_cast<int64_t>(SourceRow(p.a_index, c.offset + r0 + r)) * p.k + c.m0 +
                     va
               : p.a;
        CpAsync16(&sA(va, r, s), src, ok);
      }
#pragma unroll
      for (int i = 0; i < kBK / 8; ++i) {
        const int r = tid / 16 + 8 * i;
        const bool ok = r0 + r < c.rows;
        const bf16* src =
            ok ? p.b + static_cast<int64_t>(SourceRow(p.b_index, c.offset + r0 + r)) * p.n + c.n0 +
                     vb
               : p.b;
        CpAsync16(&sB(vb, r, s), src, ok);
      }
      pipeline.producer_commit(state, cutlass::arch::cpasync_barrier_arrive);
      ++state;
    }
  }
}

// Stores the accumulators of one tile: bf16 rows of the group (Fprop, Dgrad) or the f32 dW_g,
// added to its old value when accumulating (Wgrad). Two adjacent columns per store (the SM90
// accumulator fragment holds column pairs).
template <GroupedGemmOp kOp, class Accum, class TiledMma>
__device__ __forceinline__ void StoreTile(const GatherParams& p, const TileCoord& c,
                                          const Accum& accum, const TiledMma& tiled_mma,
                                          int mma_tid) {
  using namespace cute;
  auto thr = tiled_mma.get_thread_slice(mma_tid);
  auto tCcD = thr.partition_C(make_identity_tensor(Shape<Int<kBM>, Int<kBN>>{}));
  static_assert(decltype(size(tCcD))::value == decltype(size(accum))::value, "fragment shape");
  if constexpr (kOp != GroupedGemmOp::kWgrad) {
    const int32_t ldd = kOp == GroupedGemmOp::kFprop ? p.n : p.k;
    bf16* out = static_cast<bf16*>(p.out) + static_cast<int64_t>(c.offset) * ldd + c.n0;
#pragma unroll
    for (int i = 0; i < size(accum); i += 2) {
      const int32_t m = c.m0 + get<0>(tCcD(i));
      if (m < c.rows) {
        *reinterpret_cast<__nv_bfloat162*>(out + static_cast<int64_t>(m) * ldd + get<1>(tCcD(i))) =
            __floats2bfloat162_rn(accum(i), accum(i + 1));
      }
    }
  } else {
    float* out = static_cast<float*>(p.out) + static_cast<int64_t>(c.g) * p.k * p.n + c.n0;
#pragma unroll
    for (int i = 0; i < size(accum); i += 2) {
      const int32_t m = c.m0 + get<0>(tCcD(i));
      if (m < p.k) {
        float2* d =
            reinterpret_cast<float2*>(out + static_cast<int64_t>(m) * p.n + get<1>(tCcD(i)));
        float2 v = make_float2(accum(i), accum(i + 1));
        if (p.accumulate) {
          const float2 old = *d;
          v.x += old.x;
          v.y += old.y;
        }
        *d = v;
      }
    }
  }
}

template <GroupedGemmOp kOp>
__global__ void __launch_bounds__(kThreads, 1)
    GatherGemmKernel(const __grid_constant__ GatherParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using Types = GatherTypes<kOp>;
  using Mainloop = typename Types::Mainloop;
  using Pipeline = typename Types::Pipeline;
  extern __shared__ __align__(128) char smem_buf[];
  auto& shared = *reinterpret_cast<typename Types::SharedStorage*>(smem_buf);

  const int tid = threadIdx.x;
  const bool producer = tid < kProducerThreads;
  typename Pipeline::Params pp;
  pp.role = producer ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.producer_arv_count = kProducerThreads;
  pp.consumer_arv_count = kThreads - kProducerThreads;
  Pipeline pipeline(shared.pipeline, pp);
  if (tid < 32) FillGroupTable<kOp>(p, shared.table);
  __syncthreads();

  const int32_t total = shared.table.tile_start[p.groups];
  auto sA = make_tensor(make_smem_ptr(shared.tensors.smem_A.data()),
                        typename Mainloop::SmemLayoutA{});  // (BM, BK, PIPE)
  auto sB = make_tensor(make_smem_ptr(shared.tensors.smem_B.data()),
                        typename Mainloop::SmemLayoutB{});  // (BN, BK, PIPE)
  if (producer) {
    auto state = cutlass::make_producer_start_state<Pipeline>();
    auto sA_raw = make_tensor(make_smem_ptr(reinterpret_cast<bf16*>(shared.tensors.smem_A.data())),
                              typename Mainloop::SmemLayoutA{});
    auto sB_raw = make_tensor(make_smem_ptr(reinterpret_cast<bf16*>(shared.tensors.smem_B.data())),
                              typename Mainloop::SmemLayoutB{});
    for (int32_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
      const TileCoord c = DecodeTile<kOp>(p, shared.table, tile);
      ProduceTile<kOp>(p, c, pipeline, state, sA_raw, sB_raw, tid);
    }
    pipeline.producer_tail(state);
  } else {
    Mainloop mainloop;
    typename Mainloop::TiledMma tiled_mma;
    typename Mainloop::PipelineState state;
    const int mma_tid = tid % size(tiled_mma);
    for (int32_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
      const TileCoord c = DecodeTile<kOp>(p, shared.table, tile);
      auto accum = partition_fragment_C(tiled_mma, Shape<Int<kBM>, Int<kBN>>{});
      if (c.k_tiles > 0) {
        mainloop.mma(pipeline, state, accum, c.k_tiles, mma_tid, shared.tensors,
                     typename Mainloop::Params{});
        mainloop.mma_tail(pipeline, state, c.k_tiles);
        state.advance(c.k_tiles);
      } else {
        clear(accum);
      }
      StoreTile<kOp>(p, c, accum, tiled_mma, mma_tid);
    }
  }
#endif
}

template <GroupedGemmOp kOp>
absl::Status Launch(const GatherParams& p, int sm_count, cudaStream_t stream) {
  constexpr int kSmem = static_cast<int>(sizeof(typename GatherTypes<kOp>::SharedStorage));
  static_assert(kSmem <= cutlass::gemm::collective::detail::sm90_smem_capacity_bytes,
                "the gather GEMM's shared memory exceeds an SM90 SM's");
  int device = 0;
  SY_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  static std::atomic<uint64_t> configured{0};  // one bit per device (devices 0-63)
  const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (bit == 0 || (configured.load() & bit) == 0) {
    SY_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        GatherGemmKernel<kOp>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    configured.fetch_or(bit);
  }
  GatherGemmKernel<kOp><<<sm_count, kThreads, kSmem, stream>>>(p);
  SY_CUDA_RETURN_IF_LAUNCH_ERROR(GatherGemmKernel);
  return absl::OkStatus();
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool GatherGemmSm90Compiled() { return true; }

absl::Status RunGatherGemmSm90(const GatherGemmCall& call) {
  const char* op = GroupedGemmOpName(call.op);
  const bool wgrad = call.op == GroupedGemmOp::kWgrad;
  if (call.groups < 1 || call.groups > kGatherMaxGroups) {
    return absl::InvalidArgumentError(absl::StrCat("gather grouped GEMM ", op, ": groups (",
                                                   call.groups, ") must be in [1, ",
                                                   kGatherMaxGroups, "]"));
  }
  if (call.k <= 0 || call.n <= 0 || call.k % 128 != 0 || call.n % 128 != 0 ||
      call.k > (int64_t{1} << 30) || call.n > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("gather grouped GEMM ", op, ": K (", call.k,
                                                   ") and N (", call.n,
                                                   ") must be positive multiples of 128"));
  }
  if (call.rows < 0 || call.rows >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gather grouped GEMM ", op, ": rows (", call.rows, ") must be in [0, 2^31)"));
  }
  if (call.out_dtype != (wgrad ? DType::kF32 : DType::kBF16)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gather grouped GEMM ", op, ": out must be ", wgrad ? "f32" : "bf16"));
  }
  if (!wgrad && call.b_index != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("gather grouped GEMM ", op, ": only Wgrad gathers its B operand"));
  }
  if (call.a == nullptr || call.b == nullptr || call.out == nullptr ||
      call.tokens_per_group == nullptr || !Aligned16(call.a) || !Aligned16(call.b) ||
      !Aligned16(call.out)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gather grouped GEMM ", op, ": a, b, out and counts must be set, data 16-byte aligned"));
  }
  int sm_count = call.sm_count;
  if (sm_count <= 0) {
    int device = 0;
    SY_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    SY_CUDA_RETURN_IF_ERROR(
        cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  }
  GatherParams p;
  p.a = static_cast<const bf16*>(call.a);
  p.a_index = call.a_index;
  p.b = static_cast<const bf16*>(call.b);
  p.b_index = call.b_index;
  p.out = call.out;
  p.counts = call.tokens_per_group;
  p.groups = call.groups;
  p.capacity = static_cast<int32_t>(call.rows);
  p.k = static_cast<int32_t>(call.k);
  p.n = static_cast<int32_t>(call.n);
  p.accumulate = call.accumulate;
  cudaStream_t stream = call.cuda_stream;
  switch (call.op) {
    case GroupedGemmOp::kFprop:
      return Launch<GroupedGemmOp::kFprop>(p, sm_count, stream);
    case GroupedGemmOp::kDgrad:
      return Launch<GroupedGemmOp::kDgrad>(p, sm_count, stream);
    case GroupedGemmOp::kWgrad:
      return Launch<GroupedGemmOp::kWgrad>(p, sm_count, stream);
  }
  return absl::InvalidArgumentError("gather grouped GEMM: unknown op");
}

#else  // !SY_GATHER_GEMM_SM90

bool GatherGemmSm90Compiled() { return false; }

absl::Status RunGatherGemmSm90(const GatherGemmCall&) {
  return absl::FailedPreconditionError(
      "gather grouped GEMM: this build has no CUTLASS SM90 support (CUDA >= 12.3 needed)");
}

#endif  // SY_GATHER_GEMM_SM90

}  // namespace switchyard::kernels::internal
