// File: coordinator/api/worker_service.cc
#include "coordinator/api/worker_service.h"

#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status.h"
#include "coordinator/jobs/job_registry.h"
#include "coordinator/jobs/job_state.h"

namespace switchyard::api {

class WorkerServiceImpl::AttachReactor
    : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
 public:
  AttachReactor(WorkerServiceImpl* service, grpc::CallbackServerContext* context)
      : service_(service) {
    if (service_->auth_ != nullptr) {
      if (absl::Status s =
              service_->auth_->Check(api::AuthorizationOf(*context), "WorkerService.Attach");
          !s.ok()) {
        End(ToGrpcStatus(s));
        return;
      }
    }
    StartRead(&in_);
  }

  // Queues a message; false once the stream is ending.
  bool Enqueue(const v1::CoordinatorMessage& message) {
    absl::MutexLock lock(&mu_);
    if (finished_) return false;
    queue_.push_back(message);  // deque: the element being written keeps its address
    if (!writing_) {
      writing_ = true;
      StartWrite(&queue_.front());
    }
    return true;
  }

  // Finishes the call once, after the write in flight if any.
  void End(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    if (writing_) {
      while (queue_.size() > 1) queue_.pop_back();
      pending_finish_ = status;
      finish_pending_ = true;
    } else {
      queue_.clear();
      Finish(status);
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // End first: Ended's LOST notice ends the stream too, with another status.
      End(grpc::Status::OK);
      Ended("its stream ended");
      return;
    }
    absl::Status status = Handle(in_);
    if (!status.ok()) {
      End(ToGrpcStatus(status));
      Ended(absl::StrCat("its stream was refused: ", status.message()));
      return;
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    bool finish = false;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      queue_.pop_front();
      writing_ = false;
      if (!ok && !finished_) {
        finished_ = true;
        queue_.clear();
        finish = true;
        status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "write to the worker failed");
      } else if (finished_) {
        queue_.clear();
        if (finish_pending_) {
          finish_pending_ = false;
          finish = true;
          status = pending_finish_;
        }
      } else if (!queue_.empty()) {
        writing_ = true;
        StartWrite(&queue_.front());
      }
    }
    if (finish) Finish(status);
    if (!ok) Ended("a write to its stream failed");
  }

  void OnCancel() override { Ended("its stream was cancelled"); }

  void OnDone() override {
    service_->Unbind(id_, this);
    delete this;
  }

 private:
  // The worker's stream is gone: it is disconnected (LOST follows after heartbeat_timeout unless
  // it attaches again), unless a newer stream replaced this one.
  void Ended(const std::string& why) {
    std::string id;
    {
      absl::MutexLock lock(&mu_);
      id = bound_id_;
    }
    if (id.empty() || service_->shutting_down()) return;
    if (service_->IsCurrent(id, this)) {
      service_->workers_->SetDisconnected(id);
      SY_LOG(INFO) << "worker " << id << " disconnected: " << why;
    }
  }

  absl::Status Handle(const v1::WorkerMessage& message) {
    if (message.msg_case() == v1::WorkerMessage::kRegistration) {
      if (!id_.empty()) {
        return absl::FailedPreconditionError(
            "registration must be sent exactly once per stream (it was already sent)");
      }
      SY_RETURN_IF_ERROR(service_->CheckScope(message.registration()));
      absl::StatusOr<cluster::Registered> registered =
          service_->workers_->Register(message.registration());
      if (!registered.ok()) return registered.status();
      id_ = registered->worker.id;
      {
        absl::MutexLock lock(&mu_);
        bound_id_ = id_;
      }
      service_->Bind(id_, this);
      service_->scheduler_->OnRegistered(*registered);
      return absl::OkStatus();
    }
    if (message.msg_case() == v1::WorkerMessage::MSG_NOT_SET) {
      return absl::InvalidArgumentError(
          "WorkerMessage.msg must be set (registration, heartbeat, step, exit or "
          "checkpoint_saved)");
    }
    if (id_.empty()) {
      return absl::FailedPreconditionError("the first WorkerMessage must be a registration");
    }
    switch (message.msg_case()) {
      case v1::WorkerMessage::kHeartbeat:
        if (message.heartbeat().generation() < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "heartbeat.generation (", message.heartbeat().generation(), ") must be >= 0"));
        }
        (void)service_->workers_->Touch(id_, message.heartbeat().generation());
        break;
      case v1::WorkerMessage::kStep:
        (void)service_->workers_->Touch(id_, -1);
        service_->scheduler_->OnStep(id_, message.step());
        break;
      case v1::WorkerMessage::kCheckpointSaved:
        (void)service_->workers_->Touch(id_, -1);
        service_->scheduler_->OnCheckpointSaved(id_, message.checkpoint_saved());
        break;
      case v1::WorkerMessage::kExit:
        (void)service_->workers_->Touch(id_, -1);
        service_->scheduler_->OnExit(id_, message.exit());
        break;
      default:
        break;
    }
    return absl::OkStatus();
  }

  WorkerServiceImpl* const service_;
  v1::WorkerMessage in_;
  // Set by the registration. id_ is used by the read path only (reads are serialized); other
  // reactions (a failed write) read the copy bound_id_ under mu_.
  std::string id_;

  absl::Mutex mu_;
  std::deque<v1::CoordinatorMessage> queue_ ABSL_GUARDED_BY(mu_);
  std::string bound_id_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_pending_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status pending_finish_ ABSL_GUARDED_BY(mu_);
};

WorkerServiceImpl::WorkerServiceImpl(cluster::WorkerRegistry* workers, jobs::Scheduler* scheduler,
                                     const api::TokenAuth* auth, jobs::JobHub* hub,
                                     WorkerServiceOptions options)
    : workers_(workers), scheduler_(scheduler), auth_(auth), hub_(hub), options_(options) {}

absl::Status WorkerServiceImpl::CheckScope(const v1::Registration& registration) const {
  const std::string& job = registration.job();
  if (job.empty()) {
    if (options_.require_job_scoped_workers) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", registration.worker_id(),
                       " is not scoped to a job, and this coordinator runs with "
                       "--require-job-scoped-workers: start the worker with --job jobs/<id> "
                       "(registration.job)"));
    }
    return absl::OkStatus();
  }
  if (!jobs::ParseJobName(job).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("registration.job (--job \"", job,
                                                   "\") must be a job name jobs/<id>, id >= 1"));
  }
  if (hub_ == nullptr) {
    return absl::UnavailableError("this coordinator cannot check --job (no job hub)");
  }
  absl::StatusOr<v1::Job> found = hub_->GetJob(job);
  if (found.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(
        absl::StrCat("--job ", job,
                     ": no such job on this coordinator (registration.job); submit it first "
                     "(syctl submit) and scope the worker to the name it gets"));
  }
  SY_RETURN_IF_ERROR(found.status());
  if (jobs::IsTerminal(found->state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--job ", job, ": the job is already ", v1::Job::State_Name(found->state()),
        " (registration.job): a job-scoped worker attaches only to an unfinished job"));
  }
  return absl::OkStatus();
}

WorkerServiceImpl::~WorkerServiceImpl() = default;

grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* WorkerServiceImpl::Attach(
    grpc::CallbackServerContext* context) {
  {
    absl::MutexLock lock(&mu_);
    ++open_;
  }
  return new AttachReactor(this, context);
}

void WorkerServiceImpl::Bind(const std::string& worker_id, AttachReactor* reactor) {
  absl::MutexLock lock(&mu_);
  AttachReactor*& slot = streams_[worker_id];
  if (slot != nullptr && slot != reactor) {
    slot->End(
        grpc::Status(grpc::StatusCode::ABORTED,
                     absl::StrCat("worker ", worker_id,
                                  " attached again on a new stream, which replaces this one")));
  }
  slot = reactor;
  // Messages sent while the worker had no stream, in order.
  auto pending = pending_.find(worker_id);
  if (pending != pending_.end()) {
    for (const v1::CoordinatorMessage& message : pending->second) reactor->Enqueue(message);
    pending_.erase(pending);
  }
  if (shut_down_) {
    reactor->End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down"));
  }
}

bool WorkerServiceImpl::Unbind(const std::string& worker_id, AttachReactor* reactor) {
  absl::MutexLock lock(&mu_);
  --open_;
  auto it = streams_.find(worker_id);
  if (it == streams_.end() || it->second != reactor) return false;
  streams_.erase(it);
  return true;
}

bool WorkerServiceImpl::IsCurrent(const std::string& worker_id,
                                  const AttachReactor* reactor) const {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(worker_id);
  return it != streams_.end() && it->second == reactor;
}

bool WorkerServiceImpl::Send(const std::string& worker_id, const v1::CoordinatorMessage& message) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(worker_id);
  if (it != streams_.end() && it->second->Enqueue(message)) return true;
  // No open stream: keep the message for the worker's next stream unless it is gone for good.
  std::optional<cluster::WorkerInfo> worker = workers_->Get(worker_id);
  if (!worker || worker->state == cluster::WorkerState::kLost) return false;
  std::deque<v1::CoordinatorMessage>& queue = pending_[worker_id];
  if (queue.size() >= kMaxPendingMessages) queue.pop_front();
  queue.push_back(message);
  return true;
}

void WorkerServiceImpl::Kick(const std::string& worker_id, const std::string& why) {
  absl::MutexLock lock(&mu_);
  pending_.erase(worker_id);
  auto it = streams_.find(worker_id);
  if (it == streams_.end()) return;
  it->second->End(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               absl::StrCat("worker ", worker_id, " was marked LOST: ", why)));
}

void WorkerServiceImpl::Shutdown() {
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
  for (auto& [id, reactor] : streams_) {
    reactor->End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down"));
  }
}

bool WorkerServiceImpl::shutting_down() const {
  absl::MutexLock lock(&mu_);
  return shut_down_;
}

int WorkerServiceImpl::open_streams() const {
  absl::MutexLock lock(&mu_);
  return open_;
}

}  // namespace switchyard::api
