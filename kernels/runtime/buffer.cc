#include "kernels/runtime/buffer.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels {
namespace {

struct Counters {
  std::atomic<int64_t> current{0}, peak{0}, allocations{0};
};

Counters& CountersOf(DeviceType type) {
  static Counters cpu, cuda;
  return type == DeviceType::kCuda ? cuda : cpu;
}

void CountAllocation(DeviceType type, size_t bytes) {
  Counters& c = CountersOf(type);
  const int64_t now = c.current.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed) +
                      static_cast<int64_t>(bytes);
  c.allocations.fetch_add(1, std::memory_order_relaxed);
  int64_t peak = c.peak.load(std::memory_order_relaxed);
  while (now > peak && !c.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void CountRelease(DeviceType type, size_t bytes) {
  CountersOf(type).current.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
}

}  // namespace

BufferMemoryStats BufferMemory(DeviceType type) {
  const Counters& c = CountersOf(type);
  BufferMemoryStats s;
  s.current_bytes = c.current.load(std::memory_order_relaxed);
  s.peak_bytes = c.peak.load(std::memory_order_relaxed);
  s.allocations = c.allocations.load(std::memory_order_relaxed);
  return s;
}

void ResetBufferPeak(DeviceType type) {
  Counters& c = CountersOf(type);
  c.peak.store(c.current.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

absl::StatusOr<int64_t> DeviceMemoryInUse(int device) {
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  size_t free_b = 0, total_b = 0;
  SY_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<int64_t>(total_b - free_b);
}

absl::StatusOr<Buffer> Buffer::Allocate(Device device, size_t bytes) {
  Buffer b;
  b.device_ = device;
  b.bytes_ = bytes;
  b.shape_ = {static_cast<int64_t>(bytes)};
  if (bytes == 0) return b;
  if (device.is_cuda()) {
    SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(device.index));
    SY_CUDA_RETURN_IF_ERROR(cudaMalloc(&b.data_, bytes));
  } else {
    b.data_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (b.data_ == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("host allocation of ", bytes, " bytes"));
    }
  }
  CountAllocation(device.type, bytes);
  return b;
}

absl::StatusOr<Buffer> Buffer::ForTensor(DType dtype, std::vector<int64_t> shape, Device device) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) return absl::InvalidArgumentError("negative extent in tensor shape");
    n *= s;
  }
  SY_ASSIGN_OR_RETURN(Buffer b, Allocate(device, static_cast<size_t>(n) * DTypeSize(dtype)));
  b.dtype_ = dtype;
  b.shape_ = std::move(shape);
  return b;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    Release();
    data_ = o.data_;
    bytes_ = o.bytes_;
    device_ = o.device_;
    dtype_ = o.dtype_;
    shape_ = std::move(o.shape_);
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

Buffer::~Buffer() { Release(); }

void Buffer::Release() {
  if (data_ != nullptr) {
    if (device_.is_cuda()) {
      cudaFree(data_);
    } else {
      std::free(data_);
    }
    CountRelease(device_.type, bytes_);
  }
  data_ = nullptr;
  bytes_ = 0;
}

Tensor Buffer::View(DType dtype, std::vector<int64_t> shape) const {
  Tensor t(dtype, std::move(shape), device_, data_);
  return t.bytes() <= bytes_ ? t : Tensor();
}

absl::Status CopyTensor(const Tensor& src, const Tensor& dst) {
  if (src.dtype != dst.dtype || src.numel() != dst.numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyTensor: ", src.DebugString(), " -> ", dst.DebugString()));
  }
  if (src.bytes() == 0) return absl::OkStatus();
  if (!src.device.is_cuda() && !dst.device.is_cuda()) {
    std::memcpy(dst.data, src.data, src.bytes());
    return absl::OkStatus();
  }
  SY_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst.data, src.data, src.bytes(), cudaMemcpyDefault));
  return absl::OkStatus();
}

absl::Status FillBytes(const Tensor& t, uint8_t byte) {
  if (t.bytes() == 0) return absl::OkStatus();
  if (t.device.is_cuda()) {
    SY_CUDA_RETURN_IF_ERROR(cudaMemset(t.data, byte, t.bytes()));
    SY_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  } else {
    std::memset(t.data, byte, t.bytes());
  }
  return absl::OkStatus();
}

}  // namespace switchyard::kernels
