#include "coordinator/api/job_hub.h"

#include <utility>

namespace switchyard::api {

JobHub::JobHub(jobs::JobRegistry* registry, std::function<void()> on_restart)
    : registry_(registry), on_restart_(std::move(on_restart)) {}

absl::StatusOr<v1::Job> JobHub::Notify(absl::StatusOr<v1::Job> result) {
  if (result.ok()) {
    absl::MutexLock lock(&mu_);
    ++version_;
  }
  return result;
}

absl::StatusOr<v1::Job> JobHub::CreateJob(const v1::CreateJobRequest& request) {
  return Notify(registry_->CreateJob(request));
}

absl::StatusOr<v1::Job> JobHub::GetJob(absl::string_view name) { return registry_->GetJob(name); }

absl::StatusOr<v1::ListJobsResponse> JobHub::ListJobs(const v1::ListJobsRequest& request) {
  return registry_->ListJobs(request);
}

absl::StatusOr<v1::Job> JobHub::CancelJob(absl::string_view name) {
  return Notify(registry_->CancelJob(name));
}

absl::StatusOr<v1::Job> JobHub::Transition(absl::string_view name, jobs::State to,
                                           absl::string_view reason, absl::string_view message,
                                           const v1::Plan* plan) {
  absl::StatusOr<v1::Job> job = Notify(registry_->Transition(name, to, reason, message, plan));
  if (job.ok() && job->state() == v1::Job::RESTARTING && on_restart_) on_restart_();
  return job;
}

absl::Status JobHub::RecordLastStep(absl::string_view name, const v1::StepMetrics& step) {
  return registry_->RecordLastStep(name, step);
}

absl::StatusOr<v1::Job> JobHub::RecordCheckpoint(absl::string_view name, int64_t step) {
  return Notify(registry_->RecordCheckpoint(name, step));
}

absl::StatusOr<v1::Job> JobHub::RecordWaitReason(absl::string_view name, absl::string_view reason,
                                                 absl::string_view message) {
  return Notify(registry_->RecordWaitReason(name, reason, message));
}

absl::StatusOr<std::vector<v1::JobEvent>> JobHub::ListEvents(absl::string_view name) {
  return registry_->ListEvents(name);
}

uint64_t JobHub::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

uint64_t JobHub::WaitForChange(uint64_t seen, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto changed = [this, seen]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return version_ != seen || closed_; };
  mu_.AwaitWithTimeout(absl::Condition(&changed), timeout);
  return version_;
}

void JobHub::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

bool JobHub::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

}  // namespace switchyard::api
