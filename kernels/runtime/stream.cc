#include "kernels/runtime/stream.h"

#include <cuda_runtime.h>

#include <utility>

#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels {
namespace {

// Makes `device` current for a scope and restores the caller's device after it, so that creating
// a stream or an event never changes which device the caller's later calls go to.
class ScopedDevice {
 public:
  absl::Status Enter(int device) {
    SY_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous_));
    SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    entered_ = true;
    return absl::OkStatus();
  }
  ~ScopedDevice() {
    if (entered_) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool entered_ = false;
};

}  // namespace

absl::StatusOr<OwnedStream> OwnedStream::Create(Device device) {
  OwnedStream s;
  s.stream_.device = device;
  if (device.is_cuda()) {
    ScopedDevice scope;
    SY_RETURN_IF_ERROR(scope.Enter(device.index));
    cudaStream_t raw = nullptr;
    SY_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
    s.stream_.cuda_stream = raw;
  }
  return s;
}

OwnedStream& OwnedStream::operator=(OwnedStream&& o) noexcept {
  if (this != &o) {
    Reset();
    stream_ = std::exchange(o.stream_, Stream{});
  }
  return *this;
}

OwnedStream::~OwnedStream() { Reset(); }

void OwnedStream::Reset() {
  if (stream_.cuda_stream != nullptr) (void)cudaStreamDestroy(stream_.cuda_stream);
  stream_ = Stream{};
}

absl::Status OwnedStream::Synchronize() const {
  if (stream_.is_cuda()) SY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.cuda_stream));
  return absl::OkStatus();
}

absl::StatusOr<Event> Event::Create(Device device, Timing timing) {
  Event e;
  e.device_ = device;
  if (device.is_cuda()) {
    ScopedDevice scope;
    SY_RETURN_IF_ERROR(scope.Enter(device.index));
    cudaEvent_t raw = nullptr;
    SY_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(
        &raw, timing == Timing::kOn ? cudaEventDefault : cudaEventDisableTiming));
    e.event_ = raw;
  }
  return e;
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    Reset();
    device_ = o.device_;
    event_ = std::exchange(o.event_, nullptr);
  }
  return *this;
}

Event::~Event() { Reset(); }

void Event::Reset() {
  if (event_ != nullptr) (void)cudaEventDestroy(event_);
  event_ = nullptr;
}

absl::Status Event::Record(const Stream& stream) {
  if (event_ != nullptr) SY_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream.cuda_stream));
  return absl::OkStatus();
}

absl::Status Event::MakeWait(const Stream& stream) const {
  if (event_ != nullptr) {
    SY_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream.cuda_stream, event_, 0));
  }
  return absl::OkStatus();
}

absl::Status Event::Synchronize() const {
  if (event_ != nullptr) SY_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
  return absl::OkStatus();
}

absl::StatusOr<bool> Event::Done() const {
  if (event_ == nullptr) return true;
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaErrorNotReady) return false;
  SY_CUDA_RETURN_IF_ERROR(err);
  return true;
}

absl::StatusOr<float> Event::ElapsedMsSince(const Event& start) const {
  if (event_ == nullptr || start.event_ == nullptr) return 0.0f;
  float ms = 0;
  SY_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

absl::Status StreamWaitStream(const Stream& waiter, const Stream& producer, Event& via) {
  SY_RETURN_IF_ERROR(via.Record(producer));
  return via.MakeWait(waiter);
}

absl::StatusOr<SideStream> SideStream::Create(Device device) {
  SideStream s;
  SY_ASSIGN_OR_RETURN(s.stream_, OwnedStream::Create(device));
  SY_ASSIGN_OR_RETURN(s.fork_, Event::Create(device));
  SY_ASSIGN_OR_RETURN(s.join_, Event::Create(device));
  return s;
}

}  // namespace switchyard::kernels
