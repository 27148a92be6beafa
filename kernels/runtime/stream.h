// File: kernels/runtime/stream.h
//
// Typed, owning CUDA streams and events (RAII): the worker's streams and events are created and
// destroyed through these (the exceptions: NcclCommunicator's internal event pool and stream,
// worker/comm, and the multi-process benchmarks' per-rank streams). `OwnedStream` creates a
// non-blocking stream on one device and hands out the non-owning `Stream` (common/tensor.h) that
// ops and communicators take; `Event` records a point on a stream, makes another stream wait for
// it, and measures the device time between two events.
//
// On the CPU both are inert, by design rather than by omission: a CPU `Stream` is the calling
// thread, so everything issued on it has completed when the call returns. Recording, waiting and
// synchronising are no-ops there, an event is always complete, and its elapsed time is 0 (host
// timing lives in worker/model/profiling.h). Code that forks work onto a side stream and joins it
// back is therefore written once for both devices.
//
// Both are move-only; destruction releases the CUDA object (errors there are ignored: a destructor
// cannot report them, and a sticky device error resurfaces at the next checked call).
#ifndef SWITCHYARD_KERNELS_RUNTIME_STREAM_H_
#define SWITCHYARD_KERNELS_RUNTIME_STREAM_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tensor.h"

struct CUevent_st;  // cudaEvent_t is CUevent_st* (cuda_runtime_api.h)

namespace switchyard::kernels {

class OwnedStream {
 public:
  // A stream on `device`: for CUDA, created with cudaStreamNonBlocking (it never synchronises
  // implicitly with the legacy default stream). The caller's current device is left as it was.
  static absl::StatusOr<OwnedStream> Create(Device device);

  OwnedStream() = default;
  OwnedStream(OwnedStream&& o) noexcept { *this = std::move(o); }
  OwnedStream& operator=(OwnedStream&& o) noexcept;
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  ~OwnedStream();

  // The non-owning handle ops take; valid while this object lives.
  const Stream& view() const { return stream_; }
  // Blocks the host until everything issued on the stream so far has completed.
  absl::Status Synchronize() const;

 private:
  void Reset();
  Stream stream_;
};

class Event {
 public:
  enum class Timing { kOff, kOn };  // kOn: ElapsedMs works (timing costs a little per record)

  // An event of `device` (the caller's current device is left as it was).
  static absl::StatusOr<Event> Create(Device device, Timing timing = Timing::kOff);

  Event() = default;
  Event(Event&& o) noexcept { *this = std::move(o); }
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  // Marks the current end of `stream`'s work.
  absl::Status Record(const Stream& stream);
  // Orders `stream`'s later work after the recorded point, without blocking the host.
  absl::Status MakeWait(const Stream& stream) const;
  // Blocks the host until the recorded point has completed.
  absl::Status Synchronize() const;
  // Whether the recorded point has completed (an event never recorded counts as complete).
  absl::StatusOr<bool> Done() const;
  // Device milliseconds from `start`'s recorded point to this one; both need Timing::kOn.
  absl::StatusOr<float> ElapsedMsSince(const Event& start) const;

  // The CUDA handle (a cudaEvent_t), for the few places that talk to a CUDA API themselves
  // (NCCL communicators); nullptr on the CPU.
  CUevent_st* cuda_event() const { return event_; }
  bool is_cuda() const { return device_.is_cuda(); }

 private:
  void Reset();
  Device device_;
  CUevent_st* event_ = nullptr;
};

// Orders `waiter`'s later work after everything issued so far on `producer` (a fork or a join
// between two streams of one device), recording `via` on `producer`.
absl::Status StreamWaitStream(const Stream& waiter, const Stream& producer, Event& via);

// A second stream of one device with its fork and join events, for work that overlaps the main
// stream's: Fork(main) orders the side stream after main's work so far, work is issued on view(),
// then Join(main) orders main's later work after it. RecordJoin / WaitJoin split the join when
// main must go on issuing work before it needs the side's result.
class SideStream {
 public:
  static absl::StatusOr<SideStream> Create(Device device);

  const Stream& view() const { return stream_.view(); }
  absl::Status Fork(const Stream& main) { return StreamWaitStream(view(), main, fork_); }
  absl::Status RecordJoin() { return join_.Record(view()); }
  absl::Status WaitJoin(const Stream& main) const { return join_.MakeWait(main); }
  absl::Status Join(const Stream& main) { return StreamWaitStream(main, view(), join_); }

 private:
  OwnedStream stream_;
  Event fork_, join_;
};

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_RUNTIME_STREAM_H_
