#include "worker/model/profiling.h"

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::model {
namespace {

thread_local PhaseTimer* active_timer = nullptr;
thread_local RangeRecorder* range_recorder = nullptr;

void NvtxPush(const char* name, int64_t index) {
  if (index < 0) {
    nvtxRangePushA(name);
  } else {
    nvtxEventAttributes_t a = {};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name;
    a.payloadType = NVTX_PAYLOAD_TYPE_INT64;
    a.payload.llValue = index;
    nvtxRangePushEx(&a);
  }
  if (range_recorder != nullptr) range_recorder->OnPush(name, index);
}

void NvtxPop() {
  nvtxRangePop();
  if (range_recorder != nullptr) range_recorder->OnPop();
}

}  // namespace

RangeRecorder* SetRangeRecorderForTesting(RangeRecorder* recorder) {
  RangeRecorder* old = range_recorder;
  range_recorder = recorder;
  return old;
}

PhaseTimer* PhaseTimer::Active() { return active_timer; }

PhaseTimer::~PhaseTimer() {
  if (active_timer == this) active_timer = nullptr;
}

void PhaseTimer::Fail(absl::Status st) {
  if (status_.ok()) status_ = std::move(st);
}

int PhaseTimer::RecordEvent(const Stream& stream) {
  if (used_ == pool_.size()) {
    // Only while the pool grows (the first step, or a step with more ranges than any before).
    absl::StatusOr<kernels::Event> e =
        kernels::Event::Create(stream.device, kernels::Event::Timing::kOn);
    if (!e.ok()) {
      Fail(e.status());
      return -1;
    }
    pool_.push_back(*std::move(e));
  }
  if (absl::Status st = pool_[used_].Record(stream); !st.ok()) {
    Fail(std::move(st));
    return -1;
  }
  return static_cast<int>(used_++);
}

absl::Status PhaseTimer::BeginStep(const Stream& stream) {
  if (in_step_) return absl::FailedPreconditionError("PhaseTimer::BeginStep: already in a step");
  if (active_timer != nullptr) {
    return absl::FailedPreconditionError(
        "PhaseTimer::BeginStep: another timer is active on this thread");
  }
  status_ = absl::OkStatus();
  records_.clear();  // keeps its capacity
  open_.clear();
  skipped_ = 0;
  used_ = 0;
  step_start_ = step_end_ = -1;
  device_ = stream.is_cuda();
  in_step_ = true;
  active_timer = this;
  if (device_) {
    step_start_ = RecordEvent(stream);
  } else {
    host_start_ = std::chrono::steady_clock::now();
  }
  return status_;
}

absl::Status PhaseTimer::EndStep(const Stream& stream) {
  if (!in_step_) return absl::FailedPreconditionError("PhaseTimer::EndStep: not in a step");
  if (device_) {
    step_end_ = RecordEvent(stream);
  } else {
    host_end_ = std::chrono::steady_clock::now();
  }
  in_step_ = false;
  if (active_timer == this) active_timer = nullptr;
  if (!open_.empty()) {
    Fail(absl::FailedPreconditionError(absl::StrCat("PhaseTimer::EndStep: range \"",
                                                    records_[open_.back()].name,
                                                    "\" is still open at the end of the step")));
  }
  return status_;
}

int PhaseTimer::Open(const Stream& stream, const char* name, int64_t index) {
  if (!in_step_ || !status_.ok()) return -1;
  if (skipped_ > 0 || (max_depth_ >= 0 && static_cast<int>(open_.size()) > max_depth_)) {
    ++skipped_;
    return kSkipped;
  }
  Record r;
  r.name = name;
  r.index = index;
  r.depth = static_cast<int>(open_.size());
  r.parent = open_.empty() ? -1 : open_.back();
  r.start_event = r.end_event = -1;
  if (device_ && stream.is_cuda()) {
    r.start_event = RecordEvent(stream);
    if (r.start_event < 0) return -1;
  } else {
    r.host_start = std::chrono::steady_clock::now();
  }
  records_.push_back(r);
  const int id = static_cast<int>(records_.size()) - 1;
  open_.push_back(id);
  return id;
}

void PhaseTimer::Close(const Stream& stream, int record) {
  if (record == kSkipped) {
    if (skipped_ > 0) --skipped_;
    return;
  }
  if (record < 0 || record >= static_cast<int>(records_.size())) return;
  Record& r = records_[record];
  if (open_.empty() || open_.back() != record) {
    Fail(absl::FailedPreconditionError(
        absl::StrCat("PhaseTimer: range \"", r.name, "\" closed while \"",
                     open_.empty() ? "(none)" : records_[open_.back()].name,
                     "\" is the innermost open range (ranges must nest)")));
    return;
  }
  open_.pop_back();
  if (r.start_event >= 0) {
    r.end_event = RecordEvent(stream);
  } else {
    r.host_end = std::chrono::steady_clock::now();
  }
}

absl::StatusOr<StepTiming> PhaseTimer::Resolve() {
  StepTiming t;
  SY_RETURN_IF_ERROR(ResolveInto(&t));
  return t;
}

absl::Status PhaseTimer::ResolveInto(StepTiming* out) {
  if (in_step_) return absl::FailedPreconditionError("PhaseTimer::Resolve: step not ended");
  SY_RETURN_IF_ERROR(status_);
  StepTiming& t = *out;
  t.ranges.clear();
  t.device = device_;
  auto host_ms = [](std::chrono::steady_clock::time_point a,
                    std::chrono::steady_clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  auto event_ms = [this](int a, int b) -> absl::StatusOr<double> {
    SY_ASSIGN_OR_RETURN(const float ms, pool_[b].ElapsedMsSince(pool_[a]));
    return static_cast<double>(ms);
  };
  if (device_) {
    if (step_start_ < 0 || step_end_ < 0) {
      return absl::FailedPreconditionError("PhaseTimer::Resolve: no step recorded");
    }
    // Already complete after the caller's synchronisation; this only guards against misuse.
    SY_RETURN_IF_ERROR(pool_[step_end_].Synchronize());
    SY_ASSIGN_OR_RETURN(t.step_ms, event_ms(step_start_, step_end_));
  } else {
    t.step_ms = host_ms(host_start_, host_end_);
  }
  for (const Record& r : records_) {
    TimedRange x;
    x.name = r.name;
    x.index = r.index;
    x.depth = r.depth;
    x.parent = r.parent;
    if (r.start_event >= 0) {
      SY_ASSIGN_OR_RETURN(x.ms, event_ms(r.start_event, r.end_event));
    } else {
      x.ms = host_ms(r.host_start, r.host_end);
    }
    t.ranges.push_back(x);
  }
  return absl::OkStatus();
}

ScopedRange::ScopedRange(const Stream& stream, const char* name, int64_t index)
    : stream_(stream), timer_(PhaseTimer::Active()), record_(-1) {
  NvtxPush(name, index);
  if (timer_ != nullptr) record_ = timer_->Open(stream, name, index);
}

ScopedRange::~ScopedRange() {
  // The timer may have ended its step meanwhile (a range outliving EndStep): Close ignores it
  // then, EndStep has already reported the range as open.
  if (timer_ != nullptr && timer_->in_step()) timer_->Close(stream_, record_);
  NvtxPop();
}

void PhaseSequence::Next(const char* name, int64_t index) {
  Close();
  NvtxPush(name, index);
  open_ = true;
  timer_ = PhaseTimer::Active();
  record_ = timer_ != nullptr ? timer_->Open(stream_, name, index) : -1;
}

void PhaseSequence::Close() {
  if (!open_) return;
  if (timer_ != nullptr && timer_->in_step()) timer_->Close(stream_, record_);
  NvtxPop();
  open_ = false;
  timer_ = nullptr;
  record_ = -1;
}

std::vector<PhaseTotal> SumByPath(const StepTiming& timing, int max_depth) {
  std::vector<PhaseTotal> totals;
  AccumulateByPath(timing, &totals);
  if (max_depth >= 0) {
    std::vector<PhaseTotal> kept;
    for (PhaseTotal& p : totals) {
      if (p.depth <= max_depth) kept.push_back(std::move(p));
    }
    return kept;
  }
  return totals;
}

void AccumulateByPath(const StepTiming& timing, std::vector<PhaseTotal>* totals) {
  std::vector<std::string> paths(timing.ranges.size());
  for (size_t i = 0; i < timing.ranges.size(); ++i) {
    const TimedRange& r = timing.ranges[i];
    paths[i] = r.parent < 0 ? std::string(r.name) : absl::StrCat(paths[r.parent], "/", r.name);
    PhaseTotal* row = nullptr;
    for (PhaseTotal& p : *totals) {
      if (p.path == paths[i]) {
        row = &p;
        break;
      }
    }
    if (row == nullptr) {
      totals->push_back({paths[i], r.depth, 0.0, 0});
      row = &totals->back();
    }
    row->ms += r.ms;
    ++row->count;
  }
}

}  // namespace switchyard::model
