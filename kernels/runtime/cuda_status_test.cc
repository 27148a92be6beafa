// The CUDA / cuBLAS / NCCL error converters (no GPU needed: they map error codes, they do not
// call the device).
#include "kernels/runtime/cuda_status.h"

#include <gtest/gtest.h>

namespace switchyard {
namespace {

absl::Status CudaFails() {
  SY_CUDA_RETURN_IF_ERROR(cudaErrorMemoryAllocation);
  return absl::OkStatus();
}

absl::Status NcclFails() {
  SY_NCCL_RETURN_IF_ERROR(ncclRemoteError);
  return absl::OkStatus();
}

absl::Status CublasFails() {
  SY_CUBLAS_RETURN_IF_ERROR(CUBLAS_STATUS_INVALID_VALUE);
  return absl::OkStatus();
}

TEST(CudaStatusTest, ConvertersKeepTheExpressionAndMapCodes) {
  absl::Status s = CudaFails();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("cudaErrorMemoryAllocation failed"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("cuda_status_test.cc"), absl::string_view::npos) << s;
  s = NcclFails();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);  // retryable: a lost peer
  EXPECT_NE(s.message().find("ncclRemoteError"), absl::string_view::npos) << s;
  s = CublasFails();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("CUBLAS_STATUS_INVALID_VALUE"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace switchyard
