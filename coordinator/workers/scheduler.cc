// File: coordinator/workers/scheduler.cc
#include "coordinator/workers/scheduler.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "coordinator/jobs/job_registry.h"
#include "coordinator/jobs/job_state.h"
#include "coordinator/planner/planner.h"

namespace switchyard::workers {
namespace {

using v1::Job;

constexpr char kScheduled[] = "SCHEDULED";
constexpr char kFirstStep[] = "FIRST_STEP";
constexpr char kAllRanksFinished[] = "ALL_RANKS_FINISHED";
constexpr char kWorkerExitPermanent[] = "WORKER_EXIT_PERMANENT";
constexpr char kWorkerFailed[] = "WORKER_FAILED";
constexpr char kWorkerLost[] = "WORKER_LOST";
constexpr char kUnsupportedParallelism[] = "UNSUPPORTED_PARALLELISM";
constexpr char kNoFeasiblePlan[] = "NO_FEASIBLE_PLAN";
constexpr char kCoordinatorRestarted[] = "COORDINATOR_RESTARTED";
constexpr int32_t kStoppedOnRequest = 143;

v1::CoordinatorMessage StopMessage(const std::string& reason) {
  v1::CoordinatorMessage message;
  message.mutable_stop()->set_reason(reason);
  return message;
}

// Every job in `state`, all pages.
std::vector<Job> ListAll(api::JobHub* hub, Job::State state) {
  std::vector<Job> out;
  v1::ListJobsRequest request;
  request.set_state(state);
  request.set_page_size(jobs::kMaxPageSize);
  while (true) {
    absl::StatusOr<v1::ListJobsResponse> page = hub->ListJobs(request);
    if (!page.ok()) {
      SY_LOG(WARNING) << "scheduler: listing " << Job::State_Name(state)
                      << " jobs: " << page.status();
      return out;
    }
    for (Job& job : *page->mutable_jobs()) out.push_back(std::move(job));
    if (page->next_page_token().empty()) return out;
    request.set_page_token(page->next_page_token());
  }
}

// The elastic range of a stored (defaulted) spec; max is INT32_MAX when unbounded.
std::pair<int32_t, int32_t> WorkerRange(const v1::JobSpec& spec) {
  const bool has_world = spec.parallel().has_world_size();
  const int32_t world = spec.parallel().world_size();
  int32_t min = spec.has_min_workers() ? spec.min_workers() : (has_world ? world : 1);
  int32_t max = spec.has_max_workers() ? spec.max_workers()
                                       : (has_world ? world : std::numeric_limits<int32_t>::max());
  return {std::max(min, 1), max};
}

// The first fixed size that is not 1, as a message; empty when all are 1 or unset.
std::string UnsupportedParallelism(const v1::ParallelConfig& p) {
  const std::pair<const char*, int32_t> sizes[] = {
      {"tensor_model_parallel_size", p.tensor_model_parallel_size()},
      {"context_parallel_size", p.context_parallel_size()},
      {"pipeline_model_parallel_size", p.pipeline_model_parallel_size()},
      {"expert_tensor_parallel_size", p.expert_tensor_parallel_size()},
  };
  for (const auto& [name, value] : sizes) {
    if (value > 1) {
      return absl::StrCat("parallel.", name, " (", value,
                          ") must be 1: workers run data and expert parallelism only");
    }
  }
  return "";
}

}  // namespace

Scheduler::Scheduler(api::JobHub* hub, WorkerRegistry* workers, RendezvousStore* rendezvous,
                     StepHub* steps, SchedulerOptions options)
    : hub_(hub),
      workers_(workers),
      rendezvous_(rendezvous),
      steps_(steps),
      options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(api::JobHub* hub,
                                                             WorkerRegistry* workers,
                                                             RendezvousStore* rendezvous,
                                                             StepHub* steps,
                                                             SchedulerOptions options) {
  if (options.checkpoint_root.empty()) {
    return absl::InvalidArgumentError("checkpoint_root must not be empty");
  }
  if (options.rendezvous_address.empty()) {
    return absl::InvalidArgumentError("rendezvous_address must not be empty");
  }
  if (options.tick <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("tick must be positive");
  }
  if (hub == nullptr || workers == nullptr || rendezvous == nullptr || steps == nullptr) {
    return absl::InvalidArgumentError("hub, workers, rendezvous and steps must not be null");
  }
  return std::unique_ptr<Scheduler>(
      new Scheduler(hub, workers, rendezvous, steps, std::move(options)));
}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::SetSink(WorkerSink* sink) { sink_ = sink; }

absl::Status Scheduler::Start() {
  if (sink_ == nullptr) return absl::FailedPreconditionError("SetSink must be called before Start");
  const std::map<std::string, std::vector<std::string>> previous = workers_->PreviousAssignments();
  const absl::Time deadline = absl::Now() + options_.adopt_grace;
  {
    absl::MutexLock lock(&runs_mu_);
    for (Job::State state : {Job::STARTING, Job::RUNNING}) {
      for (const Job& job : ListAll(hub_, state)) {
        Run run;
        run.job = job.name();
        run.generation = job.generation();
        run.running = state == Job::RUNNING;
        run.adopting = true;
        run.adopt_deadline = deadline;
        auto it = previous.find(job.name());
        if (it != previous.end()) {
          for (const std::string& id : it->second) run.rank_of[id] = -1;
        }
        SY_LOG(INFO) << "scheduler: " << job.name() << " generation " << job.generation() << " was "
                     << Job::State_Name(state) << "; waiting up to "
                     << absl::FormatDuration(options_.adopt_grace) << " for its "
                     << run.rank_of.size() << " worker(s) to re-attach";
        runs_[job.name()] = std::move(run);
      }
    }
  }
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void Scheduler::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Scheduler::Push(Event event) {
  absl::MutexLock lock(&mu_);
  events_.push_back(std::move(event));
}

void Scheduler::OnRegistered(const Registered& registered) { Push(RegisteredEvent{registered}); }
void Scheduler::OnStep(const std::string& worker_id, const v1::StepReport& report) {
  Push(StepEvent{worker_id, report});
}
void Scheduler::OnExit(const std::string& worker_id, const v1::WorkerExit& exit) {
  Push(ExitEvent{worker_id, exit});
}
void Scheduler::OnLost(const WorkerInfo& worker, const std::string& why) {
  Push(LostEvent{worker, why});
}
void Scheduler::OnJobChanged() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
}

std::vector<RunSnapshot> Scheduler::Runs() const {
  absl::MutexLock lock(&runs_mu_);
  std::vector<RunSnapshot> out;
  for (const auto& [name, run] : runs_) {
    RunSnapshot snapshot;
    snapshot.job = run.job;
    snapshot.generation = run.generation;
    snapshot.running = run.running;
    snapshot.draining = run.draining;
    for (const auto& [worker, rank] : run.rank_of) {
      if (rank < 0) continue;
      if (static_cast<size_t>(rank) >= snapshot.ranks.size()) snapshot.ranks.resize(rank + 1);
      snapshot.ranks[rank] = worker;
    }
    out.push_back(std::move(snapshot));
  }
  return out;
}

absl::Status Scheduler::RequestCheckpoint(const std::string& job) {
  absl::MutexLock lock(&runs_mu_);
  auto it = runs_.find(job);
  if (it == runs_.end() || it->second.draining || it->second.adopting) {
    return absl::FailedPreconditionError(
        absl::StrCat(job, " has no generation running on this coordinator"));
  }
  v1::CoordinatorMessage message;
  message.mutable_checkpoint();
  for (const auto& [id, rank] : it->second.rank_of) {
    if (it->second.exit_code.count(id) == 0) Send(id, message);
  }
  return absl::OkStatus();
}

void Scheduler::Loop() {
  while (true) {
    std::deque<Event> events;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || wake_ || !events_.empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), options_.tick);
      if (stopping_) return;
      events.swap(events_);
      wake_ = false;
    }
    absl::MutexLock lock(&runs_mu_);
    for (const Event& event : events) {
      std::visit([this](const auto& e) { Handle(e); }, event);
    }
    if (!events.empty()) workers_changed_ = true;
    CheckAdoptions();
    CheckDrains();
    const uint64_t version = hub_->version();
    const absl::Time now = absl::Now();
    if (version != seen_hub_version_ || now - last_rescan_ >= options_.rescan_interval) {
      seen_hub_version_ = version;
      last_rescan_ = now;
      CheckRunStates();
      StopZombies();
      workers_changed_ = true;
    }
    if (workers_changed_) {
      workers_changed_ = false;
      SchedulePass();
    }
  }
}

Scheduler::Run* Scheduler::FindRun(const std::string& job, int64_t generation) {
  auto it = runs_.find(job);
  if (it == runs_.end() || it->second.generation != generation) return nullptr;
  return &it->second;
}

void Scheduler::Send(const std::string& worker, const v1::CoordinatorMessage& message) {
  if (!sink_->Send(worker, message)) {
    SY_LOG(WARNING) << "scheduler: worker " << worker << " has no open stream for a "
                    << message.msg_case() << " message";
  }
}

// --- events --------------------------------------------------------------------------------

void Scheduler::Handle(const RegisteredEvent& e) {
  const Registered& r = e.registered;
  // The same id attached again while this process had it in a generation (a reconnect): it keeps
  // its rank if its next heartbeat reports the generation (CheckAdoptions), else it restarts.
  if (r.before && r.before->state == WorkerState::kBusy) {
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
  // A worker of a previous coordinator process: reserve it for the job being re-adopted.
  if (r.previous && r.previous->state == store::WorkerState::kAssigned) {
    auto it = runs_.find(r.previous->job);
    if (it != runs_.end() && it->second.adopting && it->second.rank_of.count(r.worker.id) > 0) {
      if (absl::Status s =
              workers_->SetBusy(r.worker.id, it->second.job, it->second.generation, -1);
          !s.ok()) {
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
  if (it->second == 0) steps_->Publish(run->job, e.report.metrics());
}

void Scheduler::Handle(const ExitEvent& e) {
  const v1::WorkerExit& exit = e.exit;
  std::optional<WorkerInfo> worker = workers_->Get(e.worker);
  if (worker && worker->state == WorkerState::kBusy && worker->job == exit.job() &&
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

// --- ending a generation ----------------------------------------------------------------------

void Scheduler::Drain(Run& run, const std::string& why) {
  run.draining = true;
  run.drain_deadline = absl::Now() + options_.stop_timeout;
  for (const auto& [id, rank] : run.rank_of) {
    if (run.exit_code.count(id) > 0) continue;
    std::optional<WorkerInfo> worker = workers_->Get(id);
    if (!worker || worker->state == WorkerState::kLost) continue;
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
  for (const WorkerInfo& w : workers_->Idle()) {
    if (w.heartbeats == 0 || w.reported_generation == 0) continue;
    if (!zombies_stopped_.insert({w.id, w.reported_generation}).second) continue;
    SY_LOG(INFO) << "scheduler: idle worker " << w.id << " reports generation "
                 << w.reported_generation << "; sending Stop";
    Send(w.id, StopMessage(absl::StrCat("generation ", w.reported_generation,
                                        " is not running on this coordinator")));
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
      std::optional<WorkerInfo> w = workers_->Get(*it);
      if (!w || w->state == WorkerState::kLost) {
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
      std::optional<WorkerInfo> w = workers_->Get(id);
      if (!w || w->state == WorkerState::kLost || w->heartbeats == 0) continue;
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
      std::optional<WorkerInfo> w = workers_->Get(id);
      if (w && w->state == WorkerState::kBusy && w->reported_generation != run.generation) {
        (void)workers_->SetIdle(id);
        run.exit_code[id] = kStoppedOnRequest;
      }
    }
    Restart(run, kCoordinatorRestarted, message);
  }
}

// --- scheduling ---------------------------------------------------------------------------

void Scheduler::SchedulePass() {
  std::vector<WorkerInfo> idle = workers_->Idle();
  if (idle.empty()) return;
  for (Job::State state : {Job::RESTARTING, Job::PENDING}) {
    for (const Job& job : ListAll(hub_, state)) {
      if (idle.empty()) return;
      if (runs_.count(job.name()) > 0) continue;
      TrySchedule(job, &idle);
    }
  }
}

bool Scheduler::TrySchedule(const Job& job, std::vector<WorkerInfo>* idle) {
  const v1::JobSpec& stored = job.spec();
  if (std::string why = UnsupportedParallelism(stored.parallel()); !why.empty()) {
    absl::StatusOr<Job> failed =
        hub_->Transition(job.name(), Job::FAILED, kUnsupportedParallelism, why);
    if (!failed.ok()) SY_LOG(WARNING) << "scheduler: " << job.name() << ": " << failed.status();
    Finish(job.name());
    return true;
  }
  const auto [min_workers, max_workers] = WorkerRange(stored);
  const int32_t k = static_cast<int32_t>(std::min<size_t>(idle->size(), max_workers));
  if (k < min_workers) return false;

  v1::PlanRequest request;
  v1::JobSpec& spec = *request.mutable_spec();
  spec = stored;
  v1::ParallelConfig& p = *spec.mutable_parallel();
  p.clear_world_size();
  p.set_tensor_model_parallel_size(1);
  p.set_context_parallel_size(1);
  p.set_pipeline_model_parallel_size(1);
  p.set_expert_tensor_parallel_size(1);
  p.set_sequence_parallel(false);
  spec.set_min_workers(min_workers);
  spec.set_max_workers(k);
  v1::Cluster& cluster = *request.mutable_cluster();
  cluster.set_num_gpus(k);
  double memory = std::numeric_limits<double>::infinity();
  std::map<std::string, int> per_host;
  for (int32_t i = 0; i < k; ++i) {
    const WorkerInfo& w = (*idle)[i];
    const bool gpu = w.gpu.has_value() && w.gpu->memory_bytes() > 0;
    memory = std::min(memory, gpu ? static_cast<double>(w.gpu->memory_bytes())
                                  : options_.cpu_worker_memory_bytes);
    ++per_host[w.host];
  }
  int gpus_per_node = 1;
  for (const auto& [host, n] : per_host) gpus_per_node = std::max(gpus_per_node, n);
  cluster.set_gpu_memory_bytes(memory);
  cluster.set_gpus_per_node(gpus_per_node);
  cluster.set_intra_node_bandwidth_bytes_per_second(options_.intra_node_bandwidth_bytes_per_second);
  cluster.set_inter_node_bandwidth_bytes_per_second(options_.inter_node_bandwidth_bytes_per_second);
  cluster.set_peak_flops(options_.peak_flops);

  absl::StatusOr<v1::Plan> plan = planner::PlanJob(request);
  if (!plan.ok()) {
    if (k >= max_workers) {
      absl::StatusOr<Job> failed =
          hub_->Transition(job.name(), Job::FAILED, kNoFeasiblePlan,
                           absl::StrCat("with ", k, " worker(s): ", plan.status().message()));
      if (!failed.ok()) SY_LOG(WARNING) << "scheduler: " << job.name() << ": " << failed.status();
      Finish(job.name());
      return true;
    }
    if (waiting_logged_.insert({job.name(), static_cast<size_t>(k)}).second) {
      SY_LOG(INFO) << "scheduler: " << job.name() << " waits for more workers; with " << k << ": "
                   << plan.status();
    }
    return false;
  }
  const v1::Mapping& mapping = plan->best().mapping();
  const int32_t world = mapping.data_parallel_size() * mapping.tensor_model_parallel_size() *
                        mapping.context_parallel_size() * mapping.pipeline_model_parallel_size();
  if (world < min_workers || world > k) {
    SY_LOG(WARNING) << "scheduler: " << job.name() << ": plan of world " << world << " outside ["
                    << min_workers << ", " << k << "]";
    return false;
  }

  absl::StatusOr<Job> started =
      hub_->Transition(job.name(), Job::STARTING, kScheduled,
                       absl::StrCat(world, " worker(s): ", planner::MappingToString(mapping)));
  if (!started.ok()) {
    SY_LOG(WARNING) << "scheduler: " << job.name() << " -> STARTING: " << started.status();
    return false;
  }
  const int64_t generation = started->generation();
  rendezvous_->DropBefore(job.name(), generation);

  // The spec every rank of this generation runs.
  v1::JobSpec assigned = stored;
  v1::ParallelConfig& ap = *assigned.mutable_parallel();
  ap.set_world_size(world);
  ap.set_tensor_model_parallel_size(1);
  ap.set_context_parallel_size(1);
  ap.set_pipeline_model_parallel_size(1);
  ap.set_expert_tensor_parallel_size(1);
  ap.set_expert_model_parallel_size(mapping.expert_model_parallel_size());
  ap.set_sequence_parallel(false);
  ap.set_use_distributed_optimizer(mapping.use_distributed_optimizer());
  v1::TrainingConfig& t = *assigned.mutable_training();
  t.set_micro_batch_size(mapping.micro_batch_size());
  t.set_global_batch_size(mapping.micro_batch_size() * mapping.num_micro_batches() *
                          mapping.data_parallel_size());
  if (t.save().empty()) {
    absl::StatusOr<int64_t> id = jobs::ParseJobName(job.name());
    const std::string dir =
        absl::StrCat(options_.checkpoint_root, "/", id.ok() ? absl::StrCat(*id) : job.name());
    t.set_save(dir);
    t.set_load(dir);
  } else if (t.load().empty()) {
    t.set_load(t.save());
  }

  Run run;
  run.job = job.name();
  run.generation = generation;
  std::vector<std::string> ranks;
  for (int32_t rank = 0; rank < world; ++rank) {
    const WorkerInfo& w = (*idle)[rank];
    ranks.push_back(w.id);
    run.rank_of[w.id] = rank;
    if (absl::Status s = workers_->SetBusy(w.id, job.name(), generation, rank); !s.ok()) {
      SY_LOG(WARNING) << "scheduler: " << w.id << ": "
                      << s;  // lost meanwhile: a Lost event follows
    }
  }
  idle->erase(idle->begin(), idle->begin() + world);
  for (int32_t rank = 0; rank < world; ++rank) {
    v1::CoordinatorMessage message;
    v1::Assignment& a = *message.mutable_assignment();
    a.set_job(job.name());
    a.set_generation(generation);
    a.set_rank(rank);
    a.set_world_size(world);
    *a.mutable_spec() = assigned;
    *a.mutable_mapping() = mapping;
    a.set_rendezvous_address(options_.rendezvous_address);
    Send(ranks[rank], message);
  }
  v1::CoordinatorMessage start;
  start.mutable_start();
  for (const std::string& id : ranks) Send(id, start);
  SY_LOG(INFO) << "scheduler: " << job.name() << " generation " << generation << " started on "
               << world << " worker(s): " << absl::StrJoin(ranks, ", ");
  runs_[job.name()] = std::move(run);
  return true;
}

}  // namespace switchyard::workers
