// CUTLASS SM90 grouped GEMM instantiation for Wgrad into bf16 gradients: the ping-pong tile only
// (fp32 gradients are the main case; see grouped_gemm_sm90_wgrad.cu).
#include <memory>

#include "kernels/gemm/grouped_gemm_sm90.cuh"

namespace switchyard::kernels::internal::sm90 {

std::unique_ptr<KernelRunner> MakeWgradBf16Runner(int device, int sm_count) {
#if SY_GROUPED_GEMM_SM90
  return std::make_unique<Runner<GroupedGemmOp::kWgrad, cutlass::bfloat16_t, PingpongTile>>(
      device, sm_count);
#else
  return nullptr;
#endif
}

}  // namespace switchyard::kernels::internal::sm90
