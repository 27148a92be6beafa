// File: worker/model/phase_timer.h
//
// CUDA-event timing of named phases on one stream: Mark("fc1") after the work of phase "fc1" has
// been enqueued. Disabled (the default) or on the CPU it does nothing, so layers can mark their
// phases unconditionally. Times are read after the stream has finished (Collect synchronises).
#ifndef SWITCHYARD_WORKER_MODEL_PHASE_TIMER_H_
#define SWITCHYARD_WORKER_MODEL_PHASE_TIMER_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"

namespace switchyard::model {

class PhaseTimer {
 public:
  PhaseTimer() = default;
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;
  ~PhaseTimer();

  void Enable(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  // Starts a new measurement on `stream` (drops the previous marks).
  absl::Status Start(const Stream& stream);
  // Records the end of phase `name` (and the start of the next).
  absl::Status Mark(const Stream& stream, const char* name);
  // Milliseconds of each phase since Start, in order. Waits for the last mark.
  absl::StatusOr<std::vector<std::pair<std::string, float>>> Collect();

 private:
  absl::StatusOr<void*> NextEvent();

  bool enabled_ = false;
  bool active_ = false;
  std::vector<void*> pool_;  // cudaEvent_t, reused across measurements
  size_t used_ = 0;
  std::vector<std::string> names_;
};

}  // namespace switchyard::model

#endif  // SWITCHYARD_WORKER_MODEL_PHASE_TIMER_H_
