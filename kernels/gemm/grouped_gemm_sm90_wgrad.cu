// CUTLASS SM90 grouped GEMM instantiations for Wgrad: fp32 dW (the gradient buffers) with every
// tile (GroupedGemmTile), bf16 dW with the 128x128 ping-pong tile only. See
// grouped_gemm_sm90_fprop.cu for why the instantiations are split over three files.
#include <memory>

#include "kernels/gemm/grouped_gemm_sm90.cuh"

namespace switchyard::kernels::internal::sm90 {

std::unique_ptr<KernelRunner> MakeWgradF32Runner(GroupedGemmTile tile, int device, int sm_count) {
#if SY_GROUPED_GEMM_SM90
  return MakeTiledRunner<GroupedGemmOp::kWgrad, float>(tile, device, sm_count);
#else
  return nullptr;
#endif
}

std::unique_ptr<KernelRunner> MakeWgradBf16Runner(int device, int sm_count) {
#if SY_GROUPED_GEMM_SM90
  return std::make_unique<Runner<GroupedGemmOp::kWgrad, cutlass::bfloat16_t, PingpongTile>>(
      device, sm_count);
#else
  return nullptr;
#endif
}

}  // namespace switchyard::kernels::internal::sm90
