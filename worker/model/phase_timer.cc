#include "worker/model/phase_timer.h"

#include <cuda_runtime.h>

#include "common/cuda_status.h"

namespace switchyard::model {

PhaseTimer::~PhaseTimer() {
  for (void* e : pool_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

absl::StatusOr<void*> PhaseTimer::NextEvent() {
  if (used_ == pool_.size()) {
    cudaEvent_t e;
    SY_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
    pool_.push_back(e);
  }
  return pool_[used_++];
}

absl::Status PhaseTimer::Start(const Stream& stream) {
  active_ = enabled_ && stream.is_cuda();
  if (!active_) return absl::OkStatus();
  used_ = 0;
  names_.clear();
  SY_ASSIGN_OR_RETURN(void* e, NextEvent());
  SY_CUDA_RETURN_IF_ERROR(
      cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(stream.cuda_stream)));
  return absl::OkStatus();
}

absl::Status PhaseTimer::Mark(const Stream& stream, const char* name) {
  if (!active_) return absl::OkStatus();
  SY_ASSIGN_OR_RETURN(void* e, NextEvent());
  SY_CUDA_RETURN_IF_ERROR(
      cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(stream.cuda_stream)));
  names_.push_back(name);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<std::string, float>>> PhaseTimer::Collect() {
  std::vector<std::pair<std::string, float>> out;
  if (!active_ || used_ < 2) return out;
  SY_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(static_cast<cudaEvent_t>(pool_[used_ - 1])));
  for (size_t i = 1; i < used_; ++i) {
    float ms = 0;
    SY_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(pool_[i - 1]),
                                                 static_cast<cudaEvent_t>(pool_[i])));
    out.emplace_back(names_[i - 1], ms);
  }
  return out;
}

}  // namespace switchyard::model
