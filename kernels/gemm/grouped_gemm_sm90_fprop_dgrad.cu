// CUTLASS SM90 grouped GEMM instantiations for Fprop and Dgrad (bf16 out), each with the ping-pong
// and the cooperative tile. The instantiations are split over two .cu files (this one and
// grouped_gemm_sm90_wgrad.cu): two parallel nvcc actions on a 2-core machine, while most of each
// action's time is the fixed cost of parsing CUTLASS, so more files would cost more CPU in total.
#include <memory>

#include "kernels/gemm/grouped_gemm_sm90.cuh"

namespace switchyard::kernels::internal::sm90 {

#if SY_GROUPED_GEMM_SM90
std::unique_ptr<KernelRunner> MakeFpropRunner(GroupedGemmTile tile, int device, int sm_count) {
  return MakeTiledRunner<GroupedGemmOp::kFprop, cutlass::bfloat16_t>(tile, device, sm_count);
}

std::unique_ptr<KernelRunner> MakeDgradRunner(GroupedGemmTile tile, int device, int sm_count) {
  return MakeTiledRunner<GroupedGemmOp::kDgrad, cutlass::bfloat16_t>(tile, device, sm_count);
}
#else
std::unique_ptr<KernelRunner> MakeFpropRunner(GroupedGemmTile, int, int) { return nullptr; }
std::unique_ptr<KernelRunner> MakeDgradRunner(GroupedGemmTile, int, int) { return nullptr; }
#endif

}  // namespace switchyard::kernels::internal::sm90
