// File: kernels/gemm/grouped_gemm_sm90.cuh
//
// CUTLASS 4.2 Hopper grouped GEMM templates (after examples/57_hopper_grouped_gemm): bf16 A and B,
// fp32 accumulation, D = alpha * A·B + beta * C with C = D (beta = 1 accumulates in place), TMA
// warp-specialised persistent kernels with the group scheduler. Problem shapes, pointers and
// strides live on the device only (the host problem-shape pointer is null: CUTLASS then sizes the
// persistent grid from the SM count and skips its host-side alignment checks, which
// grouped_gemm_sm90.cu does instead). Include only from the grouped_gemm_sm90_*.cu files.
//
// The three ops as CUTLASS problems (M, N, K) with row-major storage of the callers' tensors:
//   Fprop  (m_g, N, K)  A = x_g [m_g, K] K-major,   B(n, k) = W_g[k, n] N-major,  D = y_g
//   Dgrad  (m_g, K, N)  A = dy_g [m_g, N] K-major,  B(n, k) = W_g[n, k] K-major,  D = dx_g
//   Wgrad  (K, N, m_g)  A(m, k) = x_g[k, m] M-major, B(n, k) = dy_g[k, n] N-major, D = dW_g
// A Wgrad group with m_g = 0 becomes the empty problem (0, N, 0): CUTLASS leaves its accumulators
// uninitialised for K = 0, so such groups are zero-filled separately (grouped_gemm_sm90.cu).
#ifndef SWITCHYARD_KERNELS_GEMM_GROUPED_GEMM_SM90_CUH_
#define SWITCHYARD_KERNELS_GEMM_GROUPED_GEMM_SM90_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cutlass/arch/config.h"
#include "cutlass/cutlass.h"
#include "kernels/gemm/grouped_gemm.h"
#include "kernels/gemm/grouped_gemm_scan.cuh"
#include "kernels/gemm/grouped_gemm_sm90.h"
#include "kernels/runtime/cuda_status.h"

#if defined(CUTLASS_ARCH_MMA_MODIFIABLE_TMA_SM90_SUPPORTED)
#define SY_GROUPED_GEMM_SM90 1

#include "cute/tensor.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

namespace switchyard::kernels::internal::sm90 {

// The tiles of GroupedGemmTile. Each is valid for CUTLASS's Hopper grouped GEMM generator
// (cutlass_library sm90_utils.py: cooperative needs CTA M % 128 == 0; M, N multiples of 64 and
// 8; tiles and clusters from its default bf16 list). A group of m_g rows (Fprop, Dgrad) covers
// ceil(m_g / M) tiles along M, rounded up to the cluster's M: the wasted rows per group are what
// separates the tiles on small groups (BASELINES.md: 128-512 rows per group in the fine-grained
// configs, fewer on a skewed routing).

// 128x128x64, two consumer warp groups alternating mainloop and epilogue: best for the
// fine-grained experts (BASELINES.md: 128-512 rows per group). Cluster 1x1: no rounding of a
// group's tiles up to a cluster multiple.
struct PingpongTile {
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};

// 256x128x64 cooperative, cluster 1x2 along N (A multicast; N is a multiple of 256 in every MoE
// config, so no tile is wasted): for coarse experts (thousands of rows per group).
struct CooperativeTile {
  using TileShape = cute::Shape<cute::_256, cute::_128, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};

// 128x128x64 cooperative, cluster 1x2 along N: the default tile with half its M, so a 128-row
// group (dsv3_layer) fills its tile instead of half of one, keeping the A multicast. Not 2x1
// (B multicast): that would round a one-tile group up to two tiles along M.
struct Cooperative128x128Tile {
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};

// 64x128x64 ping-pong, cluster 1x1: the least padding per group (at most 63 rows), for groups of
// under ~128 rows and skewed routings where many groups are small.
struct Pingpong64x128Tile {
  using TileShape = cute::Shape<cute::_64, cute::_128, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};

// 128x256x64 cooperative, cluster 1x1: a 128-row group with twice the N per tile, so the weight
// (B) tile streamed per A tile is larger and each CTA does twice the MMA work per A load (the
// 128-row groups of dsv3_layer read a whole weight matrix for 128 rows). Cluster 1x1 because a
// 1x2 cluster would need N to be a multiple of 512.
struct Cooperative128x256Tile {
  using TileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};

template <GroupedGemmOp kOp>
struct OpLayouts;
template <>
struct OpLayouts<GroupedGemmOp::kFprop> {
  using A = cutlass::layout::RowMajor;  // K-major
  using B = cutlass::layout::RowMajor;  // [K, N]: N-major
};
template <>
struct OpLayouts<GroupedGemmOp::kDgrad> {
  using A = cutlass::layout::RowMajor;     // K-major
  using B = cutlass::layout::ColumnMajor;  // K-major
};
template <>
struct OpLayouts<GroupedGemmOp::kWgrad> {
  using A = cutlass::layout::ColumnMajor;  // M-major
  using B = cutlass::layout::RowMajor;     // N-major
};

template <GroupedGemmOp kOp, class ElementD, class Tile>
struct GemmTypes {
  using ElementAB = cutlass::bfloat16_t;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  static constexpr int kAlignmentAB = 16 / sizeof(ElementAB);
  static constexpr int kAlignmentD = 16 / sizeof(ElementD);

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Tile::TileShape,
      typename Tile::ClusterShape, cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      ElementD, cutlass::layout::RowMajor*, kAlignmentD, ElementD, cutlass::layout::RowMajor*,
      kAlignmentD, typename Tile::EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, ElementD, float>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, typename OpLayouts<kOp>::A*,
      kAlignmentAB, ElementAB, typename OpLayouts<kOp>::B*, kAlignmentAB, float,
      typename Tile::TileShape, typename Tile::ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Tile::KernelSchedule>::CollectiveOp;

  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// A stride with one dynamic mode (the leading dimension) and static unit/zero modes.
template <class Stride>
__host__ __device__ Stride LeadingStride(int64_t ld) {
  Stride s{};
  if constexpr (cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(s))>>::value) {
    cute::get<1>(s) = ld;
  } else {
    cute::get<0>(s) = ld;
  }
  return s;
}

struct SetupParams {
  const int32_t* counts;
  int groups;
  int64_t capacity;  // R
  int64_t k;
  int64_t n;
  const void* a;
  const void* b;
  void* out;
  OpArrays arrays;
};

// Writes the problem shape, pointers and strides of every group from the device counts.
template <class Types, GroupedGemmOp kOp>
__global__ void __launch_bounds__(kSetupThreads) Sm90SetupKernel(SetupParams p) {
  using Kernel = typename Types::Kernel;
  using Shape3 = typename Types::ProblemShape::UnderlyingProblemShape;
  using ElementA = typename Kernel::ElementA;
  using ElementB = typename Kernel::ElementB;
  using ElementC = typename Kernel::ElementC;
  using ElementD = typename Kernel::ElementD;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  using StrideD = typename Kernel::InternalStrideD;
  __shared__ int num_empty;
  if (threadIdx.x == 0) num_empty = 0;  // BlockExclusiveScan synchronises before its first use
  const auto* a = static_cast<const ElementA*>(p.a);
  const auto* b = static_cast<const ElementB*>(p.b);
  auto* out = static_cast<ElementD*>(p.out);
  const int64_t k = p.k, n = p.n;
  BlockExclusiveScan(
      p.groups, [&](int g) { return NonNegativeCount(p.counts, g); },
      [&](int g, int64_t raw_offset, int64_t count) {
        const GroupRows r = ClampGroup(raw_offset, count, p.capacity);
        const int m = r.rows;
        Shape3 shape;
        const ElementA* ga;
        const ElementB* gb;
        ElementD* gd;
        int64_t lda, ldb, ldd;
        if constexpr (kOp != GroupedGemmOp::kWgrad) {
          // Fprop: a [R, K] -> out [R, N]; Dgrad: a [R, N] -> out [R, K]. w [G, K, N] for both
          // (read transposed by Dgrad's layout). ka: a's columns (the reduction), kd: out's.
          constexpr bool kFprop = kOp == GroupedGemmOp::kFprop;
          const int64_t ka = kFprop ? k : n, kd = kFprop ? n : k;
          shape = Shape3{m, static_cast<int>(kd), static_cast<int>(ka)};
          ga = a + r.offset * ka;
          gb = b + static_cast<int64_t>(g) * k * n;
          gd = out + r.offset * kd;
          lda = ka;
          ldb = n;
          ldd = kd;
        } else {
          shape = Shape3{m > 0 ? static_cast<int>(k) : 0, static_cast<int>(n), m};
          ga = a + r.offset * k;
          gb = b + r.offset * n;
          gd = out + static_cast<int64_t>(g) * k * n;
          lda = k;
          ldb = n;
          ldd = n;
          if (m == 0) p.arrays.empty_groups[1 + atomicAdd(&num_empty, 1)] = g;
        }
        static_cast<Shape3*>(p.arrays.problem_shapes)[g] = shape;
        static_cast<const ElementA**>(p.arrays.ptr_a)[g] = ga;
        static_cast<const ElementB**>(p.arrays.ptr_b)[g] = gb;
        static_cast<const ElementC**>(p.arrays.ptr_c)[g] = gd;
        static_cast<ElementD**>(p.arrays.ptr_d)[g] = gd;
        static_cast<StrideA*>(p.arrays.stride_a)[g] = LeadingStride<StrideA>(lda);
        static_cast<StrideB*>(p.arrays.stride_b)[g] = LeadingStride<StrideB>(ldb);
        static_cast<StrideC*>(p.arrays.stride_c)[g] = LeadingStride<StrideC>(ldd);
        static_cast<StrideD*>(p.arrays.stride_d)[g] = LeadingStride<StrideD>(ldd);
      });
  __syncthreads();
  if constexpr (kOp == GroupedGemmOp::kWgrad) {
    if (threadIdx.x == 0) p.arrays.empty_groups[0] = num_empty;
  }
}

template <GroupedGemmOp kOp, class ElementD, class Tile>
class Runner final : public KernelRunner {
 public:
  using Types = GemmTypes<kOp, ElementD, Tile>;
  using Gemm = typename Types::Gemm;
  using Kernel = typename Types::Kernel;
  using Shape3 = typename Types::ProblemShape::UnderlyingProblemShape;
  static_assert(sizeof(Shape3) <= kShapeBytes, "problem shape does not fit its slot");
  static_assert(sizeof(typename Kernel::InternalStrideA) <= kStrideBytes, "stride A too large");
  static_assert(sizeof(typename Kernel::InternalStrideB) <= kStrideBytes, "stride B too large");
  static_assert(sizeof(typename Kernel::InternalStrideC) <= kStrideBytes, "stride C too large");
  static_assert(sizeof(typename Kernel::InternalStrideD) <= kStrideBytes, "stride D too large");
  // CUTLASS sizes the mainloop stages to fit beside the epilogue; this checks the whole kernel's
  // shared memory at compile time, not at the first launch on a GPU.
  static_assert(Kernel::SharedStorageSize <=
                    cutlass::gemm::collective::detail::sm90_smem_capacity_bytes,
                "the tile's shared memory exceeds an SM90 SM's");

  Runner(int device, int sm_count) : device_(device), sm_count_(sm_count) {}

  size_t WorkspaceBytes() const override {
    return Gemm::get_workspace_size(MakeArguments(OpArrays{}, 1, false));
  }

  absl::Status Run(const GroupedGemmCall& call, const OpArrays& arrays) override {
    cudaStream_t stream = call.cuda_stream;
    SetupParams p;
    p.counts = call.tokens_per_group;
    p.groups = call.groups;
    p.capacity = call.rows;
    p.k = call.k;
    p.n = call.n;
    p.a = call.a;
    p.b = call.b;
    p.out = call.out;
    p.arrays = arrays;
    Sm90SetupKernel<Types, kOp><<<1, kSetupThreads, 0, stream>>>(p);
    SY_CUDA_RETURN_IF_LAUNCH_ERROR(Sm90SetupKernel);

    typename Gemm::Params* params = nullptr;
    for (CachedParams& c : cache_) {
      if (c.groups == call.groups && c.accumulate == call.accumulate &&
          c.workspace == arrays.workspace) {
        params = &c.params;
      }
    }
    if (params == nullptr) {
      // First call with this (G, accumulate): host-side setup (TMA descriptor templates, smem
      // attribute). Later calls only launch.
      const typename Gemm::Arguments args = MakeArguments(arrays, call.groups, call.accumulate);
      if (arrays.workspace_bytes < Gemm::get_workspace_size(args)) {
        return absl::InternalError("CUTLASS workspace too small");
      }
      cutlass::Status status = Gemm::can_implement(args);
      if (status != cutlass::Status::kSuccess) {
        return absl::InternalError(
            absl::StrCat("CUTLASS can_implement: ", cutlassGetStatusString(status)));
      }
      status = gemm_.initialize(args, arrays.workspace, stream);
      if (status != cutlass::Status::kSuccess) {
        SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        return absl::InternalError(
            absl::StrCat("CUTLASS initialize: ", cutlassGetStatusString(status)));
      }
      if (cache_.size() >= kMaxCachedParams) cache_.erase(cache_.begin());
      cache_.push_back({call.groups, call.accumulate, arrays.workspace, gemm_.params()});
      params = &cache_.back().params;
    }
    const cutlass::Status status = Gemm::run(*params, stream);
    if (status != cutlass::Status::kSuccess) {
      SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      return absl::InternalError(absl::StrCat("CUTLASS run: ", cutlassGetStatusString(status)));
    }
    SY_CUDA_RETURN_IF_LAUNCH_ERROR(GemmUniversal);
    return absl::OkStatus();
  }

 private:
  typename Gemm::Arguments MakeArguments(const OpArrays& arrays, int groups,
                                         bool accumulate) const {
    using ElementA = typename Kernel::ElementA;
    using ElementB = typename Kernel::ElementB;
    using ElementC = typename Kernel::ElementC;
    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    // Device problem shapes only: the host pointer stays null.
    args.problem_shape.num_groups = groups;
    args.problem_shape.problem_shapes = static_cast<Shape3*>(arrays.problem_shapes);
    args.problem_shape.host_problem_shapes = nullptr;
    args.mainloop.ptr_A = static_cast<const ElementA**>(arrays.ptr_a);
    args.mainloop.dA = static_cast<typename Kernel::InternalStrideA*>(arrays.stride_a);
    args.mainloop.ptr_B = static_cast<const ElementB**>(arrays.ptr_b);
    args.mainloop.dB = static_cast<typename Kernel::InternalStrideB*>(arrays.stride_b);
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = accumulate ? 1.0f : 0.0f;
    args.epilogue.ptr_C = static_cast<const ElementC**>(arrays.ptr_c);
    args.epilogue.dC = static_cast<typename Kernel::InternalStrideC*>(arrays.stride_c);
    args.epilogue.ptr_D = static_cast<ElementD**>(arrays.ptr_d);
    args.epilogue.dD = static_cast<typename Kernel::InternalStrideD*>(arrays.stride_d);
    args.hw_info.device_id = device_;
    args.hw_info.sm_count = sm_count_;
    args.hw_info.max_active_clusters = 0;  // let the scheduler size the grid from the SM count
    return args;
  }

  // Kernel parameters depend on G and beta only (the device arrays and workspace are fixed), so a
  // few are kept: a layer alternates at most between fresh and accumulating Wgrad.
  struct CachedParams {
    int groups;
    bool accumulate;
    void* workspace;
    typename Gemm::Params params;
  };
  static constexpr size_t kMaxCachedParams = 4;

  int device_;
  int sm_count_;
  Gemm gemm_;  // used for initialize(); its params are copied into cache_
  std::vector<CachedParams> cache_;
};

// The runner of `kOp` with output ElementD for `tile` (null for kAuto, which the caller
// resolves first). Every call instantiates all five tiles of its (op, ElementD).
template <GroupedGemmOp kOp, class ElementD>
std::unique_ptr<KernelRunner> MakeTiledRunner(GroupedGemmTile tile, int device, int sm_count) {
  switch (tile) {
    case GroupedGemmTile::kPingpong128x128:
      return std::make_unique<Runner<kOp, ElementD, PingpongTile>>(device, sm_count);
    case GroupedGemmTile::kCooperative256x128:
      return std::make_unique<Runner<kOp, ElementD, CooperativeTile>>(device, sm_count);
    case GroupedGemmTile::kCooperative128x128:
      return std::make_unique<Runner<kOp, ElementD, Cooperative128x128Tile>>(device, sm_count);
    case GroupedGemmTile::kPingpong64x128:
      return std::make_unique<Runner<kOp, ElementD, Pingpong64x128Tile>>(device, sm_count);
    case GroupedGemmTile::kCooperative128x256:
      return std::make_unique<Runner<kOp, ElementD, Cooperative128x256Tile>>(device, sm_count);
    case GroupedGemmTile::kAuto:
      break;
  }
  return nullptr;
}

}  // namespace switchyard::kernels::internal::sm90

#else
#define SY_GROUPED_GEMM_SM90 0
#endif  // CUTLASS_ARCH_MMA_MODIFIABLE_TMA_SM90_SUPPORTED

#endif  // SWITCHYARD_KERNELS_GEMM_GROUPED_GEMM_SM90_CUH_
