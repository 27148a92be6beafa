// File: kernels/runtime/cuda_status.h
//
// Converters from CUDA runtime, cuBLAS and NCCL error codes to absl::Status, applied at the edge
// by macros that keep the failing expression's text. Codes: resource exhaustion (out of memory)
// becomes RESOURCE_EXHAUSTED, invalid arguments INVALID_ARGUMENT, NCCL remote/system errors
// UNAVAILABLE (retryable: a lost peer), everything else INTERNAL.
#ifndef SWITCHYARD_KERNELS_RUNTIME_CUDA_STATUS_H_
#define SWITCHYARD_KERNELS_RUNTIME_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "common/status.h"

namespace switchyard {

absl::Status CudaErrorToStatus(cudaError_t err, const char* expr, const char* file, int line);
absl::Status CublasErrorToStatus(cublasStatus_t err, const char* expr, const char* file, int line);
absl::Status NcclErrorToStatus(ncclResult_t err, const char* expr, const char* file, int line);

}  // namespace switchyard

#define SY_CUDA_RETURN_IF_ERROR(expr)                                             \
  do {                                                                            \
    cudaError_t sy_err_ = (expr);                                                 \
    if (sy_err_ != cudaSuccess)                                                   \
      return ::switchyard::CudaErrorToStatus(sy_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports launch-configuration errors without synchronising.
#define SY_CUDA_RETURN_IF_LAUNCH_ERROR(kernel_name) SY_CUDA_RETURN_IF_ERROR(cudaGetLastError())

#define SY_CUBLAS_RETURN_IF_ERROR(expr)                                             \
  do {                                                                              \
    cublasStatus_t sy_err_ = (expr);                                                \
    if (sy_err_ != CUBLAS_STATUS_SUCCESS)                                           \
      return ::switchyard::CublasErrorToStatus(sy_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define SY_NCCL_RETURN_IF_ERROR(expr)                                             \
  do {                                                                            \
    ncclResult_t sy_err_ = (expr);                                                \
    if (sy_err_ != ncclSuccess && sy_err_ != ncclInProgress)                      \
      return ::switchyard::NcclErrorToStatus(sy_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#endif  // SWITCHYARD_KERNELS_RUNTIME_CUDA_STATUS_H_
