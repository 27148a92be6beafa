// File: kernels/gemm/gemm.h
//
// Dense GEMM, row-major: C = alpha * op(A) * op(B) + beta * C, accumulating in fp32.
//   A: [M, K] ([K, M] when trans_a), B: [K, N] ([N, K] when trans_b), C: [M, N].
//   A and B: both bf16 or both f32 (or both f64 on the CPU). C: f32, or bf16 with bf16 inputs.
// The CUDA path calls cuBLAS (cublasGemmEx, tensor cores for bf16); the CPU path is the fp64-
// accumulating reference. One cuBLAS handle per (thread, device), created on first use.
#ifndef SWITCHYARD_KERNELS_GEMM_GEMM_H_
#define SWITCHYARD_KERNELS_GEMM_GEMM_H_

#include "absl/status/status.h"
#include "common/tensor.h"

namespace switchyard::kernels {

absl::Status Gemm(const Stream& stream, const Tensor& a, bool trans_a, const Tensor& b,
                  bool trans_b, const Tensor& c, float alpha = 1.0f, float beta = 0.0f);

namespace internal {
absl::Status GemmCpu(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                     float alpha, float beta, int64_t m, int64_t n, int64_t k);
absl::Status GemmCuda(const Stream& stream, const Tensor& a, bool trans_a, const Tensor& b,
                      bool trans_b, const Tensor& c, float alpha, float beta, int64_t m, int64_t n,
                      int64_t k);
}  // namespace internal

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_GEMM_GEMM_H_
