// The Attach stream of the Agent (agent.h): sessions, reconnection, the writer thread and the
// outbox.
#include <algorithm>
#include <deque>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "worker/agent/agent.h"
#include "worker/agent/coordinator_channel.h"

namespace switchyard::agent {
namespace {

// Rejections that a reconnect cannot fix.
bool Permanent(absl::StatusCode code) {
  return code == absl::StatusCode::kUnauthenticated ||
         code == absl::StatusCode::kPermissionDenied || code == absl::StatusCode::kUnimplemented ||
         code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound ||
         code == absl::StatusCode::kFailedPrecondition;
}

}  // namespace

void Agent::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

void Agent::Fatal(absl::Status status) {
  Log(absl::StrCat("fatal: ", status.ToString()));
  absl::MutexLock lock(&mu_);
  if (fatal_.ok()) fatal_ = std::move(status);
  shutdown_ = true;
}

bool Agent::WaitShutdown(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&shutdown_), d);
  return shutdown_;
}

void Agent::Enqueue(v1::WorkerMessage msg) {
  absl::MutexLock lock(&mu_);
  if (msg.has_step()) {
    int reports = 0;
    for (const v1::WorkerMessage& m : outbox_) reports += m.has_step() ? 1 : 0;
    if (reports >= kMaxQueuedReports) {
      for (auto it = outbox_.begin(); it != outbox_.end(); ++it) {
        if (it->has_step()) {
          outbox_.erase(it);
          break;
        }
      }
    }
  }
  outbox_.push_back(std::move(msg));
}

void Agent::SendExit(const v1::Assignment& a, int code, const std::string& message) {
  v1::WorkerMessage msg;
  v1::WorkerExit* e = msg.mutable_exit();
  e->set_job(a.job());
  e->set_generation(a.generation());
  e->set_exit_code(code);
  e->set_message(message);
  Log(absl::StrCat("job ", a.job(), " generation ", a.generation(), " rank ", a.rank(), ": exit ",
                   code, message.empty() ? "" : " (" + message + ")"));
  Enqueue(std::move(msg));
}

absl::Status Agent::Run() {
  {
    absl::MutexLock lock(&mu_);
    if (running_) return absl::FailedPreconditionError("Agent::Run: called twice");
    running_ = true;
  }
  absl::Duration backoff = options_.reconnect_initial_backoff;
  while (!WaitShutdown(absl::ZeroDuration())) {
    const absl::Time began = absl::Now();
    absl::Status st = RunSession();
    sessions_.fetch_add(1);
    if (WaitShutdown(absl::ZeroDuration())) break;
    if (st.code() == absl::StatusCode::kFailedPrecondition && !options_.job.empty() &&
        assigned_once_.load()) {
      // It ran its job, and the job finished while it was away (its JobEnded was not received).
      Log(absl::StrCat("job ", options_.job, " finished while this worker was away (", st.message(),
                       "); this worker was scoped to it (--job) and exits"));
      break;
    }
    if (Permanent(st.code())) {
      Fatal(absl::Status(
          st.code(),
          absl::StrCat("the coordinator at ", options_.coordinator,
                       " rejected this worker: ", st.message(),
                       st.code() == absl::StatusCode::kUnauthenticated
                           ? (options_.token_file.empty()
                                  ? " (no token was sent: pass the workers' token file, the "
                                    "coordinator's --worker-token-file)"
                                  : absl::StrCat(" (check the token in ", options_.token_file,
                                                 ": it must be the workers' token, not the API "
                                                 "token)"))
                           : "")));
      break;
    }
    if (absl::Now() - began > 2 * options_.reconnect_max_backoff) {
      backoff = options_.reconnect_initial_backoff;  // the last session was a healthy one
    }
    Log(absl::StrCat("stream to ", options_.coordinator, " ended (", st.ToString(),
                     "); reconnecting in ", absl::FormatDuration(backoff)));
    if (WaitShutdown(backoff)) break;
    backoff = std::min(backoff * 2, options_.reconnect_max_backoff);
  }
  {
    absl::MutexLock g(&gen_mu_);
    EndGeneration("worker shutting down");
    ReapStopping();
  }
  absl::MutexLock lock(&mu_);
  return fatal_;
}

absl::Status Agent::RunSession() {
  grpc::ClientContext context;
  AddBearerToken(token_, &context);
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream =
      stub_->Attach(&context);
  absl::Notification reader_done;
  std::thread writer;
  // Registration goes first; if it cannot be written the stream is already broken and Read
  // below returns false at once.
  if (stream->Write(RegistrationMessage())) {
    Log(absl::StrCat("attached to ", options_.coordinator, " (", device_.ToString(), ")"));
    writer = std::thread([&] { WriterLoop(stream.get(), &context, &reader_done); });
  }
  v1::CoordinatorMessage msg;
  while (stream->Read(&msg)) Handle(msg);
  reader_done.Notify();
  if (writer.joinable()) writer.join();
  absl::Status st = FromGrpcStatus(stream->Finish());
  if (st.ok() && !WaitShutdown(absl::ZeroDuration())) {
    st = absl::UnavailableError("the coordinator closed the stream");
  }
  return st;
}

void Agent::WriterLoop(grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>* stream,
                       grpc::ClientContext* context, absl::Notification* reader_done) {
  // A failed Write means the call is over (the reader's Read fails as well, and Finish carries
  // the server's status, e.g. UNAUTHENTICATED: cancelling here would replace it by CANCELLED).
  // Cancel only if the reader is still blocked after a while.
  auto broken = [&] {
    if (!reader_done->WaitForNotificationWithTimeout(absl::Seconds(5))) {
      context->TryCancel();
      reader_done->WaitForNotification();
    }
  };
  absl::Time next_heartbeat = absl::Now();
  while (true) {
    bool shutting_down = false;
    bool have = false;
    v1::WorkerMessage msg;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return shutdown_ || !outbox_.empty() || reader_done->HasBeenNotified();
      };
      // reader_done is not under mu_: bound the wait so its notification is seen within 50 ms.
      mu_.AwaitWithDeadline(absl::Condition(&ready),
                            std::min(next_heartbeat, absl::Now() + absl::Milliseconds(50)));
      if (reader_done->HasBeenNotified()) return;
      shutting_down = shutdown_;
      if (!shutting_down && !outbox_.empty()) {
        msg = std::move(outbox_.front());
        outbox_.pop_front();
        have = true;
      }
    }
    if (shutting_down) {
      // End the generation on a helper thread (it may wait stop_report_after for the training
      // thread) while this one keeps heartbeating, so the coordinator does not see a silent
      // worker meanwhile; then send what is queued (its WorkerExit(143)) and close.
      absl::Notification ended;
      std::thread ender([this, &ended] {
        {
          absl::MutexLock g(&gen_mu_);
          EndGeneration("worker shutting down");
        }
        ended.Notify();
      });
      bool alive = true;
      while (!ended.WaitForNotificationWithTimeout(
          std::max(next_heartbeat - absl::Now(), absl::ZeroDuration()))) {
        if (!alive) continue;
        v1::WorkerMessage hb;
        hb.mutable_heartbeat()->set_generation(generation_.load());
        alive = stream->Write(hb);
        next_heartbeat = absl::Now() + options_.heartbeat_interval;
      }
      ender.join();
      std::deque<v1::WorkerMessage> rest;
      {
        absl::MutexLock lock(&mu_);
        rest.swap(outbox_);
      }
      for (const v1::WorkerMessage& m : rest) {
        if (!alive || !stream->Write(m)) break;
      }
      stream->WritesDone();
      if (!reader_done->WaitForNotificationWithTimeout(absl::Seconds(2))) broken();
      return;
    }
    if (have) {
      if (!stream->Write(msg)) {
        {
          absl::MutexLock lock(&mu_);
          outbox_.push_front(std::move(msg));  // sent again after the reconnect
        }
        broken();
        return;
      }
      continue;
    }
    if (absl::Now() >= next_heartbeat) {
      v1::WorkerMessage hb;
      hb.mutable_heartbeat()->set_generation(generation_.load());
      if (!stream->Write(hb)) {
        broken();
        return;
      }
      next_heartbeat = absl::Now() + options_.heartbeat_interval;
    }
  }
}

}  // namespace switchyard::agent
