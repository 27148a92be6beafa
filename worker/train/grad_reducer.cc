// File: worker/train/grad_reducer.cc
//
// Background gradient reduce-scatters overlapped with the backward pass.
#include "worker/train/grad_reducer.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "common/status.h"
#include "kernels/runtime/cuda_status.h"
#include "worker/model/profiling.h"

namespace switchyard::train {
namespace {
constexpr int kEvents = 64;  // more than the buckets of one step
}  // namespace

absl::StatusOr<std::unique_ptr<GradReducer>> GradReducer::Create(Device device,
                                                                 const Stream& grad_stream) {
  if (device.is_cuda() && (!grad_stream.is_cuda() || grad_stream.cuda_stream == nullptr)) {
    return absl::InvalidArgumentError("GradReducer: a CUDA device needs the reducer's stream");
  }
  std::unique_ptr<GradReducer> r(new GradReducer());
  r->device_ = device;
  r->grad_stream_ = device.is_cuda() ? grad_stream : Stream{device, nullptr};
  if (device.is_cuda()) {
    for (int i = 0; i < kEvents; ++i) {
      SY_ASSIGN_OR_RETURN(kernels::Event e, kernels::Event::Create(device));
      r->events_.push_back(std::move(e));
    }
  }
  r->thread_ = std::thread([p = r.get()] { p->Loop(); });
  return r;
}

GradReducer::~GradReducer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    queue_.clear();
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status GradReducer::Launch(const Stream& compute, const Job& job) {
  if (job.optimizer == nullptr) return absl::InvalidArgumentError("GradReducer: no optimizer");
  if (device_.is_cuda()) {
    // The reducer's stream waits for the kernels enqueued so far on the compute stream. Events
    // are reused round robin: Wait() runs every step, long before kEvents launches are pending.
    kernels::Event& e = events_[next_event_++ % events_.size()];
    SY_RETURN_IF_ERROR(kernels::StreamWaitStream(grad_stream_, compute, e));
  }
  absl::MutexLock lock(&mu_);
  queue_.push_back(job);
  ++launched_;
  return absl::OkStatus();
}

absl::Status GradReducer::Wait() {
  absl::Status st;
  std::vector<comm::Communicator*> used;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](GradReducer* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) {
          return r->queue_.empty() && r->running_ == 0;
        },
        this));
    st = error_;
    error_ = absl::OkStatus();
    used.swap(used_);
  }
  // The reducer thread is idle (nothing queued or running), so this thread may use the groups.
  // Their reduce-scatters were only enqueued: wait (bounded) for them to complete.
  for (comm::Communicator* g : used) {
    const absl::Status synced = g->Synchronize();
    if (st.ok() && !synced.ok()) st = synced;
  }
  return st;
}

void GradReducer::Loop() {
  if (device_.is_cuda()) cudaSetDevice(device_.index);
  const Stream stream = grad_stream_;
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](GradReducer* r)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) { return r->stop_ || !r->queue_.empty(); },
          this));
      if (stop_) return;
      job = queue_.front();
      queue_.pop_front();
      ++running_;
      if (!error_.ok()) {  // a failed communicator stays failed: skip the rest
        --running_;
        continue;
      }
    }
    comm::Communicator* group = job.group != nullptr ? job.group : job.optimizer->dp_group();
    {
      absl::MutexLock lock(&mu_);
      if (std::find(used_.begin(), used_.end(), group) == used_.end()) used_.push_back(group);
    }
    absl::Status st;
    {
      // NVTX only (no timer is active on this thread): the reduce-scatter in nsys's timeline.
      model::ScopedRange range(stream, "grad_reduce_scatter", job.bucket);
      st = job.optimizer->ReduceBucket(stream, job.grads, job.bucket, job.group);
    }
    absl::MutexLock lock(&mu_);
    --running_;
    if (!st.ok() && error_.ok()) error_ = st;
  }
}

}  // namespace switchyard::train
