#include "kernels/runtime/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace switchyard {
namespace {

absl::Status Make(absl::StatusCode code, const char* expr, const char* file, int line,
                  absl::string_view what) {
  return absl::Status(code, absl::StrCat(expr, " failed: ", what, " [", file, ":", line, "]"));
}

}  // namespace

absl::Status CudaErrorToStatus(cudaError_t err, const char* expr, const char* file, int line) {
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (err == cudaErrorMemoryAllocation) code = absl::StatusCode::kResourceExhausted;
  if (err == cudaErrorInvalidValue || err == cudaErrorInvalidConfiguration)
    code = absl::StatusCode::kInvalidArgument;
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
    code = absl::StatusCode::kFailedPrecondition;
  return Make(code, expr, file, line,
              absl::StrCat(cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

absl::Status CublasErrorToStatus(cublasStatus_t err, const char* expr, const char* file, int line) {
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (err == CUBLAS_STATUS_ALLOC_FAILED) code = absl::StatusCode::kResourceExhausted;
  if (err == CUBLAS_STATUS_INVALID_VALUE) code = absl::StatusCode::kInvalidArgument;
  if (err == CUBLAS_STATUS_NOT_SUPPORTED || err == CUBLAS_STATUS_ARCH_MISMATCH)
    code = absl::StatusCode::kUnimplemented;
  return Make(code, expr, file, line, cublasGetStatusString(err));
}

absl::Status NcclErrorToStatus(ncclResult_t err, const char* expr, const char* file, int line) {
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (err == ncclInvalidArgument || err == ncclInvalidUsage)
    code = absl::StatusCode::kInvalidArgument;
  if (err == ncclSystemError || err == ncclRemoteError) code = absl::StatusCode::kUnavailable;
  return Make(code, expr, file, line,
              absl::StrCat(ncclGetErrorString(err), " (", ncclGetLastError(nullptr), ")"));
}

}  // namespace switchyard
