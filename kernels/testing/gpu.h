// File: kernels/testing/gpu.h
//
// Helpers for `gpu`-tagged tests: skip (visibly, as GTEST_SKIP) when no CUDA device is usable,
// fill tensors with fresh random values, and compare against a reference with the relative
// error ||out - ref|| / ||ref|| that DESIGN.md prescribes.
#ifndef SWITCHYARD_KERNELS_TESTING_GPU_H_
#define SWITCHYARD_KERNELS_TESTING_GPU_H_

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "common/tensor.h"
#include "kernels/runtime/buffer.h"

namespace switchyard::testing {

// Number of usable CUDA devices; 0 when there is no driver or no device. `why` gets the reason.
int CudaDeviceCount(std::string* why = nullptr);

// ||a - b||_2 / ||b||_2 over float vectors (NaN if any element is NaN).
double RelativeError(const std::vector<float>& out, const std::vector<float>& ref);

// Reads any float-like tensor (f32, f64, bf16; CPU or CUDA) into a float vector.
std::vector<float> ToFloatVector(const Tensor& t);

// Fills a CPU tensor (f32, f64, bf16) with N(0, scale^2) values from `rng`.
void FillRandom(const Tensor& t, std::mt19937_64& rng, float scale = 1.0f);

// A copy of a host buffer on CUDA device 0 (the copy's status is EXPECTed).
kernels::Buffer Upload(const kernels::Buffer& host);

// A CUDA-device-0 buffer filled with 0xFF bytes (NaN for floats): outputs are poisoned before a
// run so an element the op forgets to write cannot pass.
kernels::Buffer Poisoned(DType dtype, std::vector<int64_t> shape);

// EXPECTs RelativeError(got, want) < tol and prints the evidence (what, shape, error, tol).
void ExpectClose(const Tensor& got, const Tensor& want, double tol, const char* what);

}  // namespace switchyard::testing

#define SY_REQUIRE_GPU()                                                      \
  do {                                                                        \
    std::string sy_why_;                                                      \
    if (::switchyard::testing::CudaDeviceCount(&sy_why_) == 0)                \
      GTEST_SKIP() << "no CUDA device (" << sy_why_ << "): GPU test skipped"; \
  } while (0)

#endif  // SWITCHYARD_KERNELS_TESTING_GPU_H_
