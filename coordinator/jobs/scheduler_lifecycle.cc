// File: coordinator/jobs/scheduler_lifecycle.cc
//
// The scheduler's reactions (scheduler.h "Policy"): events from workers, ending a generation,
// and the periodic checks. Runs on the scheduler thread with runs_mu_ held.
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "coordinator/jobs/job_state.h"
#include "coordinator/jobs/scheduler.h"
#include "coordinator/jobs/scheduler_internal.h"

namespace switchyard::jobs {

using v1::Job;
using namespace scheduler_internal;  // NOLINT: the reasons and StopMessage

// --- events --------------------------------------------------------------------------------

void Scheduler::Handle(const RegisteredEvent& e) {
  const cluster::Registered& r = e.registered;
  released_.erase(r.worker.id);
  // The same id attached again while this process had it in a generation (a reconnect): it keeps
  // its rank if its next heartbeat reports the generation (CheckAdoptions), else it restarts.
  if (r.before && r.before->state == cluster::WorkerState::kBusy) {
    Run* run = FindRun(r.before->job, r.before->generation);
    if (run != nullptr && run->rank_of.count(r.worker.id) > 0) {
      if (!run->draining && !run->adopting) run->reattached.insert(r.worker.id);
      return;  // a draining run still waits for its WorkerExit (the Stop was queued for it)
    }
    // Its generation ended here meanwhile: free it, and stop whatever it may still run.
    (void)workers_->SetIdle(r.worker.id);
    Send(r.worker.id, StopMessage("your generation is no longer running"));
    workers_changed_ = true;
    return;
  }
  // A worker of a previous coordinator process: reserve it for the job being re-adopted. The
  // adoption may already be complete (CheckAdoptions counts a worker ready from its heartbeat,
  // which can be recorded before this event is handled): a rank of a live run is reserved either
  // way.
  if (r.previous && r.previous->state == store::WorkerState::kAssigned) {
    const Run* run = RunHoldingRank(r.worker.id);
    if (run != nullptr && run->job == r.previous->job) {
      if (absl::Status s = workers_->SetBusy(r.worker.id, run->job, run->generation, -1); !s.ok()) {
        SY_LOG(WARNING) << "scheduler: reserving " << r.worker.id << ": " << s;
      }
    }
  }
}

void Scheduler::Handle(const StepEvent& e) {
  Run* run = FindRun(e.report.job(), e.report.generation());
  if (run == nullptr || run->draining) return;
  auto it = run->rank_of.find(e.worker);
  if (it == run->rank_of.end()) {
    SY_LOG(WARNING) << "scheduler: step report from " << e.worker << " which is not a rank of "
                    << run->job << " generation " << run->generation;
    return;
  }
  if (it->second < 0) it->second = e.report.rank();  // learned for an adopted run
  if (!run->running) {
    absl::StatusOr<Job> job = hub_->Transition(
        run->job, Job::RUNNING, kFirstStep,
        absl::StrCat("generation ", run->generation, " reported step ", e.report.metrics().step()));
    if (!job.ok()) {
      SY_LOG(WARNING) << "scheduler: " << run->job << " -> RUNNING: " << job.status();
      CheckRunStates();
      return;
    }
    run->running = true;
  }
  if (it->second == 0) {
    steps_->Publish(run->job, e.report.metrics());
    // Job.last_step survives a coordinator restart: saved at most once a second per job (one
    // SQLite write), and once more when the job succeeds.
    const absl::Time now = absl::Now();
    if (now - run->last_step_saved >= absl::Seconds(1)) {
      run->last_step_saved = now;
      absl::Status saved = hub_->RecordLastStep(run->job, e.report.metrics());
      if (!saved.ok()) SY_LOG(WARNING) << "scheduler: " << run->job << " last step: " << saved;
    }
    // Job.last_validation: every report with a validation loss (rare: every eval_interval steps)
    // is saved at once, not rate-limited, so none is lost to the one-a-second rule above.
    if (e.report.metrics().has_validation_loss()) {
      absl::Status saved = hub_->RecordLastValidation(run->job, e.report.metrics());
      if (!saved.ok()) SY_LOG(WARNING) << "scheduler: " << run->job << " validation: " << saved;
    }
  }
}

void Scheduler::Handle(const ExitEvent& e) {
  const v1::WorkerExit& exit = e.exit;
  std::optional<cluster::WorkerInfo> worker = workers_->Get(e.worker);
  if (worker && worker->state == cluster::WorkerState::kBusy && worker->job == exit.job() &&
      (worker->generation == exit.generation() || worker->generation == 0)) {
    (void)workers_->SetIdle(e.worker);
  }
  Run* run = FindRun(exit.job(), exit.generation());
  if (run == nullptr || run->rank_of.count(e.worker) == 0) {
    SY_LOG(INFO) << "scheduler: ignoring exit " << exit.exit_code() << " of " << e.worker << " for "
                 << exit.job() << " generation " << exit.generation();
    return;
  }
  workers_changed_ = true;
  run->exit_code[e.worker] = exit.exit_code();
  if (run->draining) {
    run->awaiting_stop.erase(e.worker);
    return;
  }
  const int32_t code = exit.exit_code();
  const std::string who =
      absl::StrCat("rank ", run->rank_of[e.worker], " (worker ", e.worker, ") exited with code ",
                   code, exit.message().empty() ? "" : ": ", exit.message());
  if (code == 0) {
    for (const auto& [id, rank] : run->rank_of) {
      auto c = run->exit_code.find(id);
      if (c == run->exit_code.end() || c->second != 0) return;  // others still training
    }
    if (!run->running) {
      absl::StatusOr<Job> job = hub_->Transition(run->job, Job::RUNNING, kFirstStep,
                                                 "every rank finished before a step report");
      if (!job.ok()) SY_LOG(WARNING) << "scheduler: " << run->job << ": " << job.status();
    }
    if (std::optional<v1::StepMetrics> last = steps_->LastStep(run->job)) {
      absl::Status saved = hub_->RecordLastStep(run->job, *last);
      if (!saved.ok()) SY_LOG(WARNING) << "scheduler: " << run->job << " last step: " << saved;
    }
    absl::StatusOr<Job> job =
        hub_->Transition(run->job, Job::SUCCEEDED, kAllRanksFinished,
                         absl::StrCat("all ", run->rank_of.size(), " ranks of generation ",
                                      run->generation, " exited with code 0"));
    if (!job.ok())
      SY_LOG(WARNING) << "scheduler: " << run->job << " -> SUCCEEDED: " << job.status();
    const std::string name = run->job;
    runs_.erase(name);
    Finish(name);
    return;
  }
  if (code >= 1 && code <= 127) {
    Fail(*run, kWorkerExitPermanent, who);
  } else if (code >= 128 && code <= 255) {
    Restart(*run, kWorkerFailed, who);
  } else {
    Fail(*run, kWorkerExitPermanent, absl::StrCat(who, " (outside 0..255: treated as permanent)"));
  }
}

void Scheduler::Handle(const LostEvent& e) {
  workers_changed_ = true;
  for (auto& [name, run] : runs_) {
    auto it = run.rank_of.find(e.worker.id);
    if (it == run.rank_of.end()) continue;
    if (run.draining) {
      run.awaiting_stop.erase(e.worker.id);
      continue;
    }
    if (run.adopting) continue;  // CheckAdoptions decides
    if (run.exit_code.count(e.worker.id) > 0 && run.exit_code[e.worker.id] == 0) continue;
    Restart(run, kWorkerLost,
            absl::StrCat("rank ", it->second, " (worker ", e.worker.id, " on ", e.worker.host,
                         ") lost: ", e.why));
  }
}

void Scheduler::Handle(const CheckpointEvent& e) {
  const v1::CheckpointSaved& saved = e.saved;
  Run* run = FindRun(saved.job(), saved.generation());
  if (run == nullptr || run->draining) return;
  auto it = run->rank_of.find(e.worker);
  if (it == run->rank_of.end() || saved.rank() != 0) return;  // rank 0's is the job's
  if (it->second >= 0 && it->second != 0) return;
  // The checkpoint is committed (the ranks' saves are collective): record it before anything
  // depends on it.
  if (saved.step() > run->last_checkpoint) {
    run->last_checkpoint = saved.step();
    absl::StatusOr<Job> job = hub_->RecordCheckpoint(run->job, saved.step());
    if (!job.ok()) {
      SY_LOG(WARNING) << "scheduler: " << run->job << ": recording checkpoint " << saved.step()
                      << ": " << job.status();
    }
  }
  if (run->preempting && saved.requested()) {
    EndPreempted(*run, saved.step());
  } else if (run->scaling_to > 0 && saved.requested()) {
    EndForScaleUp(*run, saved.step());
  }
}

void Scheduler::EndForScaleUp(Run& run, int64_t step) {
  const std::string message =
      absl::StrCat("scaling up from ", run.rank_of.size(), " to ", run.scaling_to,
                   " worker(s) at step ", step, "; resumes from the checkpoint of step ", step);
  run.scaling_to = 0;
  absl::StatusOr<Job> job = hub_->Transition(run.job, Job::PENDING, kScalingUp, message);
  if (!job.ok()) {
    SY_LOG(WARNING) << "scheduler: " << run.job << " -> PENDING: " << job.status();
    CheckRunStates();
    return;
  }
  SY_LOG(INFO) << "scheduler: " << run.job << " generation " << run.generation << ": " << message;
  Drain(run, absl::StrCat(kScalingUp, ": ", message));
}

void Scheduler::EndPreempted(Run& run, int64_t step) {
  std::string message;
  if (step >= 0) {
    message = absl::StrCat("preempted at step ", step, " for ", run.preempted_for,
                           "; resumes from the checkpoint of step ", step);
  } else {
    message = absl::StrCat(
        "preempted for ", run.preempted_for, ": no checkpoint saved within ",
        absl::FormatDuration(options_.preempt_save_timeout), "; resumes from its last checkpoint",
        run.last_checkpoint >= 0 ? absl::StrCat(" (step ", run.last_checkpoint, ")")
                                 : std::string(" (none in this generation)"));
  }
  absl::StatusOr<Job> job = hub_->Transition(run.job, Job::PENDING, kPreempted, message);
  if (!job.ok()) {
    // Cancelled or failed meanwhile: CheckRunStates ends the generation its own way.
    SY_LOG(WARNING) << "scheduler: " << run.job << " -> PENDING: " << job.status();
    run.preempting = false;
    CheckRunStates();
    return;
  }
  SY_LOG(INFO) << "scheduler: " << run.job << " generation " << run.generation << ": " << message;
  run.preempting = false;
  Drain(run, absl::StrCat(kPreempted, ": ", message));
}

void Scheduler::CheckPreemptions() {
  const absl::Time now = absl::Now();
  for (auto& [name, run] : runs_) {
    if (run.preempting && !run.draining && now >= run.preempt_deadline) EndPreempted(run, -1);
    if (run.scaling_to > 0 && now >= run.scale_deadline) {
      SY_LOG(WARNING) << "scheduler: " << name << ": no checkpoint within "
                      << absl::FormatDuration(options_.preempt_save_timeout)
                      << "; scale-up abandoned";
      run.scaling_to = 0;
      run.started = now;  // wait scale_up_delay again before the next try
    }
  }
}

// --- ending a generation ----------------------------------------------------------------------

void Scheduler::Drain(Run& run, const std::string& why) {
  run.draining = true;
  rendezvous_->EndGeneration(run.job, run.generation);
  run.drain_deadline = absl::Now() + options_.stop_timeout;
  for (const auto& [id, rank] : run.rank_of) {
    if (run.exit_code.count(id) > 0) continue;
    std::optional<cluster::WorkerInfo> worker = workers_->Get(id);
    if (!worker || worker->state == cluster::WorkerState::kLost) continue;
    run.awaiting_stop.insert(id);
    Send(id, StopMessage(why));
  }
}

void Scheduler::Restart(Run& run, const std::string& reason, const std::string& message) {
  absl::StatusOr<Job> job = hub_->Transition(run.job, Job::RESTARTING, reason, message);
  if (!job.ok()) {
    SY_LOG(WARNING) << "scheduler: " << run.job << " -> RESTARTING: " << job.status();
    Drain(run, absl::StrCat(reason, ": ", message));
    absl::StatusOr<Job> now = hub_->GetJob(run.job);
    if (now.ok() && jobs::IsTerminal(now->state())) Finish(run.job);
    return;
  }
  SY_LOG(INFO) << "scheduler: " << run.job << " generation " << run.generation << " -> "
               << Job::State_Name(job->state()) << " (" << reason << ": " << message << ")";
  Drain(run, absl::StrCat(reason, ": ", message));
  if (jobs::IsTerminal(job->state())) Finish(run.job);
}

void Scheduler::Fail(Run& run, const std::string& reason, const std::string& message) {
  absl::StatusOr<Job> job = hub_->Transition(run.job, Job::FAILED, reason, message);
  if (!job.ok()) SY_LOG(WARNING) << "scheduler: " << run.job << " -> FAILED: " << job.status();
  Drain(run, absl::StrCat(reason, ": ", message));
  Finish(run.job);
}

void Scheduler::Finish(const std::string& job) {
  steps_->CloseJob(job);
  rendezvous_->DropJob(job);
}

// --- periodic checks ----------------------------------------------------------------------

void Scheduler::CheckRunStates() {
  for (auto& [name, run] : runs_) {
    if (run.draining) continue;
    absl::StatusOr<Job> job = hub_->GetJob(name);
    if (!job.ok()) {
      SY_LOG(WARNING) << "scheduler: reading " << name << ": " << job.status();
      continue;
    }
    if (jobs::IsTerminal(job->state()) || job->generation() != run.generation) {
      SY_LOG(INFO) << "scheduler: " << name << " is " << Job::State_Name(job->state())
                   << " (generation " << job->generation() << "); stopping generation "
                   << run.generation;
      Drain(run, absl::StrCat("job is ", Job::State_Name(job->state())));
      if (jobs::IsTerminal(job->state())) Finish(name);
    }
  }
}

void Scheduler::StopZombies() {
  for (const cluster::WorkerInfo& w : workers_->Idle()) {
    if (w.heartbeats == 0 || w.reported_generation == 0) continue;
    if (const Run* run = RunHoldingRank(w.id);
        run != nullptr && run->generation == w.reported_generation) {
      continue;  // its RegisteredEvent is still queued; the handler reserves it
    }
    if (!zombies_stopped_.insert({w.id, w.reported_generation}).second) continue;
    SY_LOG(INFO) << "scheduler: idle worker " << w.id << " reports generation "
                 << w.reported_generation << "; sending Stop";
    Send(w.id, StopMessage(absl::StrCat("generation ", w.reported_generation,
                                        " is not running on this coordinator")));
  }
}

void Scheduler::ReleaseScopedWorkers() {
  std::map<std::string, std::optional<Job>> finished;  // job -> the job when finished
  for (const cluster::WorkerInfo& w : workers_->List()) {
    if (w.scope.empty() || !w.connected || w.state == cluster::WorkerState::kLost) continue;
    if (released_.count(w.id) > 0) continue;
    auto it = finished.find(w.scope);
    if (it == finished.end()) {
      absl::StatusOr<Job> job = hub_->GetJob(w.scope);
      std::optional<Job> done;
      if (job.ok() && jobs::IsTerminal(job->state())) done = *std::move(job);
      // NOT_FOUND: deleted after it finished (DeleteJob takes finished jobs only).
      if (job.status().code() == absl::StatusCode::kNotFound) done.emplace().set_name(w.scope);
      it = finished.emplace(w.scope, std::move(done)).first;
    }
    if (!it->second) continue;
    const Job& job = *it->second;
    const std::string state =
        job.state() == Job::STATE_UNSPECIFIED ? "DELETED" : Job::State_Name(job.state());
    v1::CoordinatorMessage message;
    v1::JobEnded& ended = *message.mutable_job_ended();
    ended.set_job(w.scope);
    ended.set_state(state);
    ended.set_message(job.last_event().message());
    SY_LOG(INFO) << "scheduler: " << w.scope << " is " << state << "; sending JobEnded to worker "
                 << w.id << " (scoped to it)";
    Send(w.id, message);
    released_.insert(w.id);
  }
}

void Scheduler::CheckDrains() {
  const absl::Time now = absl::Now();
  for (auto it = runs_.begin(); it != runs_.end();) {
    Run& run = it->second;
    if (!run.draining) {
      ++it;
      continue;
    }
    if (!run.awaiting_stop.empty() && now >= run.drain_deadline) {
      for (const std::string& id : run.awaiting_stop) {
        workers_->MarkLost(id, absl::StrCat("did not acknowledge Stop of ", run.job, " generation ",
                                            run.generation, " within ",
                                            absl::FormatDuration(options_.stop_timeout)));
      }
      run.awaiting_stop.clear();
    }
    if (run.awaiting_stop.empty()) {
      workers_changed_ = true;
      it = runs_.erase(it);
    } else {
      ++it;
    }
  }
}

void Scheduler::CheckAdoptions() {
  const absl::Time now = absl::Now();
  // Reconnected ranks: keep them if they still run the generation.
  for (auto& [name, run] : runs_) {
    if (run.draining || run.reattached.empty()) continue;
    std::string refused;
    for (auto it = run.reattached.begin(); it != run.reattached.end();) {
      std::optional<cluster::WorkerInfo> w = workers_->Get(*it);
      if (!w || w->state == cluster::WorkerState::kLost) {
        it = run.reattached.erase(it);  // the Lost event decides
        continue;
      }
      if (w->heartbeats == 0) {
        ++it;
        continue;
      }
      if (w->reported_generation == run.generation) {
        SY_LOG(INFO) << "scheduler: rank " << run.rank_of[*it] << " (worker " << *it
                     << ") reconnected and keeps running " << name << " generation "
                     << run.generation;
      } else if (run.exit_code.count(*it) == 0) {
        refused = absl::StrCat("rank ", run.rank_of[*it], " (worker ", *it,
                               ") reconnected running generation ", w->reported_generation,
                               " instead of ", run.generation);
        // It no longer runs this generation: nothing to stop, and it is free for the next.
        run.exit_code[*it] = kStoppedOnRequest;
        (void)workers_->SetIdle(*it);
      }
      it = run.reattached.erase(it);
    }
    if (!refused.empty()) Restart(run, kWorkerLost, refused);
  }
  for (auto& [name, run] : runs_) {
    if (!run.adopting) continue;
    size_t ready = 0;
    std::string refused;
    for (const auto& [id, rank] : run.rank_of) {
      if (run.exit_code.count(id) > 0) {  // it finished its part while the coordinator was away
        ++ready;
        continue;
      }
      std::optional<cluster::WorkerInfo> w = workers_->Get(id);
      if (!w || w->state == cluster::WorkerState::kLost || w->heartbeats == 0) continue;
      if (w->reported_generation == run.generation) {
        ++ready;
      } else {
        refused =
            absl::StrCat("worker ", id, " re-attached running generation ", w->reported_generation);
      }
    }
    const bool all = !run.rank_of.empty() && ready == run.rank_of.size();
    if (all) {
      run.adopting = false;
      SY_LOG(INFO) << "scheduler: re-adopted " << name << " generation " << run.generation << " on "
                   << ready << " worker(s)";
      continue;
    }
    if (refused.empty() && now < run.adopt_deadline && !run.rank_of.empty()) continue;
    run.adopting = false;
    const std::string message =
        refused.empty()
            ? absl::StrCat(ready, " of ", run.rank_of.size(), " worker(s) of generation ",
                           run.generation, " re-attached within ",
                           absl::FormatDuration(options_.adopt_grace))
            : refused;
    // Reserved workers not running the generation are free again; the others get Stop.
    for (const auto& [id, rank] : run.rank_of) {
      std::optional<cluster::WorkerInfo> w = workers_->Get(id);
      if (w && w->state == cluster::WorkerState::kBusy &&
          w->reported_generation != run.generation) {
        (void)workers_->SetIdle(id);
        run.exit_code[id] = kStoppedOnRequest;
      }
    }
    Restart(run, kCoordinatorRestarted, message);
  }
}

}  // namespace switchyard::jobs
