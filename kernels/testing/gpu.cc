#include "kernels/testing/gpu.h"

#include <cmath>

#include "kernels/runtime/buffer.h"

namespace switchyard::testing {

int CudaDeviceCount(std::string* why) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why) *why = cudaGetErrorString(err);
    cudaGetLastError();
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount returned 0";
  return n;
}

double RelativeError(const std::vector<float>& out, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size() && i < ref.size(); ++i) {
    double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  if (out.size() != ref.size()) return NAN;
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

std::vector<float> ToFloatVector(const Tensor& t) {
  std::vector<uint8_t> host(t.bytes());
  Tensor h(t.dtype, t.shape, Device::Cpu(), host.data());
  if (!kernels::CopyTensor(t, h).ok()) return {};
  std::vector<float> out(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (t.dtype) {
      case DType::kF32:
        out[i] = h.as<float>()[i];
        break;
      case DType::kF64:
        out[i] = static_cast<float>(h.as<double>()[i]);
        break;
      case DType::kBF16:
        out[i] = h.as<BF16>()[i].ToFloat();
        break;
      case DType::kI32:
        out[i] = static_cast<float>(h.as<int32_t>()[i]);
        break;
      case DType::kI64:
        out[i] = static_cast<float>(h.as<int64_t>()[i]);
        break;
      default:
        out[i] = NAN;
    }
  }
  return out;
}

void FillRandom(const Tensor& t, std::mt19937_64& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) {
    float v = dist(rng);
    switch (t.dtype) {
      case DType::kF32:
        t.as<float>()[i] = v;
        break;
      case DType::kF64:
        t.as<double>()[i] = v;
        break;
      case DType::kBF16:
        t.as<BF16>()[i] = BF16::FromFloat(v);
        break;
      default:
        break;
    }
  }
}

kernels::Buffer Upload(const kernels::Buffer& host) {
  Tensor h = host.View();
  kernels::Buffer d = kernels::Buffer::ForTensor(h.dtype, h.shape, Device::Cuda(0)).value();
  EXPECT_TRUE(kernels::CopyTensor(h, d.View()).ok());
  return d;
}

kernels::Buffer Poisoned(DType dtype, std::vector<int64_t> shape) {
  kernels::Buffer d = kernels::Buffer::ForTensor(dtype, std::move(shape), Device::Cuda(0)).value();
  EXPECT_TRUE(kernels::FillBytes(d.View(), 0xFF).ok());
  return d;
}

void ExpectClose(const Tensor& got, const Tensor& want, double tol, const char* what) {
  const double err = RelativeError(ToFloatVector(got), ToFloatVector(want));
  std::printf("  %-22s %s: rel err %.3g (tol %.0e)\n", what, got.DebugString().c_str(), err, tol);
  EXPECT_LT(err, tol) << what << " " << got.DebugString();
}

}  // namespace switchyard::testing
