// CUTLASS SM90 grouped GEMM instantiations for Fprop (bf16 out), one per tile (GroupedGemmTile).
// The instantiations are split by op over three .cu files (this one, grouped_gemm_sm90_dgrad.cu
// and grouped_gemm_sm90_wgrad.cu: five or six each) so that they compile in parallel; most of a
// small file's time is the fixed cost of parsing CUTLASS, so one file per instantiation would
// cost more CPU in total on a 2-core machine.
#include <memory>

#include "kernels/gemm/grouped_gemm_sm90.cuh"

namespace switchyard::kernels::internal::sm90 {

std::unique_ptr<KernelRunner> MakeFpropRunner(GroupedGemmTile tile, int device, int sm_count) {
#if SY_GROUPED_GEMM_SM90
  return MakeTiledRunner<GroupedGemmOp::kFprop, cutlass::bfloat16_t>(tile, device, sm_count);
#else
  return nullptr;
#endif
}

}  // namespace switchyard::kernels::internal::sm90
