// CUDA path of Gemm: cuBLAS cublasGemmEx with fp32 compute (tensor cores for bf16).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <map>
#include <utility>

#include "kernels/gemm/gemm.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels::internal {
namespace {

// One handle per (thread, device, stream): a cuBLAS handle's workspace must not be used by two
// streams at once (the MoE layer runs the shared expert on a side stream).
absl::StatusOr<cublasHandle_t> HandleFor(int device, cudaStream_t stream) {
  thread_local std::map<std::pair<int, cudaStream_t>, cublasHandle_t> handles;
  auto it = handles.find({device, stream});
  if (it != handles.end()) return it->second;
  cublasHandle_t h;
  SY_CUBLAS_RETURN_IF_ERROR(cublasCreate(&h));
  SY_CUBLAS_RETURN_IF_ERROR(cublasSetStream(h, stream));
  handles[{device, stream}] = h;
  return h;
}

absl::StatusOr<cudaDataType_t> CudaType(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      return absl::InvalidArgumentError("Gemm (CUDA): unsupported dtype");
  }
}

}  // namespace

absl::Status GemmCuda(const Stream& stream, const Tensor& a, bool trans_a, const Tensor& b,
                      bool trans_b, const Tensor& c, float alpha, float beta, int64_t m, int64_t n,
                      int64_t k) {
  if (m == 0 || n == 0) return absl::OkStatus();
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  SY_ASSIGN_OR_RETURN(cublasHandle_t h, HandleFor(stream.device.index, stream.cuda_stream));
  SY_ASSIGN_OR_RETURN(cudaDataType_t ab_type, CudaType(a.dtype));
  SY_ASSIGN_OR_RETURN(cudaDataType_t c_type, CudaType(c.dtype));
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int lda = static_cast<int>(trans_a ? m : k);
  const int ldb = static_cast<int>(trans_b ? k : n);
  SY_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(h, op_b, op_a, static_cast<int>(n), static_cast<int>(m),
                                         static_cast<int>(k), &alpha, b.data, ab_type, ldb, a.data,
                                         ab_type, lda, &beta, c.data, c_type, static_cast<int>(n),
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

}  // namespace switchyard::kernels::internal
