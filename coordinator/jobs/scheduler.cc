// File: coordinator/jobs/scheduler.cc
#include "coordinator/jobs/scheduler.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "coordinator/jobs/job_registry.h"
#include "coordinator/jobs/job_state.h"
#include "coordinator/jobs/placement.h"
#include "coordinator/jobs/resolve_spec.h"
#include "coordinator/jobs/scheduler_internal.h"
#include "coordinator/planner/planner.h"

namespace switchyard::jobs {
namespace {

using v1::Job;
using namespace scheduler_internal;  // NOLINT: the reasons and StopMessage

// Every job in `state`, all pages.
std::vector<Job> ListAll(jobs::JobHub* hub, Job::State state) {
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

}  // namespace

Scheduler::Scheduler(jobs::JobHub* hub, cluster::WorkerRegistry* workers,
                     cluster::RendezvousStore* rendezvous, StepHub* steps, SchedulerOptions options)
    : hub_(hub),
      workers_(workers),
      rendezvous_(rendezvous),
      steps_(steps),
      options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(jobs::JobHub* hub,
                                                             cluster::WorkerRegistry* workers,
                                                             cluster::RendezvousStore* rendezvous,
                                                             StepHub* steps,
                                                             SchedulerOptions options) {
  if (options.checkpoint_root.empty()) {
    return absl::InvalidArgumentError("checkpoint_root must not be empty");
  }
  if (options.data_root.empty()) return absl::InvalidArgumentError("data_root must not be empty");
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
        run.queue = QueueOf(job.spec());
        auto it = previous.find(job.name());
        if (it != previous.end()) {
          for (const std::string& id : it->second) run.rank_of[id] = -1;
        }
        SY_LOG(INFO) << "scheduler: " << job.name() << " generation " << job.generation() << " was "
                     << Job::State_Name(state) << "; waiting up to "
                     << absl::FormatDuration(options_.adopt_grace) << " for its "
                     << run.rank_of.size() << " worker(s) to re-attach";
        // Its ranks may still need the rendezvous (a generation caught STARTING).
        rendezvous_->OpenGeneration(job.name(), job.generation());
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

void Scheduler::OnRegistered(const cluster::Registered& registered) {
  Push(RegisteredEvent{registered});
}
void Scheduler::OnStep(const std::string& worker_id, const v1::StepReport& report) {
  Push(StepEvent{worker_id, report});
}
void Scheduler::OnExit(const std::string& worker_id, const v1::WorkerExit& exit) {
  Push(ExitEvent{worker_id, exit});
}
void Scheduler::OnLost(const cluster::WorkerInfo& worker, const std::string& why) {
  Push(LostEvent{worker, why});
}
void Scheduler::OnCheckpointSaved(const std::string& worker_id, const v1::CheckpointSaved& saved) {
  Push(CheckpointEvent{worker_id, saved});
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
    CheckPreemptions();
    CheckDrains();
    const uint64_t version = hub_->version();
    const absl::Time now = absl::Now();
    if (version != seen_hub_version_ || now - last_rescan_ >= options_.rescan_interval) {
      seen_hub_version_ = version;
      last_rescan_ = now;
      CheckRunStates();
      StopZombies();
      ReleaseScopedWorkers();
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

const Scheduler::Run* Scheduler::RunHoldingRank(const std::string& worker) const {
  for (const auto& [name, run] : runs_) {
    if (!run.draining && run.rank_of.count(worker) > 0 && run.exit_code.count(worker) == 0) {
      return &run;
    }
  }
  return nullptr;
}

void Scheduler::Send(const std::string& worker, const v1::CoordinatorMessage& message) {
  if (!sink_->Send(worker, message)) {
    SY_LOG(WARNING) << "scheduler: worker " << worker << " has no open stream for a "
                    << message.msg_case() << " message";
  }
}

// --- scheduling ---------------------------------------------------------------------------

void Scheduler::SchedulePass() {
  std::vector<cluster::WorkerInfo> idle = workers_->Idle();
  // A rank of a live run whose registration is still queued is not free (RunHoldingRank).
  idle.erase(std::remove_if(
                 idle.begin(), idle.end(),
                 [this](const cluster::WorkerInfo& w) { return RunHoldingRank(w.id) != nullptr; }),
             idle.end());
  std::vector<cluster::WorkerInfo> attached = workers_->List();
  attached.erase(std::remove_if(attached.begin(), attached.end(),
                                [](const cluster::WorkerInfo& w) {
                                  return w.state == cluster::WorkerState::kLost;
                                }),
                 attached.end());
  std::vector<Job> candidates;
  for (Job::State state : {Job::RESTARTING, Job::PENDING}) {
    for (Job& job : ListAll(hub_, state)) {
      if (runs_.count(job.name()) == 0) candidates.push_back(std::move(job));
    }
  }
  // Admission order (scheduler.h "Policy"): priority, then age (job ids grow with creation).
  auto id_of = [](const Job& job) { return jobs::ParseJobName(job.name()).value_or(0); };
  std::stable_sort(candidates.begin(), candidates.end(), [&](const Job& a, const Job& b) {
    if (a.spec().priority() != b.spec().priority()) {
      return a.spec().priority() > b.spec().priority();
    }
    return id_of(a) < id_of(b);
  });
  const jobs::CoordinatorContext& context = hub_->context();
  std::map<std::string, int32_t> in_use = WorkersInUse();
  std::map<std::string, v1::QueueStatus> statuses;
  std::map<std::string, int32_t> pending;    // per queue
  std::optional<int32_t> blocking_priority;  // of the first job that waits for workers
  std::set<std::string> waiting;
  std::set<std::string> quota_preempted;  // queues whose first quota-blocked job was considered
  for (const Job& job : candidates) {
    bool done = false;
    if (blocking_priority.has_value() && job.spec().priority() < *blocking_priority) {
      NoteWaiting(job, kWaitingForPriority,
                  absl::StrCat("a job of priority ", *blocking_priority,
                               " waits for workers; lower priorities start after it"));
    } else {
      done = TrySchedule(job, &idle, attached, &in_use);
    }
    if (done) continue;
    waiting.insert(job.name());
    auto wait = current_wait_.find(job.name());
    if (!blocking_priority.has_value() && wait != current_wait_.end() &&
        wait->second.first == kWaitingForWorkers) {
      blocking_priority = job.spec().priority();
      // Only the first job that waits for workers may preempt: it is first in admission order,
      // and the workers freed go to it.
      auto spec = resolved_.find(job.name());
      if (options_.preemption && spec != resolved_.end() && spec->second.ok()) {
        Preempt(job, WorkerRange(*spec->second).first,
                static_cast<int32_t>(EligibleFor(job.name(), idle).size()), std::nullopt);
      }
    }
    // Within a full queue (scheduler.h "Preemption"): the first job of each queue that waits for
    // its quota may preempt lower-priority jobs of that queue.
    if (wait != current_wait_.end() && wait->second.first == kQueueQuotaExceeded &&
        options_.preemption && quota_preempted.insert(QueueOf(job.spec())).second) {
      auto spec = resolved_.find(job.name());
      const std::optional<int32_t> quota = QueueQuota(context, QueueOf(job.spec()));
      if (spec != resolved_.end() && spec->second.ok() && quota.has_value()) {
        Preempt(job, WorkerRange(*spec->second).first,
                static_cast<int32_t>(EligibleFor(job.name(), idle).size()),
                std::max(0, *quota - in_use[QueueOf(job.spec())]));
      }
    }
    const std::string queue = QueueOf(job.spec());
    v1::QueueStatus& status = statuses[job.name()];
    status.set_queue(queue);
    status.set_position(++pending[queue]);
    if (wait != current_wait_.end()) {
      status.set_reason(wait->second.first);
      status.set_message(wait->second.second);
    }
  }
  std::map<std::string, JobHub::QueueUsage> usage;
  usage[kDefaultQueue].queue = kDefaultQueue;
  for (const auto& [queue, quota] : context.queue_quotas) {
    usage[queue].queue = queue;
    usage[queue].quota = quota;
  }
  for (const auto& [queue, n] : in_use) {
    usage[queue].queue = queue;
    usage[queue].workers_in_use = n;
  }
  for (const auto& [queue, n] : pending) {
    usage[queue].queue = queue;
    usage[queue].pending = n;
  }
  if (options_.scale_up && waiting.empty() && !idle.empty()) MaybeScaleUp(idle, in_use);
  std::vector<JobHub::QueueUsage> usage_list;
  for (auto& [queue, u] : usage) usage_list.push_back(std::move(u));
  hub_->SetQueueState(std::move(statuses), std::move(usage_list));
  // Jobs that no longer wait (started, ended) forget their last reason and resolved spec.
  for (auto it = wait_reason_.begin(); it != wait_reason_.end();) {
    it = waiting.count(it->first) > 0 ? std::next(it) : wait_reason_.erase(it);
  }
  for (auto it = current_wait_.begin(); it != current_wait_.end();) {
    it = waiting.count(it->first) > 0 ? std::next(it) : current_wait_.erase(it);
  }
  for (auto it = resolved_.begin(); it != resolved_.end();) {
    it = waiting.count(it->first) > 0 ? std::next(it) : resolved_.erase(it);
  }
}

void Scheduler::Preempt(const Job& job, int32_t needed, int32_t idle_eligible,
                        std::optional<int32_t> quota_free) {
  // One preemption at a time, and none while workers are being freed by a drain: those workers
  // may be all the job needs, and a second pick would take more victims than needed.
  for (const auto& [name, run] : runs_) {
    if (run.preempting || run.draining) return;
  }
  // A scale-up in flight is abandoned: the waiting job comes first.
  for (auto& [name, run] : runs_) run.scaling_to = 0;
  const int32_t priority = job.spec().priority();
  std::vector<const Run*> candidates;
  for (const auto& [name, run] : runs_) {
    // Only a running generation can save on demand; never for equal or lower priority.
    if (!run.running || run.adopting || run.priority >= priority) continue;
    // Blocked by its queue's quota: only runs of that queue free any of it.
    if (quota_free.has_value() && run.queue != QueueOf(job.spec())) continue;
    candidates.push_back(&run);
  }
  // Lowest priority first, then the youngest (highest id): the least important, least invested.
  auto id_of = [](const Run* r) { return jobs::ParseJobName(r->job).value_or(0); };
  std::sort(candidates.begin(), candidates.end(), [&](const Run* a, const Run* b) {
    if (a->priority != b->priority) return a->priority < b->priority;
    return id_of(a) > id_of(b);
  });
  int32_t freed = idle_eligible;
  // Without a quota the workers are the only limit.
  int32_t quota_room = quota_free.value_or(std::numeric_limits<int32_t>::max());
  std::vector<std::string> victims;
  for (const Run* run : candidates) {
    if (freed >= needed && quota_room >= needed) break;
    int32_t usable = 0;
    for (const auto& [id, rank] : run->rank_of) {
      std::optional<cluster::WorkerInfo> w = workers_->Get(id);
      // Only workers the waiting job may run on (unscoped or scoped to it) count.
      if (w && w->state != cluster::WorkerState::kLost &&
          (w->scope.empty() || w->scope == job.name())) {
        ++usable;
      }
    }
    if (usable == 0 && !(quota_free.has_value() && quota_room < needed)) continue;
    freed += usable;
    // Every rank of the run counts against its queue's quota (WorkersInUse), usable or not.
    if (quota_free.has_value()) quota_room += static_cast<int32_t>(run->rank_of.size());
    victims.push_back(run->job);
  }
  // Preempting cannot admit it: preempt nobody.
  if (freed < needed || quota_room < needed) return;
  for (const std::string& name : victims) {
    Run& run = runs_[name];
    run.preempting = true;
    run.preempted_for = job.name();
    run.preempt_deadline = absl::Now() + options_.preempt_save_timeout;
    const std::string message =
        absl::StrCat("preempting for ", job.name(), " (priority ", priority, " > ", run.priority,
                     "): on-demand checkpoint requested");
    SY_LOG(INFO) << "scheduler: " << name << " generation " << run.generation << ": " << message;
    v1::CoordinatorMessage checkpoint;
    checkpoint.mutable_checkpoint();
    for (const auto& [id, rank] : run.rank_of) {
      if (run.exit_code.count(id) == 0) Send(id, checkpoint);
    }
  }
}

void Scheduler::MaybeScaleUp(const std::vector<cluster::WorkerInfo>& idle,
                             const std::map<std::string, int32_t>& in_use) {
  for (const auto& [name, run] : runs_) {
    if (run.preempting || run.draining || run.scaling_to > 0) return;
  }
  std::vector<Run*> candidates;
  for (auto& [name, run] : runs_) {
    if (run.running && !run.adopting && absl::Now() - run.started >= options_.scale_up_delay) {
      candidates.push_back(&run);
    }
  }
  auto id_of = [](const Run* r) { return jobs::ParseJobName(r->job).value_or(0); };
  std::sort(candidates.begin(), candidates.end(), [&](const Run* a, const Run* b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    return id_of(a) < id_of(b);
  });
  for (Run* run : candidates) {
    const int32_t world = static_cast<int32_t>(run->rank_of.size());
    absl::StatusOr<Job> job = hub_->GetJob(run->job);
    if (!job.ok() || job->state() != Job::RUNNING) continue;
    jobs::CoordinatorContext context = hub_->context();
    context.checkpoint_root = options_.checkpoint_root;
    absl::StatusOr<v1::JobSpec> spec = jobs::ResolveJobSpec(job->spec(), context);
    if (!spec.ok()) continue;
    const auto [min_workers, max_workers] = WorkerRange(*spec);
    int32_t room = max_workers - world;
    if (std::optional<int32_t> quota = QueueQuota(hub_->context(), run->queue); quota) {
      auto used = in_use.find(run->queue);
      room = std::min(room, *quota - (used == in_use.end() ? 0 : used->second));
    }
    std::vector<cluster::WorkerInfo> eligible = EligibleFor(run->job, idle);
    const int32_t extra = std::min(room, static_cast<int32_t>(eligible.size()));
    if (extra <= 0) continue;
    std::vector<cluster::WorkerInfo> chosen;
    for (const auto& [id, rank] : run->rank_of) {
      std::optional<cluster::WorkerInfo> w = workers_->Get(id);
      if (w) chosen.push_back(*w);
    }
    chosen.insert(chosen.end(), eligible.begin(), eligible.begin() + extra);
    ClusterDefaults defaults;
    defaults.cpu_worker_memory_bytes = options_.cpu_worker_memory_bytes;
    defaults.intra_node_bandwidth_bytes_per_second = options_.intra_node_bandwidth_bytes_per_second;
    defaults.inter_node_bandwidth_bytes_per_second = options_.inter_node_bandwidth_bytes_per_second;
    defaults.peak_flops = options_.peak_flops;
    absl::StatusOr<v1::Plan> plan =
        planner::PlanJob(PlanRequestFor(*spec, min_workers, chosen, defaults));
    if (!plan.ok()) continue;
    const v1::Mapping& m = plan->best().mapping();
    const int32_t grown = m.data_parallel_size() * m.tensor_model_parallel_size() *
                          m.context_parallel_size() * m.pipeline_model_parallel_size();
    if (grown <= world) continue;  // the planner would not use the idle workers: no restart
    run->scaling_to = grown;
    run->scale_deadline = absl::Now() + options_.preempt_save_timeout;
    SY_LOG(INFO) << "scheduler: " << run->job << " generation " << run->generation
                 << ": scaling up from " << world << " to " << grown
                 << " worker(s): on-demand checkpoint requested";
    v1::CoordinatorMessage checkpoint;
    checkpoint.mutable_checkpoint();
    for (const auto& [id, rank] : run->rank_of) {
      if (run->exit_code.count(id) == 0) Send(id, checkpoint);
    }
    return;  // one at a time
  }
}

int64_t Scheduler::SpecResolutions() const { return spec_resolutions_.load(); }

std::map<std::string, int32_t> Scheduler::WorkersInUse() const {
  std::map<std::string, int32_t> in_use;
  for (const auto& [name, run] : runs_) {
    in_use[run.queue] += static_cast<int32_t>(run.rank_of.size());
  }
  return in_use;
}

void Scheduler::NoteWaiting(const Job& job, const std::string& reason, const std::string& message) {
  current_wait_[job.name()] = {reason, message};
  std::string key = absl::StrCat(reason, ": ", message);
  auto it = wait_reason_.find(job.name());
  if (it != wait_reason_.end() && it->second == key) return;
  absl::StatusOr<Job> noted = hub_->RecordWaitReason(job.name(), reason, message);
  if (!noted.ok()) {
    // Moved on meanwhile (cancelled), or the store failed: tried again on a later pass.
    SY_LOG(WARNING) << "scheduler: " << job.name() << ": recording " << reason << ": "
                    << noted.status();
    return;
  }
  SY_LOG(INFO) << "scheduler: " << job.name() << " waits: " << key;
  wait_reason_[job.name()] = std::move(key);
}

void Scheduler::FailUnstarted(const Job& job, const std::string& reason,
                              const std::string& message) {
  absl::StatusOr<Job> failed = hub_->Transition(job.name(), Job::FAILED, reason, message);
  if (!failed.ok()) {
    // Not failed (a store error, or the job moved on): it stays schedulable and is retried.
    SY_LOG(WARNING) << "scheduler: " << job.name() << " -> FAILED (" << reason
                    << "): " << failed.status();
    return;
  }
  Finish(job.name());
}

bool Scheduler::TrySchedule(const Job& job, std::vector<cluster::WorkerInfo>* idle,
                            const std::vector<cluster::WorkerInfo>& attached_workers,
                            std::map<std::string, int32_t>* in_use) {
  // The same resolution and rules as CreateJob and PlanService (jobs/resolve_spec.h); the paths
  // stay relative until AssignedSpec resolves them under the roots (common/config/job_paths.h).
  // Resolved once while the job waits (scheduler.h "Policy"): the full validation is not free
  // and a pass runs it for every waiting job.
  auto cached = resolved_.find(job.name());
  if (cached == resolved_.end()) {
    jobs::CoordinatorContext context = hub_->context();
    context.checkpoint_root = options_.checkpoint_root;
    cached = resolved_.emplace(job.name(), jobs::ResolveJobSpec(job.spec(), context)).first;
    spec_resolutions_.fetch_add(1);
  }
  const absl::StatusOr<v1::JobSpec>& resolved = cached->second;
  if (!resolved.ok()) {
    // Only a spec stored before these rules (or by another coordinator version) gets here.
    const std::string unsupported = jobs::UnsupportedParallelism(job.spec().parallel());
    FailUnstarted(job, unsupported.empty() ? kInvalidSpec : kUnsupportedParallelism,
                  std::string(resolved.status().message()));
    return true;
  }
  const v1::JobSpec& spec = *resolved;
  const auto [min_workers, max_workers] = WorkerRange(spec);
  // The queue's quota caps the gang: it starts whole within the free quota or not at all.
  const std::string queue = QueueOf(spec);
  int32_t quota_free = std::numeric_limits<int32_t>::max();
  if (std::optional<int32_t> quota = QueueQuota(hub_->context(), queue); quota.has_value()) {
    const int32_t used = (*in_use)[queue];
    quota_free = std::max(0, *quota - used);
    if (quota_free < min_workers) {
      NoteWaiting(job, kQueueQuotaExceeded,
                  absl::StrCat("queue ", queue, ": ", used, " of ", *quota,
                               " worker(s) in use, needs ", min_workers));
      return false;
    }
  }
  // Only workers that may run this job: unscoped ones and those scoped to it, the latter first
  // (they can run nothing else).
  std::vector<cluster::WorkerInfo> eligible = EligibleFor(job.name(), *idle);
  const int attached = static_cast<int>(EligibleFor(job.name(), attached_workers).size());
  const int32_t k = static_cast<int32_t>(std::min<size_t>(
      {eligible.size(), static_cast<size_t>(max_workers), static_cast<size_t>(quota_free)}));
  if (k < min_workers) {
    NoteWaiting(job, kWaitingForWorkers,
                attached < min_workers
                    ? absl::StrCat("needs ", min_workers, " worker(s), ", attached, " attached")
                    : absl::StrCat("needs ", min_workers, " idle worker(s), ", eligible.size(),
                                   " of ", attached, " attached are idle (the others run jobs)"));
    return false;
  }

  // Specs never change, so a plan that failed for k workers fails again: wait for another k.
  auto failed_before = plan_failed_for_.find(job.name());
  if (failed_before != plan_failed_for_.end() && failed_before->second == k) return false;
  const std::vector<cluster::WorkerInfo> chosen(eligible.begin(), eligible.begin() + k);
  ClusterDefaults defaults;
  defaults.cpu_worker_memory_bytes = options_.cpu_worker_memory_bytes;
  defaults.intra_node_bandwidth_bytes_per_second = options_.intra_node_bandwidth_bytes_per_second;
  defaults.inter_node_bandwidth_bytes_per_second = options_.inter_node_bandwidth_bytes_per_second;
  defaults.peak_flops = options_.peak_flops;
  const v1::PlanRequest request = PlanRequestFor(spec, min_workers, chosen, defaults);
  absl::StatusOr<v1::Plan> plan = planner::PlanJob(request);
  if (!plan.ok()) {
    const absl::StatusCode code = plan.status().code();
    if (code != absl::StatusCode::kInvalidArgument &&
        code != absl::StatusCode::kResourceExhausted) {
      // Not a verdict on the spec: never reported as NO_FEASIBLE_PLAN; retried next pass.
      SY_LOG(WARNING) << "scheduler: " << job.name() << ": planning: " << plan.status();
      return false;
    }
    if (k >= max_workers) {
      FailUnstarted(job, kNoFeasiblePlan,
                    absl::StrCat("with ", k, " worker(s): ", plan.status().message()));
      return true;
    }
    plan_failed_for_[job.name()] = k;
    NoteWaiting(
        job, kNoFeasiblePlan,
        absl::StrCat("with ", k, " worker(s), waiting for more: ", plan.status().message()));
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

  // Paths are checked at CreateJob (and by ResolveJobSpec above); a spec that still cannot be
  // resolved under the roots is failed here, never sent.
  const absl::StatusOr<v1::JobSpec> assigned = AssignedSpec(
      spec, mapping, world, job.name(), {options_.checkpoint_root, options_.data_root});
  if (!assigned.ok()) {
    FailUnstarted(job, kInvalidPaths, std::string(assigned.status().message()));
    return true;
  }
  absl::StatusOr<Job> started = hub_->Transition(
      job.name(), Job::STARTING, kScheduled,
      absl::StrCat(world, " worker(s): ", planner::MappingToString(mapping)), &*plan);
  if (!started.ok()) {
    SY_LOG(WARNING) << "scheduler: " << job.name() << " -> STARTING: " << started.status();
    return false;
  }
  const int64_t generation = started->generation();
  rendezvous_->OpenGeneration(job.name(), generation);

  Run run;
  run.job = job.name();
  run.generation = generation;
  run.queue = queue;
  run.priority = job.spec().priority();
  run.started = absl::Now();
  (*in_use)[queue] += world;
  std::vector<std::string> ranks;
  for (int32_t rank = 0; rank < world; ++rank) {
    const cluster::WorkerInfo& w = eligible[rank];
    ranks.push_back(w.id);
    run.rank_of[w.id] = rank;
    if (absl::Status s = workers_->SetBusy(w.id, job.name(), generation, rank); !s.ok()) {
      SY_LOG(WARNING) << "scheduler: " << w.id << ": "
                      << s;  // lost meanwhile: a Lost event follows
    }
  }
  const std::set<std::string> taken(ranks.begin(), ranks.end());
  idle->erase(std::remove_if(idle->begin(), idle->end(),
                             [&](const cluster::WorkerInfo& w) { return taken.count(w.id) > 0; }),
              idle->end());
  for (int32_t rank = 0; rank < world; ++rank) {
    v1::CoordinatorMessage message;
    v1::Assignment& a = *message.mutable_assignment();
    a.set_job(job.name());
    a.set_generation(generation);
    a.set_rank(rank);
    a.set_world_size(world);
    *a.mutable_spec() = *assigned;
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

}  // namespace switchyard::jobs
