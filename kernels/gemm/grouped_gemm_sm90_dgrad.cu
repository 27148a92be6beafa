// CUTLASS SM90 grouped GEMM instantiations for Dgrad (bf16 out), one per tile (GroupedGemmTile).
// See grouped_gemm_sm90_fprop.cu for why the instantiations are split over three files.
#include <memory>

#include "kernels/gemm/grouped_gemm_sm90.cuh"

namespace switchyard::kernels::internal::sm90 {

std::unique_ptr<KernelRunner> MakeDgradRunner(GroupedGemmTile tile, int device, int sm_count) {
#if SY_GROUPED_GEMM_SM90
  return MakeTiledRunner<GroupedGemmOp::kDgrad, cutlass::bfloat16_t>(tile, device, sm_count);
#else
  return nullptr;
#endif
}

}  // namespace switchyard::kernels::internal::sm90
