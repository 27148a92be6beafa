// File: kernels/gemm/grouped_gemm_gather_sm90.h
//
// Gathered grouped GEMM (issue 16 item 1, first step): the expert GEMMs reading their per-row
// operand THROUGH A ROW INDEX instead of from a permuted copy. Same ops, layouts and device-side
// group counts as GroupedGemm (grouped_gemm.h), except that an activation operand may be given
// as (source matrix, row index): row p of the operand is row index[p] of the source. So fc1
// reads the unpermuted tokens x [T, H] with index = the permutation's source token of each
// permuted row, and the permuted copy x_perm [T·k, H] need not exist; likewise fc2's backward
// reads the unpermuted output gradient.
//
//   Fprop  y_g  = A_g · W_g         A = x [R, K] or gather(x_src [S, K], a_index [R])
//   Dgrad  dx_g = A_g · W_gᵀ        A = dy [R, N] or gather(dy_src [S, N], a_index [R])
//   Wgrad  dW_g (+)= A_gᵀ · B_g     A = x rows, B = dy rows, each direct or gathered
// Index entries outside [0, S) are not checked on the device (the caller's permutation produces
// them); the host checks shapes only.
//
// Kernel: a persistent warp-specialised Hopper kernel (one producer warp group loading with
// cp.async, 16 bytes per thread per copy, each row's address from the index; two consumer warp
// groups running CUTLASS's SM90 cp.async GMMA mainloop, 256 x 128 x 64 tile, one 128 x 128 half
// each; the epilogue stores from registers with the group's rows as predicate). Every CTA scans
// the device counts itself at its start (no setup kernel, no device arrays), then walks the
// tiles of all groups. Requirements (INVALID_ARGUMENT otherwise): K and N multiples of 128 (the
// tile's N and the wgrad tile's M) and of 64, at most kGatherMaxGroups groups, 16-byte aligned
// pointers. Only on compute capability 9.0 (FAILED_PRECONDITION otherwise).
#ifndef SWITCHYARD_KERNELS_GEMM_GROUPED_GEMM_GATHER_SM90_H_
#define SWITCHYARD_KERNELS_GEMM_GROUPED_GEMM_GATHER_SM90_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/gemm/grouped_gemm.h"

namespace switchyard::kernels::internal {

inline constexpr int kGatherMaxGroups = 1024;

// One gathered call. As GroupedGemmCall (a, b, out, counts, rows = R, k, n, groups, accumulate,
// stream), plus the row indices: a_index (Fprop, Dgrad, Wgrad) and b_index (Wgrad only) are
// int32 [R] on the device or null (the operand is already in permuted order).
struct GatherGemmCall {
  GroupedGemmOp op = GroupedGemmOp::kFprop;
  const void* a = nullptr;
  const int32_t* a_index = nullptr;
  const void* b = nullptr;
  const int32_t* b_index = nullptr;
  void* out = nullptr;
  DType out_dtype = DType::kBF16;  // bf16 (Fprop, Dgrad), f32 (Wgrad)
  const int32_t* tokens_per_group = nullptr;
  int64_t rows = 0;
  int64_t k = 0;
  int64_t n = 0;
  int groups = 0;
  bool accumulate = false;
  CUstream_st* cuda_stream = nullptr;
  int sm_count = 0;  // the persistent grid; 0 = query the current device
};

// Whether this build holds the kernel (CUDA >= 12.3 with CUTLASS's SM90 support).
bool GatherGemmSm90Compiled();
// Validates `call` (shapes, alignment, dtypes) and enqueues the kernel on its stream. The caller
// has made the op's device current.
absl::Status RunGatherGemmSm90(const GatherGemmCall& call);

}  // namespace switchyard::kernels::internal

#endif  // SWITCHYARD_KERNELS_GEMM_GROUPED_GEMM_GATHER_SM90_H_
