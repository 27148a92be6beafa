// CUTLASS SM90 grouped GEMM instantiations for Wgrad into fp32 gradients: ping-pong and
// cooperative tiles. (Each grouped_gemm_sm90_*.cu is a separate nvcc action so that the
// instantiations build in parallel.)
#include <memory>

#include "kernels/gemm/grouped_gemm_sm90.cuh"

namespace switchyard::kernels::internal::sm90 {

std::unique_ptr<KernelRunner> MakeWgradF32Runner(GroupedGemmTile tile, int device, int sm_count) {
#if SY_GROUPED_GEMM_SM90
  constexpr GroupedGemmOp kOp = GroupedGemmOp::kWgrad;
  if (tile == GroupedGemmTile::kCooperative256x128) {
    return std::make_unique<Runner<kOp, float, CooperativeTile>>(device, sm_count);
  }
  return std::make_unique<Runner<kOp, float, PingpongTile>>(device, sm_count);
#else
  return nullptr;
#endif
}

}  // namespace switchyard::kernels::internal::sm90
