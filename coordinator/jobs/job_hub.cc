#include "coordinator/jobs/job_hub.h"

#include <sys/stat.h>
#include <sys/types.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "coordinator/jobs/job_state.h"

namespace switchyard::jobs {

JobHub::JobHub(jobs::JobRegistry* registry, TransitionCallback on_transition,
               std::string checkpoint_root, bool make_job_directories)
    : registry_(registry),
      on_transition_(std::move(on_transition)),
      checkpoint_root_(std::move(checkpoint_root)),
      make_job_directories_(make_job_directories) {}

absl::StatusOr<v1::Job> JobHub::Notify(absl::StatusOr<v1::Job> result) {
  if (result.ok()) {
    absl::MutexLock lock(&mu_);
    ++version_;
  }
  return result;
}

absl::StatusOr<v1::Job> JobHub::CreateJob(const v1::CreateJobRequest& request) {
  if (!make_job_directories_ || checkpoint_root_.empty()) {
    return Notify(registry_->CreateJob(request));
  }
  // The job's directory is made inside the store transaction that creates the job, so a job
  // never exists without it and a directory that cannot be made leaves no job behind.
  std::string made;  // the directory this call created, removed again if the commit fails
  auto make_directory = [&](int64_t id) -> absl::Status {
    const std::string jobs_dir = absl::StrCat(checkpoint_root_, "/jobs");
    const std::string dir = jobs::JobCheckpointDir(checkpoint_root_, id);
    for (const std::string& d : {checkpoint_root_, jobs_dir, dir}) {
      if (::mkdir(d.c_str(), 0700) == 0) {
        if (d == dir) made = dir;
        continue;
      }
      const int error = errno;
      struct stat st;
      if (error == EEXIST && ::stat(d.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;
      const std::string why =
          error == EEXIST ? "it exists and is not a directory" : std::strerror(error);
      SY_LOG(ERROR) << "CreateJob: cannot create the checkpoint directory " << d << ": " << why;
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create the job's checkpoint directory ", d, " (", why,
                       "): check --checkpoint-root (", checkpoint_root_,
                       ") exists and is writable by the coordinator; no job was created"));
    }
    return absl::OkStatus();
  };
  absl::StatusOr<v1::Job> job = registry_->CreateJob(request, make_directory);
  if (!job.ok() && !made.empty()) ::rmdir(made.c_str());
  return Notify(std::move(job));
}

absl::StatusOr<v1::Job> JobHub::GetJob(absl::string_view name) {
  absl::StatusOr<v1::Job> job = registry_->GetJob(name);
  if (job.ok()) FillQueueStatus(&*job);
  return job;
}

absl::StatusOr<v1::ListJobsResponse> JobHub::ListJobs(const v1::ListJobsRequest& request) {
  absl::StatusOr<v1::ListJobsResponse> page = registry_->ListJobs(request);
  if (page.ok()) {
    for (v1::Job& job : *page->mutable_jobs()) FillQueueStatus(&job);
  }
  return page;
}

void JobHub::SetQueueState(std::map<std::string, v1::QueueStatus> waiting,
                           std::vector<QueueUsage> usage) {
  absl::MutexLock lock(&queue_mu_);
  waiting_ = std::move(waiting);
  usage_ = std::move(usage);
}

std::vector<JobHub::QueueUsage> JobHub::QueueState() const {
  absl::MutexLock lock(&queue_mu_);
  return usage_;
}

void JobHub::FillQueueStatus(v1::Job* job) const {
  job->clear_queue_status();
  // Only a job that still waits: the snapshot is one pass old, and a job that started or ended
  // since must not show a stale position.
  if (job->state() != v1::Job::PENDING && job->state() != v1::Job::RESTARTING) return;
  absl::MutexLock lock(&queue_mu_);
  auto it = waiting_.find(job->name());
  if (it != waiting_.end()) *job->mutable_queue_status() = it->second;
}

absl::StatusOr<v1::Job> JobHub::CancelJob(absl::string_view name) {
  return Notify(registry_->CancelJob(name));
}

absl::StatusOr<v1::Job> JobHub::Transition(absl::string_view name, jobs::State to,
                                           absl::string_view reason, absl::string_view message,
                                           const v1::Plan* plan) {
  absl::StatusOr<v1::Job> job = Notify(registry_->Transition(name, to, reason, message, plan));
  if (job.ok() && on_transition_) on_transition_(*job, reason);
  return job;
}

absl::Status JobHub::RecordLastStep(absl::string_view name, const v1::StepMetrics& step) {
  return registry_->RecordLastStep(name, step);
}

absl::Status JobHub::RecordLastValidation(absl::string_view name, const v1::StepMetrics& step) {
  return registry_->RecordLastValidation(name, step);
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

absl::Status JobHub::DeleteJob(const v1::DeleteJobRequest& request) {
  absl::StatusOr<v1::Job> job = registry_->GetJob(request.name());
  if (job.status().code() == absl::StatusCode::kNotFound && request.allow_missing()) {
    return absl::OkStatus();
  }
  SY_RETURN_IF_ERROR(job.status());
  if (!jobs::IsTerminal(job->state())) {
    // The registry refuses it too (inside its transaction); checked here so that no checkpoint is
    // removed for a job that stays.
    return registry_->DeleteJob(request.name()).status();
  }
  if (request.delete_checkpoints()) {
    if (checkpoint_root_.empty()) {
      return absl::FailedPreconditionError(
          "delete_checkpoints: this coordinator has no checkpoint root (--checkpoint-root)");
    }
    SY_ASSIGN_OR_RETURN(int64_t id, jobs::ParseJobName(request.name()));
    const std::string dir = jobs::JobCheckpointDir(checkpoint_root_, id);
    {
      std::error_code error;
      const std::uintmax_t removed = std::filesystem::remove_all(dir, error);
      if (error) {
        SY_LOG(ERROR) << request.name() << ": cannot remove checkpoint directory " << dir << ": "
                      << error.message();
        return absl::InternalError(absl::StrCat(request.name(),
                                                ": cannot remove its checkpoint directory ", dir,
                                                " (", error.message(), "); the job was kept"));
      }
      SY_LOG(INFO) << request.name() << ": removed checkpoint directory " << dir << " (" << removed
                   << " files)";
    }
  }
  absl::StatusOr<v1::Job> deleted = Notify(registry_->DeleteJob(request.name()));
  if (deleted.status().code() == absl::StatusCode::kNotFound && request.allow_missing()) {
    return absl::OkStatus();
  }
  if (deleted.ok()) {
    SY_LOG(INFO) << "deleted " << request.name() << " (" << v1::Job::State_Name(deleted->state())
                 << ")";
  }
  return deleted.status();
}

absl::Status JobHub::StoreHealth() { return registry_->StoreHealth(); }

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

}  // namespace switchyard::jobs
