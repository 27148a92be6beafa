// File: worker/model/profiling.h
//
// NVTX ranges and device-side timing of the training step's phases.
//
//   PhaseTimer timer;                                  // one per trainer (or benchmark)
//   SY_RETURN_IF_ERROR(timer.BeginStep(stream));       // makes it this thread's active timer
//   { ScopedRange r(stream, "forward_backward"); ... { ScopedRange l(stream, "layer.fwd", 3); } }
//   SY_RETURN_IF_ERROR(timer.EndStep(stream));
//   ... the step's final host synchronisation (the trainer reads its statistics) ...
//   SY_ASSIGN_OR_RETURN(StepTiming t, timer.Resolve());  // t.step_ms, t.ranges
//
// ScopedRange always pushes an NVTX range (nvtxRangePushA / nvtxRangePushEx with the index as
// payload; NVTX 3 is header-only and costs a branch when no tool such as Nsight Systems is
// attached) and pops it in its destructor, so every range pushed is popped on every return path,
// errors included. When a PhaseTimer is active on the calling thread (between BeginStep and
// EndStep) the range is also timed: on a CUDA stream by a pair of CUDA events recorded on that
// stream, on a CPU stream by the host's steady clock (CPU ops are synchronous, so the host clock
// measures the work). Layers therefore mark their phases unconditionally; without an active timer
// a range is only the NVTX push and pop.
//
// What PhaseTimer promises:
// - No synchronisation during a step: BeginStep, ranges and EndStep only record events. Resolve
//   reads them after the step's final synchronisation (it waits on the step's end event, which
//   has already completed when the caller synchronised; that wait is the only blocking call).
// - No per-step allocation or event creation in steady state: events come from a pool that grows
//   while the first step(s) run (cudaEventCreate once per event, never again) and the range
//   records are a vector that keeps its capacity. `events_created()` exposes the pool size so a
//   test can check that step 2 creates nothing.
// - Ranges nest (LIFO). A range closed out of order, or a step ended with ranges still open, is
//   a FailedPrecondition from EndStep/Resolve naming the range; a CUDA error while recording is
//   kept and returned by EndStep/Resolve (a destructor cannot return it).
// - Ranges on one stream are sequential, so the children of a range add up to no more than the
//   range, and the top-level ranges to no more than the step (events are stream-ordered: a range
//   on another stream is timed on that stream, and may overlap its siblings).
//
// Threads: a PhaseTimer is used by one thread at a time; "active" is per thread (a
// communication thread's ranges are NVTX only). The NVTX range stack is per thread too.
#ifndef SWITCHYARD_WORKER_MODEL_PROFILING_H_
#define SWITCHYARD_WORKER_MODEL_PROFILING_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "kernels/runtime/stream.h"

namespace switchyard::model {

// One timed range of a resolved step.
struct TimedRange {
  const char* name = "";  // the string literal given to ScopedRange
  int64_t index = -1;     // layer / micro-batch index, or -1
  int depth = 0;          // 0 = top level inside the step
  int parent = -1;        // index into StepTiming::ranges, -1 at top level
  double ms = 0;
};

// The durations of one step, in the order the ranges were opened.
struct StepTiming {
  bool device = false;  // CUDA events (true) or host clock (false)
  double step_ms = 0;   // BeginStep .. EndStep
  std::vector<TimedRange> ranges;
};

// One row of a breakdown: ranges with the same path of names (indices ignored) summed, e.g.
// "forward_backward/layer.fwd/attention" over every layer and micro-batch.
struct PhaseTotal {
  std::string path;
  int depth = 0;
  double ms = 0;
  int64_t count = 0;
};
// Totals by path in first-seen order; rows with `depth <= max_depth` only (-1: all).
std::vector<PhaseTotal> SumByPath(const StepTiming& timing, int max_depth = -1);
// Adds `timing`'s totals into `totals` (same paths merged), for breakdowns over several steps.
void AccumulateByPath(const StepTiming& timing, std::vector<PhaseTotal>* totals);

class PhaseTimer {
 public:
  PhaseTimer() = default;
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;
  ~PhaseTimer();

  // Starts a step on `stream` (its device decides CUDA events or host clock), drops the previous
  // step's ranges and makes this the calling thread's active timer. Precondition: no other timer
  // is active on this thread and this one is not in a step.
  absl::Status BeginStep(const Stream& stream);
  // Records the end of the step on `stream` and deactivates the timer. Returns the first error
  // of the step's recording (CUDA error, ranges out of order or still open).
  absl::Status EndStep(const Stream& stream);
  // Durations of the last step. Precondition: EndStep returned OK and the caller has
  // synchronised with the step's end (else this waits for it).
  absl::StatusOr<StepTiming> Resolve();
  // The same into `*out`, reusing its capacity (no allocation once it has held a step's ranges).
  absl::Status ResolveInto(StepTiming* out);

  // Ranges nested deeper than `depth` (0 = top level only) are NVTX-only: not timed, no events.
  // The trainer times its top-level sections every step (a handful of events) and everything
  // (-1, the default) only for a breakdown.
  void set_max_depth(int depth) { max_depth_ = depth; }

  bool in_step() const { return in_step_; }
  // CUDA events created so far (the pool never shrinks; constant once the steps repeat).
  int64_t events_created() const { return static_cast<int64_t>(pool_.size()); }

  // The calling thread's active timer, or nullptr.
  static PhaseTimer* Active();

 private:
  friend class ScopedRange;
  friend class PhaseSequence;
  struct Record {
    const char* name;
    int64_t index;
    int depth;
    int parent;
    int start_event, end_event;  // pool indices (CUDA), -1 on the CPU
    std::chrono::steady_clock::time_point host_start, host_end;
  };
  // Opens a range; returns its record index (-1 if it could not be recorded).
  int Open(const Stream& stream, const char* name, int64_t index);
  void Close(const Stream& stream, int record);
  // Records a pooled event on `stream`; returns its pool index or -1 (error kept in status_).
  int RecordEvent(const Stream& stream);
  void Fail(absl::Status st);

  static constexpr int kSkipped = -2;  // Open's result for a range below max_depth_

  bool in_step_ = false, device_ = false;
  int max_depth_ = -1;
  int skipped_ = 0;  // open ranges below max_depth_ (always the innermost ones)
  absl::Status status_;
  std::vector<kernels::Event> pool_;  // timing events, created once, reused every step
  size_t used_ = 0;                   // events used this step
  int step_start_ = -1, step_end_ = -1;
  std::chrono::steady_clock::time_point host_start_, host_end_;
  std::vector<Record> records_;
  std::vector<int> open_;  // stack of open record indices
};

// NVTX range (always) + timed range (when a PhaseTimer is active on this thread). `name` must be
// a string literal (or outlive the step); `index` (a layer or micro-batch number, -1 for none)
// is the NVTX payload and a field of the timed range, so names stay static and nothing is
// formatted on the hot path.
class ScopedRange {
 public:
  ScopedRange(const Stream& stream, const char* name, int64_t index = -1);
  ~ScopedRange();
  ScopedRange(const ScopedRange&) = delete;
  ScopedRange& operator=(const ScopedRange&) = delete;

 private:
  const Stream stream_;
  PhaseTimer* timer_;
  int record_;
};

// A sequence of sibling phases: Next("b") closes the current phase and opens "b"; the
// destructor (or Close) closes the last one. For straight-line code whose phases follow one
// another without a block each (the MoE layer's forward). Same NVTX and timing as ScopedRange.
class PhaseSequence {
 public:
  explicit PhaseSequence(const Stream& stream) : stream_(stream) {}
  ~PhaseSequence() { Close(); }
  PhaseSequence(const PhaseSequence&) = delete;
  PhaseSequence& operator=(const PhaseSequence&) = delete;
  void Next(const char* name, int64_t index = -1);
  void Close();

 private:
  const Stream stream_;
  PhaseTimer* timer_ = nullptr;
  int record_ = -1;
  bool open_ = false;
};

// Test hook: observes every NVTX push and pop made through ScopedRange / PhaseSequence on the
// calling thread (in addition to the NVTX calls). Install with SetRangeRecorderForTesting.
class RangeRecorder {
 public:
  virtual ~RangeRecorder() = default;
  virtual void OnPush(const char* name, int64_t index) = 0;
  virtual void OnPop() = 0;
};
// Installs `recorder` for the calling thread (nullptr removes it); returns the previous one.
RangeRecorder* SetRangeRecorderForTesting(RangeRecorder* recorder);

}  // namespace switchyard::model

#endif  // SWITCHYARD_WORKER_MODEL_PROFILING_H_
