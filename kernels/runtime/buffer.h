// File: kernels/runtime/buffer.h
//
// `Buffer`: owning, contiguous memory on the CPU or one CUDA device, from which `Tensor` views
// are taken. Allocation is a plan-time act (STYLE.md rule 5): ops never allocate.
#ifndef SWITCHYARD_KERNELS_RUNTIME_BUFFER_H_
#define SWITCHYARD_KERNELS_RUNTIME_BUFFER_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"

namespace switchyard::kernels {

// Owns `bytes` of memory on `device`. Move-only. Freed on destruction (cudaFree for CUDA).
class Buffer {
 public:
  static absl::StatusOr<Buffer> Allocate(Device device, size_t bytes);
  // A buffer holding one tensor of `dtype`/`shape`.
  static absl::StatusOr<Buffer> ForTensor(DType dtype, std::vector<int64_t> shape, Device device);

  Buffer() = default;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  // The whole buffer viewed as `dtype`/`shape` (must fit). Empty shape: the ForTensor shape.
  Tensor View() const { return Tensor(dtype_, shape_, device_, data_); }
  Tensor View(DType dtype, std::vector<int64_t> shape) const;

 private:
  void Release();  // frees the memory; the object stays valid (empty)

  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  DType dtype_ = DType::kU8;
  std::vector<int64_t> shape_;
};

// Copies `src` into `dst` (same dtype and element count; any devices). Synchronous.
absl::Status CopyTensor(const Tensor& src, const Tensor& dst);

// Fills `t` with `byte` in every byte (used to poison outputs in tests). Synchronous.
absl::Status FillBytes(const Tensor& t, uint8_t byte);

// Process-wide accounting of the memory Buffers hold, so a test can see what the engine
// allocates without a GPU (the planner's memory model is checked against it). Bytes are the
// requested sizes (not the allocator's rounding), CPU and CUDA apart, all CUDA devices together;
// memory allocated outside Buffer (cuBLAS, NCCL, cudaMallocHost) is not seen. Updated with
// relaxed atomics on every allocation and release: cheap, any thread.
struct BufferMemoryStats {
  int64_t current_bytes = 0;  // held now
  int64_t peak_bytes = 0;     // most held at once since the start or the last ResetBufferPeak
  int64_t allocations = 0;    // successful non-empty allocations since the start
};
BufferMemoryStats BufferMemory(DeviceType type);
// Sets the peak of `type` to its current value (start of a measured phase).
void ResetBufferPeak(DeviceType type);

// Device memory in use on CUDA device `device` by every process and allocator (cudaMemGetInfo's
// total - free), bytes. The way the benchmarks and the workers measure a run's footprint: the
// difference of two readings around what they create. Makes `device` current on this thread.
absl::StatusOr<int64_t> DeviceMemoryInUse(int device);

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_RUNTIME_BUFFER_H_
