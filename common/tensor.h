// File: common/tensor.h
//
// `Tensor`: a non-owning view {dtype, shape, device, data} of dense row-major memory, and
// `Stream`: where an op runs (the CPU, or a CUDA stream). Ops are free functions
// `absl::Status Op(const Stream&, inputs..., outputs...)`; the device of the tensors selects the
// CPU reference or the CUDA implementation. This header needs no CUDA: a CUDA stream is carried
// as an opaque pointer. Owning buffers live in kernels/runtime/buffer.h.
#ifndef SWITCHYARD_COMMON_TENSOR_H_
#define SWITCHYARD_COMMON_TENSOR_H_

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

struct CUstream_st;  // cudaStream_t is CUstream_st* (cuda_runtime_api.h)

namespace switchyard {

enum class DType : uint8_t { kF32, kF64, kBF16, kF16, kI32, kI64, kU8, kBool };

size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);

// bfloat16 storage on the host: the upper half of an IEEE float. Conversion from float rounds to
// nearest even (NaN stays NaN), matching __float2bfloat16_rn on the device.
struct BF16 {
  uint16_t bits = 0;
  static BF16 FromFloat(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    BF16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      b.bits = static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    } else {
      b.bits = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return b;
  }
  float ToFloat() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
static_assert(sizeof(BF16) == 2, "BF16 must be 2 bytes");

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;
  static Device Cpu() { return {DeviceType::kCpu, 0}; }
  static Device Cuda(int i) { return {DeviceType::kCuda, i}; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string ToString() const;
};

// Where an op runs. For CUDA, `cuda_stream` IS a cudaStream_t (the runtime's
// `typedef struct CUstream_st* cudaStream_t`, declared above so that common/ needs no CUDA
// header; nullptr = the legacy default stream): no cast anywhere. Not owning; cheap to copy;
// kernels::OwnedStream (kernels/runtime/stream.h) creates and destroys the streams.
struct Stream {
  Device device;
  CUstream_st* cuda_stream = nullptr;
  static Stream Cpu() { return {Device::Cpu(), nullptr}; }
  bool is_cuda() const { return device.is_cuda(); }
};

// A dense, row-major, non-owning view. Shapes are at most 8-dimensional.
struct Tensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  Device device;
  void* data = nullptr;

  Tensor() = default;
  Tensor(DType dt, std::vector<int64_t> s, Device dev, void* d)
      : dtype(dt), shape(std::move(s)), device(dev), data(d) {}

  int rank() const { return static_cast<int>(shape.size()); }
  int64_t dim(int i) const { return shape[i < 0 ? i + rank() : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  size_t bytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  std::string DebugString() const;  // "bf16[8,16]@cuda:0"
};

// Element i of a CPU float tensor (f32, f64, bf16) as a double; NaN for other dtypes. For CPU
// reference code, which computes in fp64 and rounds once on store.
inline double LoadAsDouble(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32:
      return t.as<float>()[i];
    case DType::kF64:
      return t.as<double>()[i];
    case DType::kBF16:
      return t.as<BF16>()[i].ToFloat();
    default:
      return __builtin_nan("");
  }
}

// Stores `v` into element i of a CPU float tensor, rounding once to its dtype (bf16: to nearest
// even); other dtypes are left untouched.
inline void StoreFromDouble(const Tensor& t, int64_t i, double v) {
  switch (t.dtype) {
    case DType::kF32:
      t.as<float>()[i] = static_cast<float>(v);
      break;
    case DType::kF64:
      t.as<double>()[i] = v;
      break;
    case DType::kBF16:
      t.as<BF16>()[i] = BF16::FromFloat(static_cast<float>(v));
      break;
    default:
      break;
  }
}

// Checks that `t` has `dtype` and rank/shape `shape` (-1 matches any extent). The error names
// `what` (e.g. "router.logits") and both shapes.
absl::Status CheckTensor(const Tensor& t, absl::string_view what, DType dtype,
                         std::initializer_list<int64_t> shape);
// Checks that all tensors live on `device`.
absl::Status CheckDevice(const Stream& stream, std::initializer_list<const Tensor*> tensors);

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_TENSOR_H_
