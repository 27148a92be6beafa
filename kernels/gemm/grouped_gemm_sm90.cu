// CUTLASS SM90 path of GroupedGemm: owns the per-op device arrays and CUTLASS workspaces, checks
// the TMA requirements, picks the tile, and runs setup kernel -> CUTLASS grouped GEMM (and, for a
// fresh Wgrad, the zero-fill of groups without rows), all on the caller's stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <iterator>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cutlass/arch/config.h"
#include "kernels/gemm/grouped_gemm.h"
#include "kernels/gemm/grouped_gemm_sm90.h"
#include "kernels/runtime/buffer.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

constexpr int kZeroThreads = 256;
constexpr int kNumOps = 3;
constexpr int kNumTiles = static_cast<int>(std::size(kGroupedGemmTiles));

// The position of `tile` (not kAuto) in kGroupedGemmTiles, which lists the tiles in enum order.
constexpr int TileIndex(GroupedGemmTile tile) { return static_cast<int>(tile) - 1; }
constexpr bool TilesInEnumOrder() {
  for (int t = 0; t < kNumTiles; ++t) {
    if (TileIndex(kGroupedGemmTiles[t]) != t) return false;
  }
  return true;
}
static_assert(TilesInEnumOrder(), "kGroupedGemmTiles must list the tiles in enum order");

// Zeroes dW_g for the groups the setup kernel listed as empty ([0] = count, then the groups).
// dW_g is 16-byte aligned and a multiple of 16 bytes long (N % 8 == 0, aligned base).
__global__ void __launch_bounds__(kZeroThreads)
    ZeroEmptyGroupsKernel(const int32_t* empty_groups, uint4* dw, int64_t vecs_per_group) {
  const int count = empty_groups[0];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int e = 0; e < count; ++e) {
    uint4* group = dw + static_cast<int64_t>(empty_groups[1 + e]) * vecs_per_group;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         i < vecs_per_group; i += stride) {
      group[i] = make_uint4(0, 0, 0, 0);
    }
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
size_t RoundUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

class Sm90Path final : public GroupedGemmCudaPath {
 public:
  Sm90Path(int device, int sm_count) : device_(device), sm_count_(sm_count) {}

  absl::Status Init(int max_groups) {
    for (int t = 0; t < kNumTiles; ++t) {
      const GroupedGemmTile tile = kGroupedGemmTiles[t];
      fprop_[t] = sm90::MakeFpropRunner(tile, device_, sm_count_);
      dgrad_[t] = sm90::MakeDgradRunner(tile, device_, sm_count_);
      wgrad_f32_[t] = sm90::MakeWgradF32Runner(tile, device_, sm_count_);
      if (!fprop_[t] || !dgrad_[t] || !wgrad_f32_[t]) {
        return absl::FailedPreconditionError("CUTLASS SM90 grouped GEMM is not compiled in");
      }
    }
    wgrad_bf16_ = sm90::MakeWgradBf16Runner(device_, sm_count_);
    if (!wgrad_bf16_) return absl::FailedPreconditionError("CUTLASS SM90 grouped GEMM missing");

    std::array<size_t, kNumOps> workspace{};
    for (int t = 0; t < kNumTiles; ++t) {
      workspace[0] = std::max(workspace[0], fprop_[t]->WorkspaceBytes());
      workspace[1] = std::max(workspace[1], dgrad_[t]->WorkspaceBytes());
      workspace[2] = std::max(workspace[2], wgrad_f32_[t]->WorkspaceBytes());
    }
    workspace[2] = std::max(workspace[2], wgrad_bf16_->WorkspaceBytes());

    const size_t g = static_cast<size_t>(max_groups);
    const size_t shapes = RoundUp(g * sm90::kShapeBytes);
    const size_t pointers = RoundUp(g * sizeof(void*));
    const size_t strides = RoundUp(g * sm90::kStrideBytes);
    const size_t empty = RoundUp((g + 1) * sizeof(int32_t));
    size_t total = 0;
    for (int op = 0; op < kNumOps; ++op) {
      total += shapes + 4 * pointers + 4 * strides + empty + RoundUp(workspace[op]);
    }
    SY_ASSIGN_OR_RETURN(memory_, Buffer::Allocate(Device::Cuda(device_), total));
    char* p = static_cast<char*>(memory_.data());
    auto take = [&p](size_t bytes) {
      char* q = p;
      p += bytes;
      return q;
    };
    for (int op = 0; op < kNumOps; ++op) {
      sm90::OpArrays& a = arrays_[op];
      a.problem_shapes = take(shapes);
      a.ptr_a = take(pointers);
      a.ptr_b = take(pointers);
      a.ptr_c = take(pointers);
      a.ptr_d = take(pointers);
      a.stride_a = take(strides);
      a.stride_b = take(strides);
      a.stride_c = take(strides);
      a.stride_d = take(strides);
      a.empty_groups = reinterpret_cast<int32_t*>(take(empty));
      a.workspace = take(RoundUp(workspace[op]));
      a.workspace_bytes = workspace[op];
    }
    return absl::OkStatus();
  }

  absl::Status Run(const GroupedGemmCall& call) override {
    if (call.k % 8 != 0 || call.n % 8 != 0 || !Aligned16(call.a) || !Aligned16(call.b) ||
        !Aligned16(call.out)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "K (", call.k, ") and N (", call.n,
          ") must be multiples of 8 and the data pointers 16-byte aligned for the CUTLASS SM90 "
          "path (TMA); create the GroupedGemm with path = kFallback for such shapes"));
    }
    SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GroupedGemmTile tile =
        call.tile == GroupedGemmTile::kAuto
            ? ChooseGroupedGemmTile(call.op, call.rows, call.groups, call.k, call.n)
            : call.tile;
    // bf16 dW exists only with the 128x128 ping-pong tile.
    if (call.op == GroupedGemmOp::kWgrad && call.out_dtype != DType::kF32) {
      tile = GroupedGemmTile::kPingpong128x128;
    }
    const int t = TileIndex(tile);
    if (t < 0 || t >= kNumTiles) {
      return absl::InvalidArgumentError(
          absl::StrCat("GroupedGemmOptions::tile (", static_cast<int>(tile), ") is not a tile"));
    }
    const int op = static_cast<int>(call.op);
    sm90::KernelRunner* runner = nullptr;
    switch (call.op) {
      case GroupedGemmOp::kFprop:
        runner = fprop_[t].get();
        break;
      case GroupedGemmOp::kDgrad:
        runner = dgrad_[t].get();
        break;
      case GroupedGemmOp::kWgrad:
        runner = call.out_dtype == DType::kF32 ? wgrad_f32_[t].get() : wgrad_bf16_.get();
        break;
    }
    SY_RETURN_IF_ERROR(runner->Run(call, arrays_[op]));
    if (call.op == GroupedGemmOp::kWgrad && !call.accumulate) {
      // The empty groups are problems (0, N, 0), untouched by CUTLASS: zero them here.
      const int64_t bytes_per_group =
          call.k * call.n * static_cast<int64_t>(DTypeSize(call.out_dtype));
      ZeroEmptyGroupsKernel<<<2 * sm_count_, kZeroThreads, 0, call.cuda_stream>>>(
          arrays_[op].empty_groups, static_cast<uint4*>(call.out), bytes_per_group / 16);
      SY_CUDA_RETURN_IF_LAUNCH_ERROR(ZeroEmptyGroupsKernel);
    }
    return absl::OkStatus();
  }

 private:
  int device_;
  int sm_count_;
  Buffer memory_;
  std::array<sm90::OpArrays, kNumOps> arrays_;  // indexed by GroupedGemmOp
  // Indexed by TileIndex (kGroupedGemmTiles order).
  std::unique_ptr<sm90::KernelRunner> fprop_[kNumTiles], dgrad_[kNumTiles], wgrad_f32_[kNumTiles];
  std::unique_ptr<sm90::KernelRunner> wgrad_bf16_;
};

}  // namespace

bool Sm90GroupedGemmCompiled() {
#if defined(CUTLASS_ARCH_MMA_MODIFIABLE_TMA_SM90_SUPPORTED)
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<GroupedGemmCudaPath>> CreateGroupedGemmSm90(int device,
                                                                           int max_groups) {
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  int sm_count = 0;
  SY_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  auto path = std::make_unique<Sm90Path>(device, sm_count);
  SY_RETURN_IF_ERROR(path->Init(max_groups));
  return std::unique_ptr<GroupedGemmCudaPath>(std::move(path));
}

}  // namespace switchyard::kernels::internal
