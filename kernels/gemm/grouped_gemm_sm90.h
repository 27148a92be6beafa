// File: kernels/gemm/grouped_gemm_sm90.h
//
// Internal interface between the CUTLASS SM90 grouped GEMM path (grouped_gemm_sm90.cu: device
// arrays, validation, tile choice) and its kernel instantiations in grouped_gemm_sm90_fprop.cu,
// grouped_gemm_sm90_dgrad.cu and grouped_gemm_sm90_wgrad.cu (three files, compiled in parallel).
// This header has no CUTLASS types; grouped_gemm_sm90.cuh has the templates.
#ifndef SWITCHYARD_KERNELS_GEMM_GROUPED_GEMM_SM90_H_
#define SWITCHYARD_KERNELS_GEMM_GROUPED_GEMM_SM90_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "kernels/gemm/grouped_gemm.h"

namespace switchyard::kernels::internal::sm90 {

// Bytes reserved per group for one problem shape (cute::Shape<int, int, int>) and for one stride
// (cute::Stride with one int64 mode); the instantiations static_assert that theirs fit.
inline constexpr size_t kShapeBytes = 16;
inline constexpr size_t kStrideBytes = 16;

// The device arrays of one op, sized for max_groups: written by the setup kernel from the device
// counts, read by the CUTLASS kernel. Typed by the instantiation that uses them.
struct OpArrays {
  void* problem_shapes = nullptr;  // [max_groups] (M, N, K)
  void* ptr_a = nullptr;           // [max_groups] pointers
  void* ptr_b = nullptr;
  void* ptr_c = nullptr;
  void* ptr_d = nullptr;
  void* stride_a = nullptr;  // [max_groups] strides
  void* stride_b = nullptr;
  void* stride_c = nullptr;
  void* stride_d = nullptr;
  // Wgrad: [0] = number of groups with zero rows, then those groups (written by the setup kernel,
  // consumed by the zero-fill kernel).
  int32_t* empty_groups = nullptr;
  void* workspace = nullptr;  // CUTLASS workspace (per-SM tensor maps)
  size_t workspace_bytes = 0;
};

// One CUTLASS grouped GEMM instantiation with its setup kernel. Keeps the initialised CUTLASS
// kernel parameters per (G, accumulate), so only the first call of each does host-side setup.
class KernelRunner {
 public:
  virtual ~KernelRunner() = default;
  virtual size_t WorkspaceBytes() const = 0;
  // Enqueues the setup kernel and the GEMM on call.cuda_stream. Requires a validated, TMA-aligned
  // call and cudaSetDevice(device) done by the caller.
  virtual absl::Status Run(const GroupedGemmCall& call, const OpArrays& arrays) = 0;
};

// The runner of one op with `tile` (not kAuto). Null when this build has no SM90 grouped GEMM
// support (CUDA < 12.3).
std::unique_ptr<KernelRunner> MakeFpropRunner(GroupedGemmTile tile, int device, int sm_count);
std::unique_ptr<KernelRunner> MakeDgradRunner(GroupedGemmTile tile, int device, int sm_count);
std::unique_ptr<KernelRunner> MakeWgradF32Runner(GroupedGemmTile tile, int device, int sm_count);
// bf16 dW: the 128x128 ping-pong tile only (four instantiations less to compile).
std::unique_ptr<KernelRunner> MakeWgradBf16Runner(int device, int sm_count);

}  // namespace switchyard::kernels::internal::sm90

#endif  // SWITCHYARD_KERNELS_GEMM_GROUPED_GEMM_SM90_H_
