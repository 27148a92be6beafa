// File: coordinator/jobs/scheduler.h
//
// The scheduler and elastic policy: drives jobs through the lifecycle of WORKER_PROTOCOL.md
// ("Job lifecycle driven by these messages") by assigning PENDING and RESTARTING jobs to idle
// workers and reacting to step reports, worker exits and lost workers.
//
// Policy:
// - A job is schedulable when it is PENDING or RESTARTING and has no generation in flight here.
//   Admission order: higher JobSpec.priority first, then the older job (lower id). A job that
//   cannot start yet does not block later ones of its priority (backfill), but while a job waits
//   for workers (WAITING_FOR_WORKERS) no job of a lower priority starts in that pass (it waits
//   with WAITING_FOR_PRIORITY): lower-priority gangs cannot keep taking the workers a
//   higher-priority one needs. A queue at its quota does not hold other queues back.
// - Queues: each job counts against its queue (JobSpec.queue, resolve_spec.h QueueOf). A queue
//   with a worker quota (CoordinatorContext.queue_quotas, --queues) runs at most that many
//   workers at once, counted over its generations in flight (draining ones too, until their
//   workers are free). A job whose queue has fewer free workers than its minimum waits with
//   QUEUE_QUOTA_EXCEEDED ("queue a: 2 of 2 worker(s) in use, needs 2"); otherwise it is planned
//   on at most the queue's free workers. After each pass the scheduler publishes, for every
//   waiting job, its queue, its 1-based position in the admission order of that queue and its
//   current wait reason (JobHub::SetQueueState: Job.queue_status in GetJob and ListJobs), and
//   per queue the quota, workers in use and waiting jobs (the switchyard_queue_* metrics).
// - Gang admission: a job starts only with every rank reserved (k >= its minimum idle eligible
//   workers within its quota); ranks are never handed out to a partial gang.
// - Worker range: [min_workers, max_workers] of the stored spec; unset min_workers is
//   parallel.world_size if set, else 1; unset max_workers is parallel.world_size if set, else
//   unbounded. With k idle workers, k >= min, the planner (coordinator/planner/planner.h) plans
//   the spec with world_size cleared, min_workers = min and max_workers = min(k, max), and
//   the spec's TP, ETP and CP (each 1 unless set: jobs/resolve_spec.h PinWorkerParallelism),
//   PP = 1 (the worker runs data, tensor, context, expert and expert-tensor parallelism:
//   common/model/engine_support.h); it picks the largest feasible world W (the global batch must
//   divide by micro_batch_size × W) and EP.
//   The spec planned is the stored one resolved again by jobs::ResolveJobSpec (the same
//   function and rules as CreateJob and PlanService), so a spec accepted at submit is planned
//   with the fields the coordinator fills (an empty training.save is the job's directory, the
//   default corpus's vocab_size). The resolution is done once per waiting job and cached: a
//   stored spec never changes and the resolution reads nothing of the cluster (the plan, which
//   does, is made on every pass); the entry is dropped when the job stops waiting, so a job
//   that waits again (RESTARTING) is resolved afresh. A stored spec that fails the rules
//   (stored by an older coordinator) FAILS with UNSUPPORTED_PARALLELISM (what
//   UnsupportedByEngine refuses) or INVALID_SPEC. A planning failure (the planner's
//   INVALID_ARGUMENT or RESOURCE_EXHAUSTED) when k >= max FAILS the job with NO_FEASIBLE_PLAN (more
//   workers cannot help); with fewer the job waits for more workers (a RESTARTING job too: it is
//   never failed for lack of workers). Any other error (a store that cannot write the FAILED
//   transition) is logged and retried, never reported as NO_FEASIBLE_PLAN.
// - Job-scoped workers (Registration.job, switchyard-worker --job; one Kubernetes pod per worker
//   of one job): a job is placed only on workers that are unscoped or scoped to it, those scoped
//   to it first; the workers counted in its WAITING_FOR_WORKERS reason are those too. Once the
//   job is finished (SUCCEEDED, FAILED, CANCELLED) each connected worker scoped to it gets
//   JobEnded (checked with the zombies, every rescan_interval and on every job change), after
//   which it exits.
// - Wait reasons: a PENDING or RESTARTING job that cannot start gets an event (state unchanged)
//   saying why, when the reason differs from the last one recorded by this process:
//   WAITING_FOR_WORKERS ("needs 3 worker(s), 2 attached", or "... idle" when attached workers
//   run other jobs) or NO_FEASIBLE_PLAN ("with 2 worker(s), waiting for more: <rule>"). A
//   restarted coordinator records the current reason once more.
// - Start: the job goes to STARTING (generation g+1, reason SCHEDULED, the mapping in the
//   message), the rendezvous keys of older generations are dropped, ranks 0..W-1 go to the first
//   W idle workers ordered by host then id, each gets its Assignment, then every rank gets Start.
//   The assigned spec is the stored spec with parallel.world_size = W, the mapping's TP, CP, EP
//   and ETP, PP = 1, sequence_parallel exactly when TP > 1, the mapping's optimizer and
//   micro-batch, global batch = mbs × num_micro_batches × W, and its paths resolved under
//   checkpoint_root and data_root (placement.h AssignedSpec, common/config/job_paths.h: save under
//   <checkpoint_root>/jobs/<job id>, load = save unless it names a job's checkpoint). A stored path
//   that breaks the rules (stored before they existed) FAILS the job with INVALID_PATHS before
//   anything is sent.
// - STARTING -> RUNNING (reason FIRST_STEP) at the first StepReport of the current generation.
//   Rank 0's reports are published to the StepHub (WatchJob, Job.last_step).
// - Every rank WorkerExit(0) -> SUCCEEDED (ALL_RANKS_FINISHED; via RUNNING if no step was
//   reported). WorkerExit 1..127 (or outside 0..255) -> FAILED (WORKER_EXIT_PERMANENT), Stop to
//   the other ranks. WorkerExit 128..255 -> RESTARTING (WORKER_FAILED), a lost worker ->
//   RESTARTING (WORKER_LOST), each with Stop to the other ranks; job_state.h turns a RESTARTING
//   past max_restarts into FAILED (RESTART_LIMIT_EXCEEDED). The job is rescheduled once every
//   stopped rank has acknowledged with its WorkerExit or stop_timeout passed (unacknowledged
//   workers are then marked LOST), so the new generation can reuse them.
// - Cancellation: the api's JobService cancels through the JobHub; the scheduler notices on its
//   next tick (it re-reads its jobs whenever the hub's version changes, and every
//   rescan_interval for writers outside the hub) and sends Stop to every rank. OnJobChanged() is
//   the hook to call after such a mutation to skip the wait for the tick.
// - Reconnect: a rank whose stream breaks is LOST only after heartbeat_timeout. If it attaches
//   again with the same worker_id before that, it keeps its rank when its first heartbeat
//   reports the generation; another generation restarts the job (WORKER_LOST). A worker that
//   re-attaches after its generation ended here gets Stop and is idle.
// - Checkpoints: every rank sends CheckpointSaved after each committed save; rank 0's step is
//   recorded as Job.last_checkpoint_step with an event CHECKPOINT_SAVED ("checkpoint saved at
//   step N", "(on demand)" when it answered CheckpointNow). RequestCheckpoint sends CheckpointNow.
// - Preemption (SchedulerOptions.preemption, --preemption=on|off, default on): when a job waits
//   with WAITING_FOR_WORKERS and running generations of jobs of a strictly lower priority hold
//   enough workers it may use, the scheduler picks victims (lowest priority, then youngest:
//   highest id) until the idle workers plus theirs reach the job's minimum, and only then (never
//   a preemption that cannot admit it), sends them CheckpointNow. A job that waits with
//   QUEUE_QUOTA_EXCEEDED (the first such job of its queue in admission order) preempts the same
//   way within its queue: victims are lower-priority runs of that queue, picked until the quota
//   they free and the workers (idle plus theirs) both reach its minimum (Kueue's
//   withinClusterQueue: LowerPriority) (logged; the job store records events of RUNNING jobs
//   only for checkpoints and transitions). At the victim's
//   CheckpointSaved(requested) at step N it goes RUNNING -> PENDING (PREEMPTED, "preempted at
//   step N for jobs/X (priority P); resumes from the checkpoint of step N") and its ranks get
//   Stop; it waits in the queue and resumes from that checkpoint (load = save), so no step
//   beyond the save is lost. A victim that does not save within preempt_save_timeout is stopped
//   the same way ("... did not save within 60s; resumes from its last checkpoint (step M)").
//   A preemption does not count against max_restarts. No new victims are picked while another
//   preemption or any drain is in flight (the workers being freed may be enough).
// - Scale-up (SchedulerOptions.scale_up, --scale-up=on|off, default on): when no job waits for
//   admission and idle workers remain after a pass, the first running generation in admission
//   order that has run at least scale_up_delay, runs below its max_workers, has idle eligible
//   workers within its queue's quota, and for which the planner gives a strictly larger world
//   with them, gets CheckpointNow (one scale-up at a time, none during a preemption or drain).
//   At its CheckpointSaved(requested) at step N it goes RUNNING -> PENDING (SCALING_UP,
//   "scaling up from W1 to W2 worker(s) at step N") and is stopped; the next pass plans it again
//   on its freed workers plus the idle ones (the SCHEDULED event names the new world) and it
//   resumes from that checkpoint, resharding. A scale-up whose save does not come within
//   preempt_save_timeout is abandoned (the generation keeps running). Hysteresis: the delay
//   (default 5 min) since the generation started, and the strictly-larger-plan rule, so a job
//   is never restarted for a world the planner would not use.
// - Zombies: an idle worker whose heartbeats report a generation (it still runs one this
//   coordinator ended or does not know) gets one Stop per generation, checked every
//   rescan_interval. A worker that a live run counts as its rank is never a zombie: the registry
//   lists a re-attached worker IDLE until the scheduler thread handles its registration, and its
//   heartbeat can arrive first.
// - Coordinator restart: jobs that were STARTING or RUNNING when this process started are
//   re-adopted when every worker the store listed as assigned to the job re-attaches (same
//   worker_id) and heartbeats the job's generation within adopt_grace; otherwise they restart
//   (COORDINATOR_RESTARTED) on the workers available. A re-adopted job's ranks are learned from
//   its step reports.
//
// Threading: the On* methods queue an event and return at once (they are called from gRPC
// callbacks); one scheduler thread handles events in order and runs the schedule pass, so the
// policy state needs no lock. The hub, registry and store calls happen on that thread.
#ifndef SWITCHYARD_COORDINATOR_WORKERS_SCHEDULER_H_
#define SWITCHYARD_COORDINATOR_WORKERS_SCHEDULER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/cluster/rendezvous_store.h"
#include "coordinator/cluster/worker_registry.h"
#include "coordinator/jobs/job_hub.h"
#include "coordinator/jobs/step_hub.h"
#include "switchyard/v1/job.pb.h"
#include "switchyard/v1/worker.pb.h"

namespace switchyard::jobs {

// Delivers CoordinatorMessages to attached workers (the WorkerService's streams).
class WorkerSink {
 public:
  virtual ~WorkerSink() = default;
  // Queues `message` on the worker's stream; false when the worker has no open stream.
  virtual bool Send(const std::string& worker_id, const v1::CoordinatorMessage& message) = 0;
};

struct SchedulerOptions {
  std::string checkpoint_root;      // required: job checkpoints go to <root>/jobs/<job id>
  std::string data_root = "/data";  // data.data_path and tokenizer_model are resolved under it
  std::string rendezvous_address;   // required: sent in every Assignment
  absl::Duration tick = absl::Milliseconds(50);
  absl::Duration rescan_interval = absl::Seconds(1);
  absl::Duration stop_timeout = absl::Seconds(10);
  absl::Duration adopt_grace = absl::Seconds(15);
  // The cluster the planner sees. GPU memory comes from the workers' GpuInfo when all report it.
  double cpu_worker_memory_bytes = 64.0 * (1ull << 30);
  double intra_node_bandwidth_bytes_per_second = 450e9;
  double inter_node_bandwidth_bytes_per_second = 50e9;
  double peak_flops = 989e12;
  // Preemption at checkpoints (scheduler.h "Preemption"; --preemption=on|off). On by default:
  // priorities mean little if a low-priority job can hold the workers for days, and a preempted
  // job loses no steps beyond its on-demand save.
  bool preemption = true;
  // How long a victim may take to answer CheckpointNow with a CheckpointSaved before it is
  // stopped anyway (it then resumes from its last checkpoint).
  absl::Duration preempt_save_timeout = absl::Seconds(60);
  // Scale-up at a checkpoint boundary (scheduler.h "Scale-up"; --scale-up=on|off,
  // --scale-up-delay). A generation grows only after it has run scale_up_delay: each growth
  // costs a save and a restart, so this bounds how often a job can be re-planned (hysteresis).
  bool scale_up = true;
  absl::Duration scale_up_delay = absl::Minutes(5);
};

// One generation in flight, for tests and the metrics.
struct RunSnapshot {
  std::string job;
  int64_t generation = 0;
  std::vector<std::string> ranks;  // worker id per rank ("" when not known: adopted)
  bool running = false;
  bool draining = false;  // ended; waiting for Stop acknowledgements
};

class Scheduler {
 public:
  // INVALID_ARGUMENT naming the option (empty checkpoint_root or rendezvous_address, a
  // non-positive tick). The pointers must outlive the scheduler; `sink` may be set later with
  // SetSink but before Start.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(jobs::JobHub* hub,
                                                           cluster::WorkerRegistry* workers,
                                                           cluster::RendezvousStore* rendezvous,
                                                           StepHub* steps,
                                                           SchedulerOptions options);
  ~Scheduler();  // Stop()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  void SetSink(WorkerSink* sink);
  // Reads the jobs a previous coordinator left STARTING or RUNNING, then starts the thread.
  absl::Status Start();
  // Stops the thread (idempotent). Workers keep running; a new coordinator can re-adopt them.
  void Stop();

  // Events, from any thread.
  void OnRegistered(const cluster::Registered& registered);
  void OnStep(const std::string& worker_id, const v1::StepReport& report);
  void OnExit(const std::string& worker_id, const v1::WorkerExit& exit);
  void OnLost(const cluster::WorkerInfo& worker, const std::string& why);
  void OnJobChanged();
  // A CheckpointSaved from a rank: rank 0's is recorded (Job.last_checkpoint_step, event
  // CHECKPOINT_SAVED); a requested one ends a generation being preempted.
  void OnCheckpointSaved(const std::string& worker_id, const v1::CheckpointSaved& saved);

  // Sends CheckpointNow to every rank of the job's running generation (a collective: all ranks
  // get it). FAILED_PRECONDITION naming the job when no generation of it is running here.
  absl::Status RequestCheckpoint(const std::string& job);

  std::vector<RunSnapshot> Runs() const;

  // How many times this scheduler has run ResolveJobSpec on a stored spec (one per job that
  // starts waiting, not one per pass), for tests.
  int64_t SpecResolutions() const;

 private:
  struct Run {
    std::string job;
    int64_t generation = 0;
    std::map<std::string, int32_t> rank_of;  // worker id -> rank (-1: unknown, adopted)
    std::map<std::string, int32_t> exit_code;
    bool running = false;
    bool draining = false;
    std::set<std::string> awaiting_stop;
    absl::Time drain_deadline = absl::InfiniteFuture();
    std::set<std::string> reattached;  // reconnected ranks whose generation is not heard yet
    bool adopting = false;
    absl::Time adopt_deadline = absl::InfiniteFuture();
    absl::Time last_step_saved = absl::InfinitePast();  // rank 0's step, to the store
    std::string queue;     // the job's queue, whose quota its workers count against
    int32_t priority = 0;  // JobSpec.priority: preemption victims are the lowest
    // Preemption in progress: CheckpointNow was sent; the generation ends (job PENDING,
    // PREEMPTED) at the requested CheckpointSaved or at preempt_deadline, whichever is first.
    bool preempting = false;
    std::string preempted_for;  // the waiting job's name, for the event
    absl::Time preempt_deadline = absl::InfiniteFuture();
    int64_t last_checkpoint = -1;  // rank 0's last CheckpointSaved step in this generation
    absl::Time started = absl::InfiniteFuture();  // when this process started the generation
    // Scale-up in progress: CheckpointNow was sent; at the requested CheckpointSaved the job
    // goes PENDING (SCALING_UP) and is planned again on more workers. 0: none.
    int32_t scaling_to = 0;
    absl::Time scale_deadline = absl::InfiniteFuture();
  };
  struct RegisteredEvent {
    cluster::Registered registered;
  };
  struct StepEvent {
    std::string worker;
    v1::StepReport report;
  };
  struct ExitEvent {
    std::string worker;
    v1::WorkerExit exit;
  };
  struct LostEvent {
    cluster::WorkerInfo worker;
    std::string why;
  };
  struct CheckpointEvent {
    std::string worker;
    v1::CheckpointSaved saved;
  };
  using Event = std::variant<RegisteredEvent, StepEvent, ExitEvent, LostEvent, CheckpointEvent>;

  Scheduler(jobs::JobHub* hub, cluster::WorkerRegistry* workers,
            cluster::RendezvousStore* rendezvous, StepHub* steps, SchedulerOptions options);
  void Push(Event event);
  void Loop();
  void Handle(const RegisteredEvent& e);
  void Handle(const StepEvent& e);
  void Handle(const ExitEvent& e);
  void Handle(const LostEvent& e);
  void Handle(const CheckpointEvent& e);

  // The schedule pass and the periodic checks.
  void SchedulePass();
  // True when the job was started or failed (it no longer waits). `attached`: idle + busy.
  // `in_use`: workers per queue of the generations in flight, raised by a start.
  bool TrySchedule(const v1::Job& job, std::vector<cluster::WorkerInfo>* idle,
                   const std::vector<cluster::WorkerInfo>& attached,
                   std::map<std::string, int32_t>* in_use);
  // Workers per queue of the runs in flight (draining ones included).
  std::map<std::string, int32_t> WorkersInUse() const;
  // Sends JobEnded (once per registration) to every connected job-scoped worker whose job is
  // finished.
  void ReleaseScopedWorkers();
  // Records why `job` waits (an event, state unchanged) unless it is the reason last recorded.
  void NoteWaiting(const v1::Job& job, const std::string& reason, const std::string& message);
  // FAILED with `reason` and Finish; a failed transition (store error) is logged, not finished,
  // so the job is retried rather than lost.
  void FailUnstarted(const v1::Job& job, const std::string& reason, const std::string& message);
  void CheckRunStates();
  // Preemption (scheduler.h "Preemption"): picks victims for `job`, which waits for workers
  // held by lower-priority runs, and sends them CheckpointNow. `idle_eligible`: idle workers it
  // may use; `needed`: its minimum; `quota_free`: set when the job waits for its queue's quota
  // (QUEUE_QUOTA_EXCEEDED), the quota left: victims are then runs of its queue only, until both
  // the quota and the workers freed admit it.
  void Preempt(const v1::Job& job, int32_t needed, int32_t idle_eligible,
               std::optional<int32_t> quota_free);
  // Ends a preempting run: PENDING (PREEMPTED) and Stop to its ranks. `step` >= 0: the step of
  // its on-demand checkpoint; -1: it did not save in time.
  void EndPreempted(Run& run, int64_t step);
  // Victims whose save timed out; scale-ups whose save timed out are abandoned.
  void CheckPreemptions();
  // Scale-up (scheduler.h "Scale-up"): when no job waits, asks at most one running generation
  // that the idle workers can grow for an on-demand checkpoint.
  void MaybeScaleUp(const std::vector<cluster::WorkerInfo>& idle,
                    const std::map<std::string, int32_t>& in_use);
  // Ends a generation being scaled up at its checkpoint of `step`: PENDING (SCALING_UP), Stop.
  void EndForScaleUp(Run& run, int64_t step);
  void CheckDrains();
  void CheckAdoptions();
  // Sends Stop (once per worker and generation) to idle workers whose heartbeats report a
  // generation: they run something this coordinator ended or never started (a generation
  // restarted while they were away, or one a previous coordinator process left behind).
  void StopZombies();

  // Ends `run`'s generation with a RESTARTING request (which may come back FAILED).
  void Restart(Run& run, const std::string& reason, const std::string& message);
  void Fail(Run& run, const std::string& reason, const std::string& message);
  // Stops every rank that has not exited and is not `except`, marks the run draining.
  void Drain(Run& run, const std::string& why);
  void Finish(const std::string& job);  // terminal: close steps and rendezvous
  void Send(const std::string& worker, const v1::CoordinatorMessage& message);
  Run* FindRun(const std::string& job, int64_t generation);
  // The run (not draining) that counts `worker` among its ranks and has had no WorkerExit from
  // it, or nullptr. Such a worker can be IDLE in the registry only between its registration with
  // this process and the handling of its RegisteredEvent (a worker of a re-adopted job): it must
  // be neither stopped as a zombie nor scheduled for another job in that window.
  const Run* RunHoldingRank(const std::string& worker) const;

  jobs::JobHub* const hub_;
  cluster::WorkerRegistry* const workers_;
  cluster::RendezvousStore* const rendezvous_;
  StepHub* const steps_;
  const SchedulerOptions options_;
  WorkerSink* sink_ = nullptr;

  mutable absl::Mutex mu_;
  std::deque<Event> events_ ABSL_GUARDED_BY(mu_);
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Held by the scheduler thread while it handles an event or runs a pass; Runs() reads.
  mutable absl::Mutex runs_mu_;
  std::map<std::string, Run> runs_ ABSL_GUARDED_BY(runs_mu_);
  std::thread thread_;

  // Scheduler-thread state.
  uint64_t seen_hub_version_ = ~uint64_t{0};
  absl::Time last_rescan_ = absl::InfinitePast();
  bool workers_changed_ = true;
  std::map<std::string, int32_t> plan_failed_for_;  // job -> worker count its plan failed for
  std::map<std::string, std::string> wait_reason_;  // job -> "REASON: message" last recorded
  // job -> {reason, message} of its current wait (what Job.queue_status shows), kept while the
  // job waits, even when the event was not (re)recorded.
  std::map<std::string, std::pair<std::string, std::string>> current_wait_;
  // job -> its stored spec resolved (ResolveJobSpec) while it waits; dropped with wait_reason_.
  std::map<std::string, absl::StatusOr<v1::JobSpec>> resolved_;
  std::atomic<int64_t> spec_resolutions_{0};
  std::set<std::pair<std::string, int64_t>> zombies_stopped_;
  std::set<std::string> released_;  // scoped workers sent JobEnded since they registered
};

}  // namespace switchyard::jobs

#endif  // SWITCHYARD_COORDINATOR_WORKERS_SCHEDULER_H_
